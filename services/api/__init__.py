"""The OpenAI-compatible API (/v1) next to the chat: vLLM's own serving layer over our engine, behind
one gate (keys, request limits, metrics, admission)."""
