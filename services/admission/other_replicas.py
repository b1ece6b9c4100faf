"""What the other app replicas at the same engine share with this one's waiting line (shared_line.py).

Their waiting chat turns keep their place ahead of later ones here (first come, first served across
replicas); the requests they run count against the stream pace's cap (pace.py); their document
parts count against DOCUMENT_SLOT_SHARE and their document prefills against the one at a time, so
N replicas do not let documents hold N times their share of the engine. Empty without sharing, or
while the database cannot answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class OtherReplicas:
    """The other replicas' waiting chat turns and what they run at the engine."""

    waiting: list[float] = field(default_factory=list)  # when their chat turns arrived (our keys), sorted
    running: int = 0  # requests they run at the engine
    documents: int = 0  # document parts among them
    documents_prefilling: int = 0  # document parts of theirs still reading their prompt

    @property
    def chats(self) -> int:
        """Chat turns and API requests they run (what is not a document part)."""
        return max(0, self.running - self.documents)
