"""FAQ drafts: help-centre entries drafted from agents' answers, pending an agent's approval.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-07
"""
import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('faq_drafts',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('tenant_id', sa.String(length=64), nullable=False),
    sa.Column('conversation_id', sa.String(length=64), nullable=True),
    sa.Column('question', sa.Text(), nullable=False),
    sa.Column('answer', sa.Text(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('merged', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('decided_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('decided_by', sa.Integer(), nullable=True),
    sa.ForeignKeyConstraint(['conversation_id'], ['conversations.id'], ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['decided_by'], ['agents.id'], ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('faq_drafts', schema=None) as batch_op:
        batch_op.create_index('ix_faq_drafts_tenant_status', ['tenant_id', 'status'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('faq_drafts', schema=None) as batch_op:
        batch_op.drop_index('ix_faq_drafts_tenant_status')
    op.drop_table('faq_drafts')
