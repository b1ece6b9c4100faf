"""Conversations leaving and entering the app: export (Markdown, JSON, an archive of all of one's
conversations), import (the app's archive or Markdown export, ChatGPT's conversations.json), and
read-only share links (a snapshot copied at share time, found by the hash of an unguessable token)."""
