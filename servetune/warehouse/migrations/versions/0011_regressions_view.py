"""views: regressions (each figure an answer lost against the last accepted one, beyond its noise)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04 17:30:00

"""
from typing import Sequence, Union

from alembic import op

from servetune.warehouse.views import create_views

revision: str = '0011'
down_revision: Union[str, Sequence[str], None] = '0010'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    create_views(op.get_bind())  # CREATE OR REPLACE: the others stay as they are, regressions is new


def downgrade() -> None:
    op.execute('DROP VIEW IF EXISTS "regressions"')
