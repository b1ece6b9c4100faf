"""Document extraction, chunking, ranking and the summary cache, on real generated files."""

from __future__ import annotations

import codecs
import io
import time
import tracemalloc
import zipfile
from collections import deque
from pathlib import Path

import pytest

from harness import documents as build
from services.chat.attachments import Attachments
from services.chat.session import ChatSession
from services.config import Settings
from services.documents import errors as messages
from services.documents.cache import SummaryCache, summary_key
from services.documents.chunking import split_into_chunks
from services.documents.errors import DocumentError
from services.documents.extract import Document, extract_document
from services.documents.prompts import SummaryPrompts, without_repeated_sentences
from services.documents.ranking import rank_chunks
from services.documents.sniff import sniff_kind
from services.documents.word import inflate_bounded
from services.engine import SamplingSettings
from tests.conftest import TINY_MAX_UPLOAD_BYTES
from tests.fakes import FakeClock

MIB = build.MIB
LIMITS = {"max_pages": 50, "max_docx_uncompressed_bytes": 20 * MIB, "max_chars": 1_000_000}
PARAGRAPHS = [
    "The quarterly report covers the harbour expansion in Rotterdam.",
    "Costs rose by twelve percent because steel prices went up.",
    "The committee approved a second crane for the container terminal.",
]


def extract(data: bytes, filename: str, **limits: int) -> Document:
    return extract_document(data, filename, **{**LIMITS, **limits})


def failure(data: bytes, filename: str, **limits: int) -> str:
    with pytest.raises(DocumentError) as caught:
        extract(data, filename, **limits)
    return str(caught.value)


def words(text: str) -> list[str]:
    return text.split()


@pytest.fixture(scope="module")
def zip_bomb() -> bytes:
    return build.make_docx_zip_bomb(200 * MIB)


# --- extraction: good files -----------------------------------------------------------
def test_pdf_text_is_extracted() -> None:
    document = extract(build.make_pdf(PARAGRAPHS), "report.pdf")
    assert document.kind == "pdf"
    assert document.name == "report.pdf"
    assert words(document.text) == words(" ".join(PARAGRAPHS))
    assert document.notes == ()


def test_pdf_with_only_an_owner_password_is_read() -> None:
    document = extract(build.make_encrypted_pdf(PARAGRAPHS, user_password=""), "locked.pdf")
    assert "Rotterdam" in document.text


def test_pdf_reads_only_max_pages_and_says_so() -> None:
    pages = [f"Page number {n} talks about topic{n}." for n in range(1, 6)]
    document = extract(build.make_pdf(pages, page_per_paragraph=True), "five.pdf", max_pages=2)
    assert "topic1" in document.text and "topic2" in document.text
    assert "topic3" not in document.text
    assert document.notes == ("Only the first 2 of 5 pages were read.",)


def test_docx_paragraphs_and_table_cells_in_order() -> None:
    data = build.make_docx(PARAGRAPHS, table_rows=[["Item", "Cost"], ["Crane", "4 million"]])
    document = extract(data, "minutes.docx")
    assert document.kind == "docx"
    assert document.text.split("\n\n") == [*PARAGRAPHS, "Item | Cost", "Crane | 4 million"]


def test_html_keeps_visible_text_only_with_whitespace_normalised() -> None:
    document = extract(build.make_html("Harbour news", PARAGRAPHS), "page.html")
    assert document.kind == "html"
    assert "secretTracking" not in document.text and "font-family" not in document.text
    assert "Enable JavaScript" not in document.text
    assert "First point" in document.text
    assert "Second point & more" in document.text  # entities decoded, &nbsp; is whitespace
    assert document.text.split("\n\n")[2:5] == PARAGRAPHS
    assert "  " not in document.text


def test_kind_comes_from_content_not_extension() -> None:
    assert sniff_kind(build.make_pdf(["x"]), "notes.txt") == "pdf"
    assert sniff_kind(build.make_docx(["x"]), "upload.bin") == "docx"
    assert sniff_kind(b"<!DOCTYPE html><html><p>hi</p></html>", "page.txt") == "html"


def test_extension_breaks_ties_between_text_markdown_and_html() -> None:
    text = b"# Title\n\nSome *words*."
    assert sniff_kind(text, "readme.md") == "markdown"
    assert sniff_kind(text, "readme.txt") == "text"
    assert sniff_kind(text, "readme") == "text"
    assert sniff_kind(b"<p>Hello</p>", "frag.htm") == "html"
    assert extract(b"<p>Hello <b>you</b></p>", "frag.html").text == "Hello you"


