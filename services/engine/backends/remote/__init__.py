"""vLLM servers as the engine (ENGINE_URLS): `RemoteLLM` stands where the in-process AsyncLLM stands.

- `remote_engine_lifespan(settings)`: a connection pool to the servers, yielding a `ChatEngine`;
- `RemoteLLM`: the part of AsyncLLM that `ChatEngine` uses, over HTTP (the /v1 API
  sends its own requests through `RemoteLLM.open_stream`);
- routing (`Server`, `prefix_hashes`, `servers_to_try`): the server that holds a
  prompt's prefix, else the least busy;
- the wire format (`completion_body`, `parse_event`, `chunk_output`) and its failures
  (`RemoteEngineError`, `ServerUnreachableError`).
"""

from services.engine.backends.remote.engine import RemoteLLM, remote_engine_lifespan
from services.engine.backends.remote.protocol import (
    RemoteEngineError,
    ServerUnreachableError,
    chunk_output,
    completion_body,
    parse_event,
)
from services.engine.backends.remote.routing import Server, prefix_hashes, servers_to_try

__all__ = [
    "RemoteEngineError",
    "RemoteLLM",
    "Server",
    "ServerUnreachableError",
    "chunk_output",
    "completion_body",
    "parse_event",
    "prefix_hashes",
    "remote_engine_lifespan",
    "servers_to_try",
]
