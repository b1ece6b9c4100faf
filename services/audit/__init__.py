"""The append-only audit log: who did what to whom, from where, and when (services/audit/log.py)."""
