"""A shop on FastAPI and SQLAlchemy (async, asyncpg) whose receipts axa-queue sends."""
