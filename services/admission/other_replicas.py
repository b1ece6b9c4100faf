"""What the other app replicas at the same engine share with this one's waiting line (shared_line.py).

Their waiting chat turns keep their place ahead of later ones here (first come, first served across
replicas); the requests they run count against the stream pace's cap (pace.py); their document
parts count against DOCUMENT_SLOT_SHARE and their document prefills against the one at a time, so
N replicas do not let documents hold N times their share of the engine. Empty without sharing, or
while the database cannot answer.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field


@dataclass(frozen=True)
class OtherReplicas:
    """The other replicas' waiting chat turns and what they run at the engine."""

    waiting: list[float] = field(default_factory=list)  # when their chat turns arrived (our keys), sorted
    running: int = 0  # requests they run at the engine
    documents: int = 0  # document parts among them
    documents_prefilling: int = 0  # document parts of theirs still reading their prompt
    # Until the next exchange this replica's running requests grow by at most `share` from
    # `own_running` (its count at the exchange): the engine's free slots split between the replicas;
    # a slot one of its requests frees is its own again. Without it, every replica saw the same free
    # slots between two exchanges and took them all (a first burst ran 15 streams at a limit of 5, the
    # slowest at 1.5 tokens/s).
    share: int = sys.maxsize
    own_running: int = 0

    def allow(self, own_running: int) -> bool:
        """Whether the line, running `own_running` requests, may start one more before the next exchange."""
        return own_running - self.own_running < self.share

    @property
    def chats(self) -> int:
        """Chat turns and API requests they run (what is not a document part)."""
        return max(0, self.running - self.documents)
