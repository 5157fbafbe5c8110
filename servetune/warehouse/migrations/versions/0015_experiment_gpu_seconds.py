"""experiments: gpu_seconds, server_starts, startup_gpu_seconds (what a campaign's answer cost: the GPU
time experiment.json states, start-ups included; the server starts and the start-ups' seconds from state.json)

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-10 10:00:00

"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0015'
down_revision: str | Sequence[str] | None = '0014'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = (('gpu_seconds', sa.Double()), ('server_starts', sa.Integer()), ('startup_gpu_seconds', sa.Double()))


def upgrade() -> None:
    """Nullable: campaigns loaded before stay NULL until their folder is loaded again (an idempotent reload
    writes what changed). No view selects ``experiments.*``, so the views stay as they are."""
    for name, typ in COLUMNS:
        op.add_column('experiments', sa.Column(name, typ, nullable=True))


def downgrade() -> None:
    for name, _ in reversed(COLUMNS):
        op.drop_column('experiments', name)
