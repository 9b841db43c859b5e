"""The shared store (SQLAlchemy, Alembic migrations): conversations and messages, handoffs,
agents, action calls. Every surface reads and writes through it."""
