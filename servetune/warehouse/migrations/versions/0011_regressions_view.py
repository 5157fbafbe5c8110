"""views: regressions (each figure an answer lost against the last accepted one, beyond its noise)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04 17:30:00

"""
from collections.abc import Sequence

from alembic import op

from servetune.warehouse.views import create_views

revision: str = '0011'
down_revision: str | Sequence[str] | None = '0010'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    create_views(op.get_bind())  # CREATE OR REPLACE: the others stay as they are, regressions is new


def downgrade() -> None:
    op.execute('DROP VIEW IF EXISTS "regressions"')
