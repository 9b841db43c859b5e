"""Support-chat actions: each call recorded (idempotency key, arguments, status, latency), and the
action a bot reply carries.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-07
"""
import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('action_calls',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('tenant_id', sa.String(length=64), nullable=False),
    sa.Column('conversation_id', sa.String(length=64), nullable=True),
    sa.Column('action', sa.String(length=64), nullable=False),
    sa.Column('arguments', sa.JSON(), nullable=False),
    sa.Column('status', sa.String(length=24), nullable=False),
    sa.Column('http_status', sa.Integer(), nullable=True),
    sa.Column('latency_ms', sa.Float(), nullable=True),
    sa.Column('reply', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['conversation_id'], ['conversations.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('action_calls', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_action_calls_conversation_id'), ['conversation_id'], unique=False)
        batch_op.create_index('ix_action_calls_tenant_created', ['tenant_id', 'created_at'], unique=False)
    with op.batch_alter_table('messages', schema=None) as batch_op:
        batch_op.add_column(sa.Column('action', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('messages', schema=None) as batch_op:
        batch_op.drop_column('action')
    with op.batch_alter_table('action_calls', schema=None) as batch_op:
        batch_op.drop_index('ix_action_calls_tenant_created')
        batch_op.drop_index(batch_op.f('ix_action_calls_conversation_id'))
    op.drop_table('action_calls')
