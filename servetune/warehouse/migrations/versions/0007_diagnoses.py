"""diagnoses: servetune.diagnose findings per trial (kind, severity, summary, evidence, advice); trials.summary_by_turn

``summary_by_turn`` (TrialSummary.by_turn, per-turn figures of multi-turn sessions) came without a
migration of its own; it is added here so that loads work again (tables.py derives the column).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02 10:00:00

"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from servetune.warehouse.views import create_views, drop_views

revision: str = '0007'
down_revision: str | Sequence[str] | None = '0006'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """The views select ``t.*`` (expanded at creation): dropped around the new trials column, created again."""
    drop_views(op.get_bind())
    op.add_column('trials', sa.Column('summary_by_turn', postgresql.JSONB(astext_type=sa.Text()), nullable=True))
    create_views(op.get_bind())
    op.create_table(
        'diagnoses',
        sa.Column('trial_id', sa.Text(), nullable=False),
        sa.Column('seq', sa.Integer(), nullable=False),
        sa.Column('kind', sa.Text(), nullable=False),
        sa.Column('severity', sa.Text(), nullable=False),
        sa.Column('summary', sa.Text(), nullable=False),
        sa.Column('evidence', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column('advice', sa.Text(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.CheckConstraint("severity IN ('info', 'warning', 'critical')", name=op.f('ck_diagnoses_severity')),
        sa.ForeignKeyConstraint(['trial_id'], ['trials.trial_id'],
                                name=op.f('fk_diagnoses_trial_id_trials'), ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('trial_id', 'seq', name=op.f('pk_diagnoses')),
    )
    op.create_index(op.f('ix_diagnoses_kind_severity'), 'diagnoses', ['kind', 'severity'])


def downgrade() -> None:
    op.drop_index(op.f('ix_diagnoses_kind_severity'), table_name='diagnoses')
    op.drop_table('diagnoses')
    drop_views(op.get_bind())
    op.drop_column('trials', 'summary_by_turn')
    create_views(op.get_bind())
