"""acceptances: which answers are the baseline a later run is compared with, who accepted each and why

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06 10:30:00

"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0016'
down_revision: str | Sequence[str] | None = '0015'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """A table of its own, not columns of ``experiments``: reloading a campaign's folder rewrites its
    experiment row from the files, and must never undo a person's decision. Answers loaded before this
    revision are accepted as they were used (the newest ``done`` one per model was the baseline)."""
    op.create_table(
        'acceptances',
        sa.Column('experiment_id', sa.Text(), sa.ForeignKey('experiments.experiment_id', ondelete='CASCADE'),
                  primary_key=True),
        sa.Column('accepted_at', sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column('accepted_by', sa.Text(), nullable=False),
        sa.Column('reason', sa.Text(), nullable=False),
        sa.Column('automatic', sa.Boolean(), nullable=False),
    )
    op.execute("INSERT INTO acceptances (experiment_id, accepted_by, reason, automatic)"
               " SELECT experiment_id, 'servetune (migration 0016)', 'the baseline before acceptances were kept',"
               " true FROM experiments WHERE status = 'done' AND recommendation IS NOT NULL")


def downgrade() -> None:
    op.drop_table('acceptances')
