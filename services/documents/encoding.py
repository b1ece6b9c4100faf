"""Which text encoding a file is in, and whether it is text at all.

UTF-8 first: a file that is UTF-8 except for a few broken bytes is read as
UTF-8, the broken bytes replaced with U+FFFD, and the user is told how many.
An 8-bit encoding (cp1251, cp1252, ...) is guessed only when UTF-8 clearly
fails: most of the non-ASCII bytes do not form UTF-8 characters, as in a file
written by an old Windows machine, where almost no high byte happens to.
"""

from __future__ import annotations

import codecs
import contextvars
from dataclasses import dataclass

from services.documents.errors import NOTE_LEGACY_ENCODING, replaced_bytes_note

SNIFF_WINDOW_BYTES = 64 * 1024  # how much of a text file is inspected for binary content
MIN_LEGACY_COHERENCE = 0.1  # charset-normalizer's language fit; junk bytes score ~0
COMMON_ENCODINGS = ("cp1252", "cp1251", "cp1250", "latin_1", "koi8_r", "cp1253", "cp1254", "cp1256", "cp1257")
MAX_CONTROL_CHAR_SHARE = 0.1  # more replacement/control characters than this = not text
# UTF-8 "clearly fails" when invalid bytes outnumber valid multi-byte characters this many times.
# In cp1251/cp1252 text nearly every high byte is invalid UTF-8 (a valid pair is a rare accident);
# in UTF-8 with a few broken bytes the valid characters far outnumber them.
LEGACY_INVALID_PER_VALID = 4
# ...and there are at least this many: a handful of stray bytes is too little evidence for a
# statistical guess (one such file came out as cp1258), and a handful of U+FFFD costs little.
MIN_LEGACY_INVALID_BYTES = 8

_REPLACED_BYTES: contextvars.ContextVar[list[int]] = contextvars.ContextVar("replaced_bytes")


def _count_and_replace(error: UnicodeError) -> tuple[str, int]:
    """A codec error handler: one U+FFFD per invalid sequence, its bytes counted."""
    assert isinstance(error, UnicodeDecodeError)
    _REPLACED_BYTES.get()[0] += error.end - error.start
    return "\ufffd", error.end


codecs.register_error("documents-count-replace", _count_and_replace)


@dataclass(frozen=True)
class Utf8Reading:
    """`data` read as UTF-8: the text, the bytes replaced, and the valid multi-byte characters."""

    text: str
    replaced_bytes: int
    multibyte_chars: int

    @property
    def clearly_fails(self) -> bool:
        """Most non-ASCII content is not UTF-8: look for an 8-bit encoding instead."""
        many = self.replaced_bytes >= MIN_LEGACY_INVALID_BYTES
        return many and self.replaced_bytes > LEGACY_INVALID_PER_VALID * self.multibyte_chars


def read_utf8(data: bytes) -> Utf8Reading:
    """Decode UTF-8 (a BOM is dropped), replacing and counting the invalid bytes."""
    counter = [0]
    token = _REPLACED_BYTES.set(counter)
    try:
        text = data.decode("utf-8-sig", errors="documents-count-replace")
    finally:
        _REPLACED_BYTES.reset(token)
    multibyte = sum(1 for char in text if ord(char) > 127 and char != "\ufffd")
    return Utf8Reading(text, counter[0], multibyte)


def looks_binary(data: bytes) -> bool:
    """NUL bytes, or many undecodable/control characters, in the first bytes."""
    sample = data[:SNIFF_WINDOW_BYTES]
    if b"\x00" in sample:
        return True
    text = sample.decode("utf-8", errors="replace")
    limit = MAX_CONTROL_CHAR_SHARE * max(len(text), 1)
    controls = sum(1 for char in text if ord(char) < 32 and char not in "\t\n\r\f\v\x1b")
    if controls + text.count("\ufffd") <= limit:
        return False
    # Not UTF-8, but maybe text in an 8-bit encoding (cp1251, cp1252...): every letter is a high byte.
    return controls > limit or legacy_encoding(sample) is None


def has_utf16_bom(data: bytes) -> bool:
    return data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))


def decode_text(data: bytes, notes: list[str]) -> str:
    """UTF-16 (by BOM), or UTF-8 with broken bytes replaced; an 8-bit encoding only if UTF-8 clearly fails."""
    if has_utf16_bom(data):
        return data.decode("utf-16", errors="replace")
    reading = read_utf8(data)
    if not reading.replaced_bytes:
        return reading.text
    if reading.clearly_fails:
        legacy = legacy_encoding(data)  # e.g. cp1251 from an old Windows machine
        if legacy is not None:
            notes.append(NOTE_LEGACY_ENCODING.format(encoding=legacy))
            return data.decode(legacy, errors="replace")
    notes.append(replaced_bytes_note(reading.replaced_bytes))
    return reading.text


def legacy_encoding(data: bytes) -> str | None:
    """The 8-bit encoding charset-normalizer finds for `data`, if the result reads as a language."""
    import charset_normalizer

    matches = charset_normalizer.from_bytes(data[:SNIFF_WINDOW_BYTES])
    best = matches.best()
    if best is None or best.coherence < MIN_LEGACY_COHERENCE or best.encoding in ("utf_8", "ascii"):
        return None
    # Encodings that fit equally well (cp1250 and cp1252 read most French alike): the commonest wins.
    tied = [m.encoding for m in matches if (m.chaos, m.coherence) == (best.chaos, best.coherence)]
    rank = {encoding: i for i, encoding in enumerate(COMMON_ENCODINGS)}
    return min(tied, key=lambda encoding: rank.get(encoding, len(rank)))
