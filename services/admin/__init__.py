"""The admin page at /admin: accounts, API keys, live figures and the audit log, for administrators
(services/admin/routes.py). Sections are listed in sections.py: adding one is one module and one line."""
