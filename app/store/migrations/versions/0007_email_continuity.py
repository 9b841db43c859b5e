"""The email fallback's state: what the customer has seen in the widget, what has been mailed.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-07
"""
import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('conversations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('customer_seen', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('emailed_through', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('conversations', schema=None) as batch_op:
        batch_op.drop_column('emailed_through')
        batch_op.drop_column('customer_seen')