def test_utf8_bom_is_stripped_and_utf16_is_decoded() -> None:
    assert extract(codecs.BOM_UTF8 + "Grüße".encode(), "a.txt").text == "Grüße"
    document = extract("Grüße aus Köln".encode("utf-16"), "b.txt")
    assert document.text == "Grüße aus Köln"
    assert document.notes == ()


def test_invalid_utf8_is_replaced_with_a_note() -> None:
    document = extract(build.invalid_utf8_text(), "menu.txt")
    assert document.kind == "text"
    assert "Café menu: crème brûlée." in document.text
    assert "12\ufffd and na\ufffdve" in document.text
    assert document.notes == (messages.replaced_bytes_note(2),)


@pytest.mark.parametrize(
    ("text", "encoding"),
    [
        ("Отчёт о продажах за третий квартал. Выручка выросла на двенадцать процентов, "
         "а расходы на логистику снизились благодаря новому складу в Казани.", "cp1251"),
        ("Le café était très agréable, à côté de la fenêtre ; nous avons mangé des crêpes "
         "et parlé des résultats du trimestre.", "cp1252"),
    ],
)  # fmt: skip
def test_a_legacy_8bit_file_is_read_in_its_encoding(text: str, encoding: str) -> None:
    document = extract(text.encode(encoding), "old-report.txt")
    assert document.text == text
    assert document.notes == (messages.NOTE_LEGACY_ENCODING.format(encoding=encoding),)


def test_long_text_is_cut_to_max_chars_with_a_note() -> None:
    text = build.long_document(5000, seed=1)
    document = extract(text.encode(), "long.txt", max_chars=1000)
    assert len(document.text) <= 1000
    assert text.startswith(document.text)
    assert document.notes == ("The document is long: only its first 1,000 characters were read.",)


def test_name_is_the_base_name_of_the_upload() -> None:
    assert extract(b"hello", "C:\\Users\\me\\notes.txt").name == "notes.txt"
    assert extract(b"hello", "/tmp/x/notes.md").name == "notes.md"


# --- extraction: bad files, each with its own message -------------------------------
def test_encrypted_pdf_is_refused() -> None:
    assert failure(build.make_encrypted_pdf(PARAGRAPHS), "secret.pdf") == messages.PDF_ENCRYPTED


def test_scanned_pdf_is_refused_as_having_no_text_layer() -> None:
    message = failure(build.make_scanned_pdf(), "scan.pdf")
    assert message == messages.PDF_SCANNED
    assert "no text layer" in message and "OCR" in message


def test_corrupt_pdf_is_refused() -> None:
    assert failure(build.make_corrupt_pdf(), "broken.pdf") == messages.PDF_CORRUPT


def test_truncated_docx_is_refused() -> None:
    assert failure(build.make_corrupt_docx(), "cut.docx") == messages.DOCX_CORRUPT


def test_docx_with_broken_xml_is_refused() -> None:
    assert failure(build.make_docx_with_broken_xml(), "bad.docx") == messages.DOCX_CORRUPT


def test_docx_zip_bomb_is_refused_quickly(zip_bomb: bytes) -> None:
    started = time.perf_counter()
    assert failure(zip_bomb, "bomb.docx") == messages.DOCX_BOMB
    assert time.perf_counter() - started < 1.0


def test_docx_too_large_once_unpacked_is_refused() -> None:
    message = failure(build.make_big_docx(3 * MIB), "photo.docx", max_docx_uncompressed_bytes=2 * MIB)
    assert message == (
        "This Word document is too large once unpacked (over 2 MB); please upload a smaller document."
    )


def test_lying_zip_headers_never_inflate_past_the_declared_size() -> None:
    data = build.make_lying_zip_bomb(uncompressed_bytes=64 * MIB, declared_bytes=1000)
    tracemalloc.start()
    try:
        message = failure(data, "liar.docx")
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert message == messages.DOCX_CORRUPT
    assert peak_bytes < 8 * MIB


def test_bounded_inflation_stops_past_the_limit(zip_bomb: bytes) -> None:
    archive = zipfile.ZipFile(io.BytesIO(zip_bomb))  # honest headers: 200 MiB of zeros
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(DocumentError, match="too large once unpacked"):
            inflate_bounded(archive, 10 * MIB)
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - started < 0.5  # stopped near 10 MiB, did not inflate 200
    assert peak_bytes < 4 * MIB
    small = zipfile.ZipFile(io.BytesIO(build.make_zip({"a": b"x" * 5000, "b": b"y" * 7})))
    assert inflate_bounded(small, 10 * MIB) == 5007


