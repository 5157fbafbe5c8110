"""trials: validity figures (steady window, completions, in-flight level, open-loop schedule)

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 10:00:00

"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from servetune.warehouse.views import create_views, drop_views

revision: str = '0004'
down_revision: str | Sequence[str] | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = (
    ('valid', sa.Boolean()),
    ('summary_invalid_reasons', postgresql.JSONB(astext_type=sa.Text())),
    ('summary_validity_rules', postgresql.JSONB(astext_type=sa.Text())),
    ('scenario', sa.Text()),
    ('offered_concurrency', sa.Integer()),
    ('offered_rate', sa.Double()),
    ('completions_in_window', sa.Integer()),
    ('completions_needed', sa.Integer()),
    ('in_flight_target', sa.Double()),
    ('in_flight_mean', sa.Double()),
    ('in_flight_min', sa.Double()),
    ('in_flight_min_fraction', sa.Double()),
    ('dispatch_fraction', sa.Double()),
    ('scheduled_rate', sa.Double()),
    ('completion_fraction', sa.Double()),
    ('sustained', sa.Boolean()),
    ('tokens_per_request', sa.Double()),
    ('throughput_mismatch', sa.Double()),
    ('output_tokens_per_s_arrived', sa.Double()),
    ('server_samples_in_window', sa.Integer()),
)


def upgrade() -> None:
    """The views select ``t.*`` (expanded at creation): drop them around the change, create them again."""
    drop_views(op.get_bind())
    for name, typ in COLUMNS:
        op.add_column('trials', sa.Column(name, typ, nullable=True))
    create_views(op.get_bind())


def downgrade() -> None:
    drop_views(op.get_bind())
    for name, _ in reversed(COLUMNS):
        op.drop_column('trials', name)
    create_views(op.get_bind())
