"""views: accepted trials, best config per week, ceiling history, cache-hit regressions, latency curves

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 14:40:00

"""
from collections.abc import Sequence

from alembic import op

from servetune.warehouse.views import drop_views, recreate_views

# revision identifiers, used by Alembic.
revision: str = '0002'
down_revision: str | Sequence[str] | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create the views from sql/views/*.sql (a later migration that changes trials recreates them)."""
    recreate_views(op.get_bind())


def downgrade() -> None:
    drop_views(op.get_bind())
