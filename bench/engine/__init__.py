"""The engine: speed, batching, KV block size, CPU thread layout, affinity across servers."""
