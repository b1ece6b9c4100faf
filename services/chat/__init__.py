"""Conversations: per-session state and its lifetime, prompts within the context, answers and summaries."""
