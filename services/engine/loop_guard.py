"""The loop guard: ends a stream whose tail repeats itself, for every request of `ChatEngine.generate`.

A small model sometimes falls into a loop: the same sentence, or the same
two sentences, over and over until the token cap. The detector watches the
output token ids and fires when the tail is periodic: some unit of 1 to
`max_period` tokens has been repeated exactly, `min_repeats` times in a row,
over at least `min_tokens` tokens.

Lists and tables are not loops: they repeat their markup (bullets, numbers,
pipes, separator rows) but each item or row brings new content, and every new
token that differs from the token one period back resets the count. Only an
exact re-emission of the same unit, several times over, fires. A unit with no
letter or digit at all (a long separator row of a wide table, a rule of dashes)
needs SYMBOL_ONLY_FACTOR times as many repeated tokens. The guard keeps
the text before the repetition started (one copy of the unit) for the caller.

Summaries also get the echo guard (EchoDetector): a small model often loops
in paraphrase, the same sentence again with a word changed, which an exact
period never sees. It fires when most of the answer's last few word 4-grams
appeared before in it, or when a finished sentence of prose is mostly made
of character 5-grams the answer already had (the same sentence with other
misspellings). Chat answers do not get it: a templated list ("Test case 3:
verify that ...") is a fine chat answer, while a summary is asked for prose
in its own words. Table rows and code blocks never count; list items count
only for the word rule.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from services.config import Settings
from services.engine.errors import EchoError, RepetitionError

SYMBOL_ONLY_FACTOR = 4  # a unit of pure markup ("|---") must repeat this many times longer
LOOP_GUARD_MIN_REPEATS = 3  # copies of the repeated unit before the guard fires
LOOP_GUARD_MAX_PERIOD_TOKENS = 256  # longest repeated unit looked for, in tokens (a paragraph)
# The echo guard (summaries only): it stops a summary once ECHO_SHARE of its last ECHO_WINDOW word 4-grams
# already appeared in it (a loop in paraphrase), or at a prose sentence (5+ words, not a list item) whose
# character 5-grams are ECHO_SENTENCE_SHARE or more already in the summary (a sentence again, misspelled).
LOOP_GUARD_ECHO_WINDOW = 8  # word 4-grams looked back over; 0 = the echo guard is off
LOOP_GUARD_ECHO_SHARE = 0.6  # of them seen before that stops a summary
LOOP_GUARD_ECHO_SENTENCE_SHARE = 0.7  # of a prose sentence's character 5-grams seen before that stops it


@dataclass(frozen=True)
class LoopGuardConfig:
    """When a repeating tail counts as a loop (LOOP_GUARD_MIN_TOKENS, the rest the constants above)."""

    min_tokens: int = 32  # repeated tokens before the guard fires; 0 = the guard is off
    min_repeats: int = LOOP_GUARD_MIN_REPEATS  # copies of the unit in the tail, the first one included
    max_period: int = LOOP_GUARD_MAX_PERIOD_TOKENS  # longest unit, in tokens, looked for
    echo_window: int = LOOP_GUARD_ECHO_WINDOW  # word 4-grams the echo guard looks back over; 0 = off
    echo_share: float = LOOP_GUARD_ECHO_SHARE  # share of them seen before in the answer that fires it
    echo_sentence_share: float = LOOP_GUARD_ECHO_SENTENCE_SHARE  # of a prose sentence's 5-grams seen before

    @classmethod
    def from_settings(cls, settings: Settings) -> LoopGuardConfig:
        """The guard as LOOP_GUARD_MIN_TOKENS sets it."""
        return cls(min_tokens=settings.loop_guard_min_tokens)

    @property
    def enabled(self) -> bool:
        return self.min_tokens > 0


class RepetitionDetector:
    """Feeds on output token ids; raises RepetitionError when the tail loops.

    For each period p it keeps the run of trailing tokens equal to the token p
    positions earlier: O(max_period) per token, memory bounded by the answer.
    """

    def __init__(
        self, config: LoopGuardConfig, decode: Callable[[list[int]], str], *, echoes: bool = False
    ) -> None:
        self.config = config
        self._decode = decode
        self._ids: list[int] = []
        self._runs = [0] * (config.max_period + 1)
        self._echoes = (
            EchoDetector(config.echo_window, config.echo_share, config.echo_sentence_share)
            if echoes
            else None
        )
        self.fired = False

    def feed(self, token_ids: Iterable[int], text: str | None = None) -> None:
        """Account new tokens (and their text); raise RepetitionError if the answer now loops."""
        if not self.config.enabled:
            return
        token_ids = list(token_ids)
        if self._echoes is not None:
            try:
                self._echoes.feed(self._decode(token_ids) if text is None else text)
            except EchoError:
                self.fired = True
                raise
        for token in token_ids:
            self._ids.append(token)
            period = self._periodic_tail()
            if period:
                repeated = self._runs[period]
                kept = self._ids[: len(self._ids) - repeated]
                self.fired = True
                raise RepetitionError(period, repeated, self._decode(kept))

    def _periodic_tail(self) -> int:
        """The shortest period whose repetition now reaches the thresholds, else 0."""
        ids = self._ids
        runs = self._runs
        config = self.config
        last = ids[-1]
        count = len(ids)
        found = 0
        for period in range(1, min(config.max_period, count - 1) + 1):
            runs[period] = runs[period] + 1 if ids[count - 1 - period] == last else 0
            needed = max(config.min_tokens, (config.min_repeats - 1) * period)
            if not found and runs[period] >= needed and self._long_enough(period, needed):
                found = period
        return found

    def _long_enough(self, period: int, needed: int) -> bool:
        """A unit with words in it fires at `needed`; pure markup only at SYMBOL_ONLY_FACTOR times that."""
        if self._runs[period] >= needed * SYMBOL_ONLY_FACTOR:
            return True
        unit = self._decode(self._ids[-period:])
        return any(char.isalnum() for char in unit)


_PIECE = re.compile(r"\w+|\n|[.!?]+(?=\s)")  # a word, a line's end or a sentence's end
_LINE_HEAD = re.compile(r"[ \t]*(\S{1,3})")
_SENTENCE_END = re.compile(r"[.!?;:](?=\s)|\n")
_NOT_WORD = re.compile(r"[^\w\s]+")
_SPACES = re.compile(r"\s+")
_GRAM = 4  # words per n-gram: the unit of the distinct-4 measure in bench/documents/summary_quality.py
_SHINGLE = 5  # characters per shingle of the sentence rule
_SENTENCE_MIN_WORDS = 5  # shorter sentences ("See below.") may well repeat


class EchoDetector:
    """Feeds on answer text; raises EchoError when the answer keeps re-using its own phrases.

    Word rule: each completed word closes a word 4-gram, an echo if the answer
    already had it; when `share` of the last `window` 4-grams are echoes, the
    answer is cut at the start of the sentence holding the first of them.
    Sentence rule: a finished sentence of prose (5+ words, not a list item)
    whose character 5-grams are `sentence_share` or more the answer's earlier
    ones is cut with everything after it. Table rows ("| ...") and code fences
    count for neither. Memory is bounded by the answer's length.
    """

    def __init__(self, window: int, share: float, sentence_share: float = 1.0) -> None:
        self.window = window
        self.share = share
        self.sentence_share = sentence_share
        self._text = ""
        self._done = 0  # characters consumed
        self._sentence_start = 0
        self._shingles: set[str] = set()
        self._line_start = 0
        self._line_head: str | None = None  # the line's first characters, once they arrived
        self._in_code = False
        self._seen: set[tuple[str, ...]] = set()
        self._words: deque[tuple[str, int]] = deque(maxlen=_GRAM)  # (word, where it starts)
        self._recent: deque[tuple[bool, int]] = deque(maxlen=max(1, window))  # (echo, where it starts)
        self._echo_count = 0

    def feed(self, text: str) -> None:
        if self.window <= 0 or not text:
            return
        self._text += text
        for match in _PIECE.finditer(self._text, self._done):
            piece = match.group()
            if match.end() == len(self._text) and piece != "\n":
                break  # the word or the run of marks may go on in the next delta
            counted = not self._in_code and not self._line().startswith(("|", "```"))
            if piece == "\n" or piece[0] in ".!?":
                if counted:
                    self._end_sentence(match.end())
                self._sentence_start = match.end()
                if piece == "\n":
                    self._end_line(match.start())
            elif counted:
                self._word(piece.lower(), match.start())
            self._done = match.end()

    def _line(self) -> str:
        if self._line_head is None:
            head = _LINE_HEAD.match(self._text, self._line_start)
            if head is None:
                return ""
            self._line_head = head.group(1)
        return self._line_head

    def _end_line(self, at: int) -> None:
        if self._line().startswith("```"):
            self._in_code = not self._in_code
        self._line_start = at + 1
        self._line_head = None

    def _word(self, word: str, start: int) -> None:
        self._words.append((word, start))
        if len(self._words) < _GRAM:
            return
        gram = tuple(w for w, _ in self._words)
        echo = gram in self._seen
        self._seen.add(gram)
        if len(self._recent) == self._recent.maxlen:
            self._echo_count -= self._recent[0][0]
        self._recent.append((echo, self._words[0][1]))
        self._echo_count += echo
        if len(self._recent) == self.window and self._echo_count >= self.share * self.window:
            first = next(start for echoed, start in self._recent if echoed)
            reason = f"{self._echo_count} of the answer's last {self.window} word 4-grams had appeared before"
            raise EchoError(reason, self._kept(first))

    def _end_sentence(self, end: int) -> None:
        sentence = self._text[self._sentence_start : end]
        if len(sentence.split()) < _SENTENCE_MIN_WORDS or _is_list_item(self._line()):
            return
        flat = _SPACES.sub(" ", _NOT_WORD.sub("", sentence.lower())).strip()
        shingles = {flat[i : i + _SHINGLE] for i in range(len(flat) - _SHINGLE + 1)}
        seen = len(shingles & self._shingles)
        if shingles and seen >= self.sentence_share * len(shingles):
            reason = f"{seen} of a sentence's {len(shingles)} character 5-grams had appeared before"
            raise EchoError(reason, self._text[: self._sentence_start].rstrip())
        self._shingles |= shingles

    def _kept(self, first_echo: int) -> str:
        """The answer before the sentence where the echoes began (or before the echo, in the first one)."""
        ends = [m.end() for m in _SENTENCE_END.finditer(self._text, 0, first_echo)]
        cut = ends[-1] if ends and self._text[: ends[-1]].strip() else first_echo
        return self._text[:cut].rstrip()


def _is_list_item(head: str) -> bool:
    """A bullet, a number and its dot, a heading: items there may share most of their wording."""
    return head.startswith(("-", "*", "+", "•", "#")) or (head[:1].isdigit() and any(c in head for c in ".)"))


def repeats_in(
    token_ids: list[int], config: LoopGuardConfig, decode: Callable[[list[int]], str], *, echoes: bool = False
) -> RepetitionError | None:
    """Whether a finished answer would have tripped the guard (benchmarks, tests)."""
    detector = RepetitionDetector(config, decode, echoes=echoes)
    try:
        detector.feed(token_ids)
    except RepetitionError as error:
        return error
    return None
