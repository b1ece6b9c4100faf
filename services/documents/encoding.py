"""Which text encoding a file is in, and whether it is text at all."""

from __future__ import annotations

import codecs

from services.documents.errors import NOTE_LEGACY_ENCODING, NOTE_REPLACED_BYTES

SNIFF_WINDOW_BYTES = 64 * 1024  # how much of a text file is inspected for binary content
MIN_LEGACY_COHERENCE = 0.1  # charset-normalizer's language fit; junk bytes score ~0
COMMON_ENCODINGS = ("cp1252", "cp1251", "cp1250", "latin_1", "koi8_r", "cp1253", "cp1254", "cp1256", "cp1257")
MAX_CONTROL_CHAR_SHARE = 0.1  # more replacement/control characters than this = not text


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
    """UTF-16 (by BOM) or UTF-8; a file with no UTF-8 beyond ASCII is read in its detected 8-bit encoding."""
    encoding = "utf-16" if has_utf16_bom(data) else "utf-8-sig"  # utf-8-sig strips a BOM
    try:
        return data.decode(encoding)
    except UnicodeDecodeError:
        text = data.decode(encoding, errors="replace")
    if encoding != "utf-16" and not any(ord(c) > 127 and c != "\ufffd" for c in text):
        legacy = legacy_encoding(data)  # e.g. cp1251 from an old Windows machine
        if legacy is not None:
            notes.append(NOTE_LEGACY_ENCODING.format(encoding=legacy))
            return data.decode(legacy, errors="replace")
    notes.append(NOTE_REPLACED_BYTES)  # UTF-8 with a few broken bytes
    return text


def legacy_encoding(data: bytes) -> str | None:
    """The 8-bit encoding charset-normalizer finds for `data`, if the result reads as a language."""
    import charset_normalizer

    matches = charset_normalizer.from_bytes(data[:SNIFF_WINDOW_BYTES])
    best = matches.best()
    if best is None or best.coherence < MIN_LEGACY_COHERENCE:
        return None
    # Encodings that fit equally well (cp1250 and cp1252 read most French alike): the commonest wins.
    tied = [m.encoding for m in matches if (m.chaos, m.coherence) == (best.chaos, best.coherence)]
    rank = {encoding: i for i, encoding in enumerate(COMMON_ENCODINGS)}
    return min(tied, key=lambda encoding: rank.get(encoding, len(rank)))