@pytest.mark.parametrize(
    ("data", "filename", "expected"),
    [
        (build.random_bytes(), "report.pdf", "'report.pdf' is named like a PDF but is not a valid PDF file"),
        (build.random_bytes(), "report.docx", "'report.docx' is named like a Word document but is not"),
        (build.random_bytes(), "blob.bin", "'blob.bin' is not a text document we can read"),
        (build.png_bytes(), "photo.pdf", "'photo.pdf' is a PNG image, not a text document we can read"),
        (b"\xff\xd8\xff\xe0" + bytes(100), "p.txt", "'p.txt' is a JPEG image, not a text document"),
        (b"GIF89a" + bytes(100), "a.md", "'a.md' is a GIF image, not a text document"),
        (b"\x7fELF\x02\x01\x01" + bytes(100), "run.txt", "'run.txt' is a program (ELF executable), not"),
        (b"\x1f\x8b\x08\x00" + bytes(100), "logs.txt", "'logs.txt' is a gzip archive, not"),
        (build.make_zip({"notes.txt": b"hi"}), "notes.zip", "'notes.zip' is a ZIP archive, not"),
        (build.make_zip({"xl/workbook.xml": b"<w/>"}), "sheet.xlsx", "'sheet.xlsx' is an Excel workbook"),
        (build.make_zip({"a.txt": b"hi"}), "fake.docx", "'fake.docx' is named like a Word document"),
    ],
)
def test_unreadable_formats_are_named_in_the_message(data: bytes, filename: str, expected: str) -> None:
    assert failure(data, filename).startswith(expected)


def test_old_office_files_are_refused() -> None:
    ole2 = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(500)
    assert failure(ole2, "old.doc") == messages.LEGACY_OFFICE
    assert failure(ole2, "protected.docx") == messages.DOCX_PROTECTED


def test_empty_and_blank_files_are_refused() -> None:
    assert failure(b"", "empty.txt") == "'empty.txt' is empty; please upload a file with some text in it."
    assert failure(b" \n\t\r\n ", "blank.md") == "'blank.md' contains no text to read."
    assert failure(b"<html><script>x()</script></html>", "s.html") == "'s.html' contains no text to read."


def test_every_bad_file_gets_a_different_message(zip_bomb: bytes) -> None:
    cases = [
        (build.make_encrypted_pdf(PARAGRAPHS), "a.pdf"),
        (build.make_scanned_pdf(), "a.pdf"),
        (build.make_corrupt_pdf(), "a.pdf"),
        (build.make_corrupt_docx(), "a.docx"),
        (zip_bomb, "a.docx"),
        (build.make_big_docx(3 * MIB), "a.docx"),
        (build.random_bytes(), "a.pdf"),
        (build.random_bytes(), "a.bin"),
        (build.png_bytes(), "a.pdf"),
        (b"", "a.txt"),
        (b"   ", "a.txt"),
    ]
    messages = [failure(data, name, max_docx_uncompressed_bytes=2 * MIB) for data, name in cases]
    assert len(set(messages)) == len(cases), messages
    assert all(message.endswith(".") and len(message) < 200 for message in messages)


# tests/system/documents/test_documents_server.py's bad uploads: (name, content, words in the message)
BAD_UPLOADS = [
    ("blank.txt", lambda: b" \n\t \n", "contains no text"),
    ("photo.pdf", build.png_bytes, "PNG image"),
    ("noise.pdf", lambda: build.random_bytes(8192), "not a valid PDF"),
    ("locked.pdf", lambda: build.make_encrypted_pdf(["secret plans"]), "password-protected"),
    ("scan.pdf", build.make_scanned_pdf, "no text layer"),
    ("broken.docx", build.make_corrupt_docx, "damaged"),
    ("bomb.docx", lambda: build.make_docx_zip_bomb(200 * MIB), "suspiciously heavily"),
]


@pytest.mark.asyncio
@pytest.mark.parametrize(("name", "make", "words"), BAD_UPLOADS, ids=[upload[0] for upload in BAD_UPLOADS])
async def test_a_bad_upload_is_refused_with_its_message(tmp_path: Path, name: str, make, words: str) -> None:
    """What the chat service does with an upload (`Attachments.attach`, with the tiny server's
    settings): the error the page shows names the file and what is wrong with it, nothing becomes the
    session's document, and the uploaded file is deleted."""
    upload = tmp_path / "upload"
    upload.write_bytes(make())
    settings = Settings.from_env({"MAX_UPLOAD_BYTES": str(TINY_MAX_UPLOAD_BYTES)})
    session = ChatSession("tab", SamplingSettings(0.2, 0.9, 16), "system", deque())
    result = await Attachments(None, settings).attach(session, [(str(upload), name)])  # type: ignore[arg-type]
    [error] = result.errors
    assert error.startswith(f"**{name}**: ") and words in error, error
    assert result.document is None and session.document is None
    assert not upload.exists()


