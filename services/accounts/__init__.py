"""People: accounts in the database (argon2 hashes, roles), sign-in by password, header or OAuth,
limits on failed sign-ins, the JWT secret, and the `python -m services.accounts` command."""
