"""Which language a document or a request is in (py3langid: offline, its model inside the package).

The answer about a document follows the language of the user's request, or
of the document when the request is empty or too short to tell.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

DEFAULT_LANGUAGE = "en"
SAMPLE_CHARS = 4000  # from the start, the middle and the end of a document: enough, and fast
CONFIDENT = 0.5  # a request this sure of its language is answered in it
PLAUSIBLE = 0.15  # below this, a request says nothing about its language
# Languages a request may be recognised as (short texts otherwise drift to rare labels).
LANGUAGE_NAMES = {
    "en": "English",
    "pt": "Portuguese",
    "es": "Spanish",
    "fr": "French",
    "de": "German",
    "it": "Italian",
    "nl": "Dutch",
    "ru": "Russian",
    "pl": "Polish",
    "cs": "Czech",
    "sv": "Swedish",
    "da": "Danish",
    "no": "Norwegian",
    "fi": "Finnish",
    "ro": "Romanian",
    "hu": "Hungarian",
    "tr": "Turkish",
    "el": "Greek",
    "uk": "Ukrainian",
    "ca": "Catalan",
    "gl": "Galician",
    "id": "Indonesian",
    "vi": "Vietnamese",
    "zh": "Chinese",
    "ja": "Japanese",
    "ko": "Korean",
    "ar": "Arabic",
    "he": "Hebrew",
    "hi": "Hindi",
    "bg": "Bulgarian",
    "hr": "Croatian",
}

_lock = threading.Lock()


@functools.cache
def _identifier() -> Any:
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


def _ranked(text: str) -> list[tuple[str, float]]:
    with _lock:  # loaded once; numpy scoring is quick
        return _identifier().rank(text)


def sample_of(text: str) -> str:
    """Up to SAMPLE_CHARS characters from the start, the middle and the end of `text`."""
    if len(text) <= SAMPLE_CHARS:
        return text
    third = SAMPLE_CHARS // 3
    middle = len(text) // 2
    return " ".join((text[:third], text[middle - third // 2 : middle + third // 2], text[-third:]))


def identify(text: str) -> tuple[str, float]:
    """The likeliest language of `text` (ISO 639-1 code) and its probability."""
    ranked = _ranked(sample_of(text)) if text.strip() else []
    return ranked[0] if ranked else ("", 0.0)


def document_language(text: str) -> str:
    """The language most of `text` is written in, English if it cannot tell."""
    language, probability = identify(text)
    return language if probability >= PLAUSIBLE else DEFAULT_LANGUAGE


def answer_language(request: str, document_language: str | None) -> str:
    """The language to answer `request` in: the request's, else the document's.

    A short request ("Resuma o documento") scores low for every language; when
    the document's language is about as likely as the best guess, it wins.
    """
    fallback = document_language or DEFAULT_LANGUAGE
    words = request.split()
    if len(words) < 2:
        return fallback
    scores = {language: p for language, p in _ranked(request) if language in LANGUAGE_NAMES}
    if not scores:
        return fallback
    best = max(scores, key=scores.__getitem__)
    if scores[best] >= CONFIDENT:
        return best
    if scores.get(fallback, 0.0) >= scores[best] / 2 or scores[best] < PLAUSIBLE:
        return fallback
    return best


def language_name(code: str) -> str:
    """The English name of a language code, for instructions to the model."""
    return LANGUAGE_NAMES.get(code, code)