# --- chunking ---------------------------------------------------------------------
def word_count(text: str) -> int:
    return len(text.split())


def test_chunks_respect_the_limit_keep_order_and_lose_no_words() -> None:
    text = build.long_document(5000, seed=2)
    chunks = split_into_chunks(text, word_count, 200)
    assert all(0 < word_count(chunk) <= 200 for chunk in chunks)
    assert words(" ".join(chunks)) == words(text)
    assert sum(map(word_count, chunks)) / len(chunks) > 120, "greedy packing should fill chunks"


def test_chunks_break_at_paragraphs_when_paragraphs_fit() -> None:
    text = build.long_document(3000, seed=3)
    paragraphs = text.split("\n\n")
    chunks = split_into_chunks(text, word_count, 250)
    assert [p for chunk in chunks for p in chunk.split("\n\n")] == paragraphs


def test_long_paragraph_splits_at_sentences_then_words() -> None:
    sentences = [f"Sentence {n} " + "word " * 27 + "end." for n in range(10)]  # 30 words each
    chunks = split_into_chunks(" ".join(sentences), word_count, 70)
    assert all(word_count(chunk) <= 70 for chunk in chunks)
    assert all(chunk.endswith("end.") for chunk in chunks)
    assert [len(chunk.split("end.")) - 1 for chunk in chunks] == [2, 2, 2, 2, 2]
    one_sentence = "word " * 500
    chunks = split_into_chunks(one_sentence, word_count, 60)
    assert [word_count(chunk) for chunk in chunks] == [60] * 8 + [20]


def test_giant_word_is_cut_into_fitting_slices() -> None:
    def four_chars_per_token(text: str) -> int:
        return (len(text) + 3) // 4

    calls = 0

    def counted(text: str) -> int:
        nonlocal calls
        calls += 1
        return four_chars_per_token(text)

    blob = "QmFzZTY0" * 2500  # 20,000 characters, no spaces
    chunks = split_into_chunks(f"Intro line.\n\n{blob}\n\nOutro line.", counted, 100)
    assert calls < 20 * len(chunks), "each slice should be found by a short search"
    assert all(four_chars_per_token(chunk) <= 100 for chunk in chunks)
    assert chunks[0] == "Intro line." and chunks[-1] == "Outro line."
    assert "".join(chunks[1:-1]) == blob
    assert [len(chunk) for chunk in chunks[1:-1]] == [400] * 50, "slices should be as long as fits"


def test_limit_holds_when_tokens_of_a_chunk_exceed_the_sum_of_its_pieces() -> None:
    def merging(text: str) -> int:  # superadditive: the whole costs more than its parts
        n = len(text.split())
        return n + n // 10

    text = build.long_document(4000, seed=4)
    chunks = split_into_chunks(text, merging, 100)
    assert all(merging(chunk) <= 100 for chunk in chunks)
    assert words(" ".join(chunks)) == words(text)


def test_hundred_thousand_words_chunk_in_linear_time() -> None:
    text = build.long_document(100_000, seed=5)
    counted_chars = 0

    def counting(text: str) -> int:
        nonlocal counted_chars
        counted_chars += len(text)
        return len(text.split())

    started = time.perf_counter()
    chunks = split_into_chunks(text, counting, 500)
    elapsed_seconds = time.perf_counter() - started
    assert elapsed_seconds < 3.0, "0.02 s, 0.3 s at worst here with a core busy elsewhere"
    assert counted_chars <= 2.1 * len(text), "each piece and each chunk should be counted about once"
    assert words(" ".join(chunks)) == words(text)


def test_chunking_edge_cases() -> None:
    assert split_into_chunks("", word_count, 10) == []
    assert split_into_chunks(" \n\n \n", word_count, 10) == []
    assert split_into_chunks("one two", word_count, 10) == ["one two"]
    with pytest.raises(ValueError):
        split_into_chunks("text", word_count, 0)
    with pytest.raises(ValueError, match="cannot hold even one character"):
        split_into_chunks("abc", lambda text: 2 * len(text), 1)


