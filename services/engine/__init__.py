"""The model engine: vLLM in this process (local) or vLLM servers (remote), and chat on top of it."""
