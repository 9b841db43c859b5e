"""A/B experiments: the experiments, each conversation's arm, and a bot reply's first-text latency.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-07
"""
import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('experiments',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('tenant_id', sa.String(length=64), nullable=False),
    sa.Column('name', sa.String(length=80), nullable=False),
    sa.Column('factor', sa.String(length=32), nullable=False),
    sa.Column('arms', sa.JSON(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('stopped_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('experiments', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_experiments_tenant_id'), ['tenant_id'], unique=False)
    with op.batch_alter_table('conversations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('experiment_id', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('arm', sa.String(length=32), nullable=True))
        batch_op.create_index('ix_conversations_experiment_arm', ['experiment_id', 'arm'], unique=False)
    with op.batch_alter_table('messages', schema=None) as batch_op:
        batch_op.add_column(sa.Column('first_token_ms', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('messages', schema=None) as batch_op:
        batch_op.drop_column('first_token_ms')
    with op.batch_alter_table('conversations', schema=None) as batch_op:
        batch_op.drop_index('ix_conversations_experiment_arm')
        batch_op.drop_column('arm')
        batch_op.drop_column('experiment_id')
    with op.batch_alter_table('experiments', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_experiments_tenant_id'))
    op.drop_table('experiments')
