"""Encodings on real files: mostly-UTF-8 text, Vim's own cp1251 and cp1252 tutors, pure binary.

The samples in tests/unit/data/ are excerpts of Vim's tutor (Debian's vim-runtime,
/usr/share/vim/vim90/tutor/, Vim license): the Russian one as shipped in cp1251,
the French one as shipped in Latin-1 (identical to cp1252 for its letters), and
the Portuguese UTF-8 one with three bytes broken on purpose.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from services.documents import errors as messages
from services.documents.encoding import decode_text, read_utf8
from services.documents.errors import DocumentError
from services.documents.extract import extract_document

DATA = Path(__file__).parent / "data"
LIMITS = {"max_pages": 5, "max_docx_uncompressed_bytes": 10_000_000, "max_chars": 1_000_000}


def read(name: str) -> bytes:
    return (DATA / name).read_bytes()


def test_mostly_utf8_is_read_as_utf8_and_the_user_told_how_many_bytes_were_replaced() -> None:
    data = read("vim-tutor-pt.mostly-utf8.txt")
    document = extract_document(data, "tutor-pt.txt", **LIMITS)
    assert document.notes == (messages.replaced_bytes_note(3),)
    assert "3 bytes were not valid UTF-8" in document.notes[0]
    assert document.text.count("\ufffd") == 3
    # every accented letter survives: the text is the original with three characters replaced
    assert "Lição 1.1:  MOVER O CURSOR" in document.text
    assert "ç" in document.text and "Ã§" not in document.text and "Ã£" not in document.text  # no mojibake


def test_a_single_stray_byte_in_ascii_text_stays_utf8() -> None:
    data = b"The price list, version two.\n" * 40 + b"Total: 12\xa3.\n"
    notes: list[str] = []
    text = decode_text(data, notes)
    assert text.endswith("Total: 12\ufffd.\n")
    assert notes == [messages.replaced_bytes_note(1)]
    assert notes[0].startswith("The file is UTF-8 except for a few bytes: 1 byte was")


def test_replaced_bytes_are_counted_per_byte() -> None:
    # a truncated 3-byte character (2 bytes) and one invalid byte
    reading = read_utf8("d’accord".encode()[:3] + b" ok \xff " + "é".encode())
    assert reading.replaced_bytes == 3
    assert reading.multibyte_chars == 1
    assert not reading.clearly_fails


@pytest.mark.parametrize(
    ("name", "encoding", "phrase"),
    [
        ("vim-tutor-ru.cp1251.txt", "cp1251", "Клавиша h находится слева и перемещает влево."),
        ("vim-tutor-fr.cp1252.txt", "cp1252", "La touche h est à gauche et déplace à gauche."),
    ],
)
def test_a_real_8bit_file_is_read_in_its_encoding(name: str, encoding: str, phrase: str) -> None:
    data = read(name)
    assert read_utf8(data).clearly_fails
    document = extract_document(data, name, **LIMITS)
    assert document.notes == (messages.NOTE_LEGACY_ENCODING.format(encoding=encoding),)
    assert phrase in document.text
    assert "\ufffd" not in document.text


def test_utf8_with_8bit_passages_stays_utf8_when_utf8_dominates() -> None:
    utf8 = read("vim-tutor-pt.mostly-utf8.txt")
    legacy = "Leçon très complète, à côté.".encode("cp1252")  # 6 invalid bytes among many valid characters
    notes: list[str] = []
    text = decode_text(utf8 + b"\n" + legacy, notes)
    assert "Lição" in text
    assert notes == [messages.replaced_bytes_note(3 + 6)]


def test_pure_binary_is_refused() -> None:
    noise = random.Random(13).randbytes(20_000).replace(b"\x00", b"\x01")  # no NUL: only the statistics tell
    with pytest.raises(DocumentError) as caught:
        extract_document(noise, "data.txt", **LIMITS)
    assert str(caught.value) == messages.unknown_binary_message("data.txt")
