"""trials: summary_p99_interval_ms (each latency p99's 95% interval: servetune.stats.quantile_interval)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04 14:00:00

"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from servetune.warehouse.views import create_views, drop_views

revision: str = '0009'
down_revision: str | Sequence[str] | None = '0008'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """The views select ``t.*`` (expanded at creation): drop them around the change, create them again."""
    drop_views(op.get_bind())
    op.add_column('trials',
                  sa.Column('summary_p99_interval_ms', postgresql.JSONB(astext_type=sa.Text()), nullable=True))
    create_views(op.get_bind())


def downgrade() -> None:
    drop_views(op.get_bind())
    op.drop_column('trials', 'summary_p99_interval_ms')
    create_views(op.get_bind())
