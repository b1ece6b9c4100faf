"""Conversations that last: Chainlit's SQLAlchemy data layer on SQLite or PostgreSQL, the schema and its
migrations, resuming a stored conversation into a session, retention, and what happens when the database
is in trouble (chat goes on unsaved, saving resumes when it returns)."""
