"""What tests, benchmarks and the load test drive the service with.

- chat_client: Chainlit's socket.io protocol as the page speaks it;
- server: a real `chainlit run` (or any command) on a free loopback port, started and stopped cleanly;
- documents: real PDF, Word, HTML and text files built in memory (good, broken and hostile);
- tiny_model: a random-weight model with the default model's tokenizer, built in seconds.

Imports flow one way: tests/, bench/ and locustfile.py import this; this never imports them.
"""
