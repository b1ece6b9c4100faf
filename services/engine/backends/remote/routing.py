"""Which vLLM server gets a request (ENGINE_URLS): the one that holds its prefix, else the least busy.

vLLM's prefix cache keeps the KV of prompts it has seen, so a conversation's
next turn (same system prompt, document and history, one more message) is
read in a fraction of the time on the server that served the last one. Each
server's recent prompt prefixes are remembered as chained hashes of
BLOCK_TOKENS-token blocks, in a bounded LRU; a request goes to the healthy
server with the longest matching prefix unless that server has
ENGINE_AFFINITY_SLACK more of our requests in flight than the least busy one.
Then, and for ties, it goes by load.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from services.engine.backends.remote.listing import Card

BLOCK_TOKENS = 64  # prefix granularity (vLLM's CPU KV blocks hold 16-128 tokens)
PREFIX_BLOCKS_KEPT = 16_384  # per server: ~1M prompt tokens, more than a CPU server's KV cache holds
# A server counts as overloaded for affinity once it has this many more of our requests in flight than
# the least busy one: the request then goes by load.
ENGINE_AFFINITY_SLACK = 4


def prefix_hashes(token_ids: Sequence[int], block_tokens: int = BLOCK_TOKENS) -> list[int]:
    """One hash per full block of the prompt, each chained to the blocks before it."""
    hashes: list[int] = []
    previous = 0
    for start in range(0, len(token_ids) - block_tokens + 1, block_tokens):
        previous = hash((previous, tuple(token_ids[start : start + block_tokens])))
        hashes.append(previous)
    return hashes


class PrefixIndex:
    """The prompt-prefix blocks one server has seen lately, least recently used first."""

    def __init__(self, max_blocks: int = PREFIX_BLOCKS_KEPT) -> None:
        self.max_blocks = max_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def matched_blocks(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of a prompt this server has seen."""
        matched = 0
        for block in hashes:
            if block not in self._blocks:
                break
            matched += 1
        return matched

    def add(self, hashes: Sequence[int]) -> None:
        for block in hashes:
            self._blocks[block] = None
            self._blocks.move_to_end(block)
        while len(self._blocks) > self.max_blocks:
            self._blocks.popitem(last=False)


@dataclass
class Server:
    """One vLLM server and what this app knows about it."""

    url: str
    model: str = ""
    max_model_len: int = 0
    healthy: bool = True
    accepts_priority: bool = True
    models: dict[str, Card] = field(default_factory=dict)  # what it lists at /v1/models, by name
    listed: bool = True  # its last /v1/models reading succeeded: its models are offered
    in_flight: set[str] = field(default_factory=set)  # ids of our requests it is serving
    prefixes: PrefixIndex = field(default_factory=PrefixIndex)


def model_id(server: Server, model: str) -> str:
    """The id `server` knows the model named `model` by (empty: the server's first model)."""
    card = server.models.get(model) if model else None
    return card.id if card is not None else server.model


def servers_to_try(
    servers: list[Server], hashes: Sequence[int] = (), affinity_slack: int | None = None
) -> list[Server]:
    """Every server, best first.

    Without `hashes` (or with affinity off, `affinity_slack` None): healthy before
    failing, then fewest of our requests in flight. With them, the healthy server
    holding the longest prefix of the prompt goes first, unless it is overloaded
    (`affinity_slack` more in flight than the least busy healthy server). Failing
    servers are still tried, last: a failure is per request, and a server that
    came back is found by trying it.
    """
    by_load = sorted(servers, key=lambda s: (not s.healthy, len(s.in_flight)))
    healthy = [s for s in by_load if s.healthy]
    if not hashes or affinity_slack is None or not healthy:
        return by_load
    least = len(healthy[0].in_flight)
    candidates = [s for s in healthy if len(s.in_flight) <= least + affinity_slack]
    best = max(candidates, key=lambda s: (s.prefixes.matched_blocks(hashes), -len(s.in_flight)))
    return [best, *(s for s in by_load if s is not best)]
