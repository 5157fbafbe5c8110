"""trials: the scheduler-log summary (sched_*); scheduler_batches: SGLang's own batch log lines

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 12:00:00

"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from servetune.warehouse.views import create_views, drop_views

revision: str = '0005'
down_revision: str | Sequence[str] | None = '0004'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = (
    ('sched_prefill_batches', sa.Integer()),
    ('sched_decode_lines', sa.Integer()),
    ('sched_decode_running_mean', sa.Double()),
    ('sched_gen_throughput_mean', sa.Double()),
    ('sched_queue_max', sa.Integer()),
    ('sched_token_usage_max', sa.Double()),
    ('sched_cache_hit_rate', sa.Double()),
    ('sched_cuda_graph_fraction', sa.Double()),
)


# accepted_trials selects ``t.*``, expanded when the view is created: the views are dropped around the
# column change and created again, so they show the new columns (and a downgrade can drop them).


def upgrade() -> None:
    drop_views(op.get_bind())
    for name, typ in COLUMNS:
        op.add_column('trials', sa.Column(name, typ, nullable=True))
    op.create_table(
        'scheduler_batches',
        sa.Column('trial_id', sa.Text(), nullable=False),
        sa.Column('seq', sa.Integer(), nullable=False),
        sa.Column('t_s', sa.Double(), nullable=False),
        sa.Column('kind', sa.Text(), nullable=False),
        sa.Column('new_seq', sa.Integer(), nullable=True),
        sa.Column('new_token', sa.Integer(), nullable=True),
        sa.Column('cached_token', sa.Integer(), nullable=True),
        sa.Column('pending_token', sa.Integer(), nullable=True),
        sa.Column('num_token', sa.Integer(), nullable=True),
        sa.Column('running_req', sa.Integer(), nullable=True),
        sa.Column('queue_req', sa.Integer(), nullable=True),
        sa.Column('token_usage', sa.Double(), nullable=True),
        sa.Column('throughput', sa.Double(), nullable=True),
        sa.Column('cuda_graph', sa.Boolean(), nullable=True),
        sa.ForeignKeyConstraint(['trial_id'], ['trials.trial_id'],
                                name=op.f('fk_scheduler_batches_trial_id_trials'), ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('trial_id', 'seq', name=op.f('pk_scheduler_batches')),
    )
    op.create_index(op.f('ix_scheduler_batches_trial_id_kind'), 'scheduler_batches', ['trial_id', 'kind'])
    create_views(op.get_bind())


def downgrade() -> None:
    drop_views(op.get_bind())
    op.drop_index(op.f('ix_scheduler_batches_trial_id_kind'), table_name='scheduler_batches')
    op.drop_table('scheduler_batches')
    for name, _ in reversed(COLUMNS):
        op.drop_column('trials', name)
    create_views(op.get_bind())
