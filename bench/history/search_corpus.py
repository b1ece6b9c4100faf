"""The search benchmark's conversations: varied text from a Zipf-distributed vocabulary, written
straight into a database whose schema the app's own migrations made (search.py measures them).

Vocabulary: the words of bench/data/prompts.json ranked by how often they occur there (real
English: "the", "of", "a" first), then made-up words (syllables, some with digits, like names and
identifiers) for a long tail, `VOCABULARY` words in all. Each word is drawn with probability
proportional to 1 / rank^ZIPF_S, as words are in real text. A conversation has `turns` messages,
user and assistant in turn (4-25 and 15-90 words); its name is its first message cut to 200
characters, as Chainlit names one; it starts somewhere in the last 180 days, a message every 30 s.
"""

from __future__ import annotations

import json
import re
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np

from bench.common import PROMPTS_FILE
from services.history.conversations import timestamp

VOCABULARY = 50_000
ZIPF_S = 1.07
SYLLABLES = "ka lo mi ne ru ta vi so de pa ber gan tor lin mar quo zen fel dra wis hol cen tri sta".split()  # noqa: SIM905
NAME_CHARS = 200


@dataclass(frozen=True)
class Conversation:
    id: str
    user_index: int
    name: str
    started: datetime
    messages: list[str]


def vocabulary(size: int, rng: np.random.Generator) -> list[str]:
    """Real words by their frequency in prompts.json, then made-up ones up to `size`."""
    prompts = json.loads(PROMPTS_FILE.read_text())
    text = json.dumps(prompts, ensure_ascii=False).lower()
    real = [word for word, _ in Counter(re.findall(r"[a-z]{2,}", text)).most_common()]
    words = list(real[:size])
    seen = set(real)
    while len(words) < size:  # made-up words, drawn in bulk (one at a time took seconds)
        counts = rng.integers(2, 5, size=size)
        digits = rng.integers(0, 1000, size=size)
        picks = rng.integers(0, len(SYLLABLES), size=(size, 4))
        for count, pick, digit in zip(counts, picks, digits, strict=True):
            word = "".join(SYLLABLES[j] for j in pick[:count]) + (str(digit) if digit < 100 else "")
            if word not in seen and len(words) < size:
                seen.add(word)
                words.append(word)
    return words


def zipf_cumulative(size: int) -> np.ndarray:
    weights = 1.0 / np.arange(1, size + 1) ** ZIPF_S
    return np.cumsum(weights / weights.sum())


def conversations(count: int, turns: int, people: int, seed: int = 7) -> Iterator[Conversation]:
    """`count` conversations of `turns` messages, spread over `people` people in turn."""
    rng = np.random.default_rng(seed)
    words = np.array(vocabulary(VOCABULARY, rng), dtype=object)
    cumulative = zipf_cumulative(len(words))
    now = datetime(2026, 12, 1, tzinfo=UTC)
    for index in range(count):
        lengths = [int(rng.integers(4, 26) if i % 2 == 0 else rng.integers(15, 91)) for i in range(turns)]
        drawn = words[np.searchsorted(cumulative, rng.random(sum(lengths)))]
        messages = []
        start = 0
        for length in lengths:
            messages.append(" ".join(drawn[start : start + length]).capitalize() + ".")
            start += length
        started = now - timedelta(seconds=float(rng.uniform(0, 180 * 86400)))
        yield Conversation(
            str(uuid.UUID(int=int(rng.integers(0, 2**63)) << 64 | index)),
            index % people,
            messages[0][:NAME_CHARS],
            started,
            messages,
        )


def thread_row(conversation: Conversation, user_id: str, identifier: str) -> tuple:
    return (
        conversation.id,
        timestamp(conversation.started),
        conversation.name,
        user_id,
        identifier,
        "[]",
        "{}",
    )


def step_rows(conversation: Conversation) -> Iterator[tuple]:
    for i, output in enumerate(conversation.messages):
        at = timestamp(conversation.started + timedelta(seconds=30 * i))
        kind, name = ("user_message", "User") if i % 2 == 0 else ("assistant_message", "vLLM Chat")
        yield (str(uuid.uuid4()), name, kind, conversation.id, output, at, at, at, "{}", "{}")


THREAD_COLUMNS = ("id", "createdAt", "name", "userId", "userIdentifier", "tags", "metadata")
STEP_COLUMNS = (
    "id",
    "name",
    "type",
    "threadId",
    "output",
    "createdAt",
    "start",
    "end",
    "metadata",
    "generation",
)
USER_COLUMNS = (
    "id",
    "identifier",
    "metadata",
    "createdAt",
    "password_hash",
    "role",
    "disabled",
    "updated_at",
)
