"""Overhead: what the app and its API add on top of the bare engine or a plain vLLM server."""
