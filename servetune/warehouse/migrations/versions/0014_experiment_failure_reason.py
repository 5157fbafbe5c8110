"""experiments: failure_reason (why a failed or interrupted campaign stopped: experiment.json's
status_reason, one line, redacted; a lone failed trial's own reason)

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-08 10:00:00

"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0014'
down_revision: str | Sequence[str] | None = '0013'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """No view selects ``experiments.*`` (they name its columns), so the views stay as they are."""
    op.add_column('experiments', sa.Column('failure_reason', sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column('experiments', 'failure_reason')
