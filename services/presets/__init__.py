"""Presets: a person's default chat settings (system prompt, sampling) applied to every new
conversation, and their named prompt templates (offered as starters), kept in the database.

- `validation.py`: what a client may send (types, sizes, control characters), `PresetError`;
- `store.py`: `PresetStore`, one person's presets, never another's;
- `commands.py`: `/preset ...` and `/template ...` in the chat.
"""
