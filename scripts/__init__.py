"""Set-up, run and inspection commands (shell scripts, and Python tools importable by the tests)."""
