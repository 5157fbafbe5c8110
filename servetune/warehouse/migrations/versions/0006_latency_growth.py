"""trials: latency_growth (open loop: median E2E per output token, last quarter of the window's arrivals / its second)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 16:00:00

"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from servetune.warehouse.views import create_views, drop_views

revision: str = '0006'
down_revision: str | Sequence[str] | None = '0005'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """The views select ``t.*`` (expanded at creation): drop them around the change, create them again."""
    drop_views(op.get_bind())
    op.add_column('trials', sa.Column('latency_growth', sa.Double(), nullable=True))
    create_views(op.get_bind())


def downgrade() -> None:
    drop_views(op.get_bind())
    op.drop_column('trials', 'latency_growth')
    create_views(op.get_bind())
