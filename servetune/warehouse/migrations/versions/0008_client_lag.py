"""trials: client_lag_p99_ms (the client's event loop, p99 lateness over the steady window: servetune.loadgen.lag)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 20:00:00

"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from servetune.warehouse.views import create_views, drop_views

revision: str = '0008'
down_revision: str | Sequence[str] | None = '0007'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """The views select ``t.*`` (expanded at creation): drop them around the change, create them again."""
    drop_views(op.get_bind())
    op.add_column('trials', sa.Column('client_lag_p99_ms', sa.Double(), nullable=True))
    create_views(op.get_bind())


def downgrade() -> None:
    drop_views(op.get_bind())
    op.drop_column('trials', 'client_lag_p99_ms')
    create_views(op.get_bind())
