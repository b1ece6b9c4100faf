"""Measures of a summary: distinct 4-grams, coverage of each section's top TF-IDF terms, language,
instruction echo.

Coverage: the document is cut into sections of ~SECTION_TOKENS tokens (at
paragraph breaks); each section's top TERMS_PER_SECTION terms by TF-IDF
(sublinear tf, idf over every section of every document in the set, stop
words of the set's languages left out) are looked up in the summary, by word
or by a shared 5-letter stem (so "packages" finds "package"). A document's
coverage is the mean share over its sections.

Instruction echo (services/documents/echo.py): the summary's word 4-grams (count
and share) that come from the instructions its side sent (every step's prompt,
taken from the side's own SummaryPrompts) and not from the document.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable

from services.config import Settings
from services.documents.chunking import split_into_chunks
from services.documents.echo import echo_of, instruction_texts
from services.documents.prompts import SummaryPrompts

SECTION_TOKENS = 600
TERMS_PER_SECTION = 10
STEM_LETTERS = 5
_WORD = re.compile(r"[^\W\d_]{3,}", re.UNICODE)  # words of 3+ letters; numbers and symbols left out
STOP_WORDS = frozenset(
    " ".join(
        (
            "the and for are but not you all any can had her was one our out day get has him his how man",
            "new now old see two way who did its let put say she too use that with have this will your from",
            "they know want been good much some time very when come here just like long make many more only",
            "over such take than them well were what which their there these those then into also each other",
            "would could should about after before where while being does doing used using may must shall",
            "might every both same most between through during without within because however therefore thus",
            "via per etc",
            "que para com uma por dos das nos nas não mais como mas foi ser são está pelo pela seu sua",
            "seus suas ele ela eles elas isso este esta esse essa aos sobre entre quando onde também pode",
            "você tem ter der die das und ist nicht ein eine einer eines dem den des mit von sich auf für",
            "als auch werden wird sie ich wir ihr oder aus bei nach wie zum zur dass kann sind noch nur über",
            "unter wenn diese dieser les une est pas dans qui sur par avec sont plus ses aux cette ces ont",
            "été être vous nous elle ils leur fait peut comme tout tous los las del con más pero sus ese esa",
        )
    ).split()
)


def words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def distinct_ngram_ratio(text: str, n: int = 4) -> float:
    """Distinct n-grams of words over all n-grams (1.0 for a text too short to have any)."""
    tokens = re.findall(r"\w+", text.lower())
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 1.0


def sections_of(text: str, count_tokens: Callable[[str], int]) -> list[str]:
    return split_into_chunks(text, count_tokens, SECTION_TOKENS)


class Coverage:
    """TF-IDF top terms per section, with the IDF of a whole document set."""

    def __init__(self, all_sections: list[list[str]]) -> None:
        flat = [set(self._terms(section)) for sections in all_sections for section in sections]
        self._sections = max(len(flat), 1)
        self._document_frequency = Counter(term for terms in flat for term in terms)

    @staticmethod
    def _terms(text: str) -> list[str]:
        return [w for w in words(text) if w not in STOP_WORDS]

    def top_terms(self, section: str) -> list[str]:
        counts = Counter(self._terms(section))
        score = {
            term: (1 + math.log(tf)) * math.log((1 + self._sections) / (1 + self._document_frequency[term]))
            for term, tf in counts.items()
        }
        return sorted(score, key=lambda term: (-score[term], term))[:TERMS_PER_SECTION]

    def of(self, sections: list[str], summary: str) -> tuple[float, list[float]]:
        """(mean share, share per section) of the sections' top terms that the summary mentions."""
        found_words = set(words(summary))
        found_stems = {w[:STEM_LETTERS] for w in found_words if len(w) >= STEM_LETTERS}
        shares = []
        for section in sections:
            terms = self.top_terms(section)
            hits = sum(
                1
                for t in terms
                if t in found_words or (len(t) >= STEM_LETTERS and t[:STEM_LETTERS] in found_stems)
            )
            shares.append(hits / len(terms) if terms else 0.0)
        return (sum(shares) / len(shares) if shares else 0.0), shares


def identify_language(text: str) -> str:
    """The language py3langid finds in `text` ("" for no text)."""
    from services.documents.language import identify

    return identify(text)[0]


def echo_measure(summary: str, prompts: SummaryPrompts, settings: Settings, document: str) -> dict:
    """The summary's echo of the instructions `prompts` sends (services/documents/echo.py)."""
    echo = echo_of(summary, instruction_texts(prompts, settings.system_prompt), document)
    return {
        "echoed": echo.echoed,
        "score": echo.score,
        "ngrams": echo.total,
        "phrases": list(echo.phrases),
        "repeats_instructions": echo.repeats_instructions,
    }
