"""trials: energy over the window (method, joules, J per request and per output token, power, the curve
against the counter, per GPU) and cost (the plan's price, $ per million tokens, per 1,000 good requests);
gpu_samples: energy_mj (NVML's total-energy counter); the energy_vs_level view

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05 17:00:00

"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from servetune.warehouse.views import create_views, drop_views

revision: str = '0013'
down_revision: str | Sequence[str] | None = '0012'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_DOUBLES = ('energy_j', 'energy_per_request_j', 'energy_per_output_token_j', 'energy_curve_over_counter',
            'gpu_power_window_mean_w', 'gpu_power_peak_w', 'cost_gpu_hour_usd', 'cost_per_mtok_usd',
            'cost_per_1k_good_usd')


def upgrade() -> None:
    """The views select ``t.*`` (expanded at creation): drop them around the change, create them again."""
    drop_views(op.get_bind())
    op.add_column('trials', sa.Column('energy_method', sa.Text(), nullable=True))
    for name in _DOUBLES:
        op.add_column('trials', sa.Column(name, sa.Double(), nullable=True))
    op.add_column('trials', sa.Column('summary_energy', postgresql.JSONB(astext_type=sa.Text()), nullable=True))
    op.add_column('trials', sa.Column('cost_gpus', sa.Integer(), nullable=True))
    op.add_column('gpu_samples', sa.Column('energy_mj', sa.BigInteger(), nullable=True))
    create_views(op.get_bind())


def downgrade() -> None:
    drop_views(op.get_bind())
    op.drop_column('gpu_samples', 'energy_mj')
    for name in ('cost_gpus', 'summary_energy', *reversed(_DOUBLES), 'energy_method'):
        op.drop_column('trials', name)
    create_views(op.get_bind())