# --- ranking ----------------------------------------------------------------------
def test_ranking_finds_the_chunk_with_the_rare_words() -> None:
    chunks = split_into_chunks(build.long_document(6000, seed=6), word_count, 200)
    chunks.insert(7, "The zeppelin hangar near Reykjavik was repainted in green last winter.")
    assert rank_chunks(chunks, "What colour is the zeppelin hangar?", top_k=1) == [7]
    top = rank_chunks(chunks, "Which zeppelin hangar was repainted?", top_k=4)
    assert 7 in top and top == sorted(top) and len(top) == 4
    assert rank_chunks(chunks, "Which zeppelin hangar was repainted?", top_k=4) == top


def test_ranking_returns_document_order() -> None:
    chunks = ["alpha beta", "gamma delta", "zeta theta", "kappa beta", "omega"]
    assert rank_chunks(chunks, "omega kappa", top_k=2) == [3, 4]


def test_ranking_breaks_bm25_ties_by_word_overlap() -> None:
    # In a two-chunk corpus BM25's idf is 0 for every word: overlap must decide.
    assert rank_chunks(["apples and pears", "the zeppelin hangar"], "zeppelin?", top_k=1) == [1]


def test_ranking_edge_cases() -> None:
    chunks = ["a b", "c d", "e f"]
    assert rank_chunks([], "anything", top_k=3) == []
    assert rank_chunks(chunks, "c", top_k=0) == []
    assert rank_chunks(chunks, "c", top_k=5) == [0, 1, 2]
    assert rank_chunks(chunks, "?!", top_k=2) == [0, 1]


# --- summary cache ----------------------------------------------------------------
def test_summary_key_depends_on_text_and_settings() -> None:
    key = summary_key("some text", "model=a;temp=0.2")
    assert len(key) == 64 and int(key, 16) >= 0
    assert key == summary_key("some text", "model=a;temp=0.2")
    assert key != summary_key("some text!", "model=a;temp=0.2")
    assert key != summary_key("some text", "model=b;temp=0.2")
    assert summary_key("bc", "a") != summary_key("c", "ab")


def test_cache_keeps_at_most_max_entries_dropping_the_oldest() -> None:
    cache = SummaryCache(max_entries=3, max_bytes=10_000, ttl_seconds=60)
    for n in range(5):
        assert cache.put(f"k{n}", f"summary {n}")
    assert len(cache) == 3
    assert cache.get("k0") is None and cache.get("k1") is None
    assert [cache.get(f"k{n}") for n in (2, 3, 4)] == ["summary 2", "summary 3", "summary 4"]


def test_cache_keeps_at_most_max_bytes_of_utf8() -> None:
    cache = SummaryCache(max_entries=100, max_bytes=100, ttl_seconds=60)
    for n in range(4):
        cache.put(f"k{n}", "x" * 40)
    assert len(cache) == 2 and cache.size_bytes == 80
    cache = SummaryCache(max_entries=100, max_bytes=100, ttl_seconds=60)
    cache.put("a", "é" * 30)  # 60 UTF-8 bytes, 30 characters
    cache.put("b", "é" * 30)
    assert len(cache) == 1 and cache.get("b") == "é" * 30 and cache.size_bytes == 60


def test_cache_skips_a_summary_larger_than_max_bytes() -> None:
    cache = SummaryCache(max_entries=10, max_bytes=50, ttl_seconds=60)
    cache.put("small", "fits")
    assert cache.put("big", "y" * 51) is False
    assert cache.get("big") is None and cache.get("small") == "fits"


def test_cache_entries_expire_after_ttl() -> None:
    timer = FakeClock()
    cache = SummaryCache(max_entries=10, max_bytes=1000, ttl_seconds=30, timer=timer)
    cache.put("k", "summary")
    timer.now += 29
    assert cache.get("k") == "summary"
    timer.now += 2
    assert cache.get("k") is None
    assert len(cache) == 0 and cache.size_bytes == 0


def test_the_reduce_step_reads_each_sentence_once_without_part_labels() -> None:
    partials = [
        "This document is part of a longer document. It explains how triggers are declared.",
        "This document is part of a longer document. It explains how triggers are activated by dpkg.",
        "This document is part of a longer document.",
        "Cycles between triggers are detected and reported.",
    ]
    assert without_repeated_sentences(partials) == [
        "This document is part of a longer document. It explains how triggers are declared.",
        "It explains how triggers are activated by dpkg.",
        "Cycles between triggers are detected and reported.",
    ], "a sentence seen before is dropped; a part left with nothing is dropped too"
    prompt = SummaryPrompts("en", "").reduce("You are helpful.", partials)[-1]["content"]
    assert "Part 1" not in prompt and prompt.count("part of a longer document") == 1
    assert without_repeated_sentences(["Same.", "Same."]) == ["Same."]
