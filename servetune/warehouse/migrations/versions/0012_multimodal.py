"""trials: summary_multimodal (image tokens, the image/text hit-rate split, payloads, the TTFT breakdown);
request_records: text_before_images, payload_bytes

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05 01:00:00

"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from servetune.warehouse.views import create_views, drop_views

revision: str = '0012'
down_revision: str | Sequence[str] | None = '0011'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """The views select ``t.*`` (expanded at creation): drop them around the change, create them again."""
    drop_views(op.get_bind())
    op.add_column('trials', sa.Column('summary_multimodal', postgresql.JSONB(astext_type=sa.Text()), nullable=True))
    op.add_column('request_records', sa.Column('text_before_images', sa.Integer(), nullable=True))
    op.add_column('request_records', sa.Column('payload_bytes', sa.Integer(), nullable=True))
    create_views(op.get_bind())


def downgrade() -> None:
    drop_views(op.get_bind())
    op.drop_column('request_records', 'payload_bytes')
    op.drop_column('request_records', 'text_before_images')
    op.drop_column('trials', 'summary_multimodal')
    create_views(op.get_bind())
