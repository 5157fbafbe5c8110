"""asset_fingerprints: the watcher's memory of model and prompt-template fingerprints

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 15:05:00

"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0003'
down_revision: str | Sequence[str] | None = '0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        'asset_fingerprints',
        sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column('asset_uri', sa.Text(), nullable=False),
        sa.Column('kind', sa.Text(), nullable=False),
        sa.Column('source', sa.Text(), nullable=False),
        sa.Column('digest', sa.Text(), nullable=False),
        sa.Column('parts', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column('seen_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_asset_fingerprints')),
    )
    op.create_index(op.f('ix_asset_fingerprints_asset_uri_seen_at'), 'asset_fingerprints', ['asset_uri', 'seen_at'])


def downgrade() -> None:
    op.drop_index(op.f('ix_asset_fingerprints_asset_uri_seen_at'), table_name='asset_fingerprints')
    op.drop_table('asset_fingerprints')
