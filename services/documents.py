"""Uploaded documents as plain text: safe extraction, token-bounded chunks, ranking, summary cache.

Pure logic, no engine: every function here is safe on hostile input (zip bombs,
lying headers, binary files named like documents) and turns each failure into a
`DocumentError` whose text is the one sentence the user sees.
"""

from __future__ import annotations

import codecs
import hashlib
import io
import logging
import re
import threading
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from html.parser import HTMLParser

import docx
from cachetools import TTLCache
from docx.table import Table
from docx.text.paragraph import Paragraph
from pypdf import PasswordType, PdfReader
from rank_bm25 import BM25Okapi

logger = logging.getLogger(__name__)

KINDS = ("pdf", "docx", "html", "markdown", "text")
SUPPORTED = "a PDF, Word (.docx), HTML, Markdown or plain-text file"
HTML_EXTENSIONS = (".html", ".htm", ".xhtml")
MARKDOWN_EXTENSIONS = (".md", ".markdown", ".mdown", ".mkd")
PDF_MAGIC_WINDOW_BYTES = 1024  # the PDF spec tolerates junk before "%PDF-"; readers look this far
SNIFF_WINDOW_BYTES = 64 * 1024  # how much of a text file is inspected for binary content
MIN_LEGACY_COHERENCE = 0.1  # charset-normalizer's language fit; junk bytes score ~0
COMMON_ENCODINGS = ("cp1252", "cp1251", "cp1250", "latin_1", "koi8_r", "cp1253", "cp1254", "cp1256", "cp1257")
MAX_CONTROL_CHAR_SHARE = 0.1  # more replacement/control characters than this = not text
MAX_DOCX_MEMBERS = 5000  # real .docx files hold tens of parts
MAX_DOCX_COMPRESSION_RATIO = 100  # deflated XML is ~5-20x; zeros compress ~1000x
DOCX_RATIO_CHECK_MIN_BYTES = 1024 * 1024  # tiny members may compress well without being bombs
INFLATE_CHUNK_BYTES = 64 * 1024
MIB = 1024 * 1024


class DocumentError(ValueError):
    """A file cannot be turned into text; str() is the short sentence shown to the user."""


@dataclass(frozen=True)
class Document:
    """Text of one uploaded file and what the user should be told about it."""

    name: str
    kind: str  # one of KINDS
    text: str
    notes: tuple[str, ...] = ()


# --- user-facing messages: one per failure ------------------------------------
def _empty(name: str) -> str:
    return f"'{name}' is empty; please upload a file with some text in it."


def _no_text(name: str) -> str:
    return f"'{name}' contains no text to read."


def _binary(name: str, what: str) -> str:
    return f"'{name}' is {what}, not a text document we can read; please upload {SUPPORTED}."


def _unknown_binary(name: str) -> str:
    return f"'{name}' is not a text document we can read (it holds binary data); please upload {SUPPORTED}."


def _not_a_pdf(name: str) -> str:
    return f"'{name}' is named like a PDF but is not a valid PDF file; please upload the original PDF."


def _not_a_docx(name: str) -> str:
    return f"'{name}' is named like a Word document but is not a valid .docx file."


PDF_ENCRYPTED = "This PDF is password-protected; please upload an unprotected copy."
PDF_SCANNED = (
    "This PDF has no text layer (it looks like a scan) and OCR is not supported; "
    "please upload a PDF with selectable text."
)
PDF_CORRUPT = "This PDF is damaged and could not be read; please re-save or re-export it and try again."
DOCX_CORRUPT = "This Word document is damaged and could not be read; please re-save it and try again."
DOCX_BOMB = "This Word document is compressed suspiciously heavily and was rejected as unsafe."
DOCX_PROTECTED = (
    "This Word document is password-protected or in the old .doc format; "
    "please upload an unprotected .docx or PDF copy."
)
LEGACY_OFFICE = "This is an old-format Office file (.doc, .xls, .ppt); please save it as .docx or PDF first."
HTML_CORRUPT = "This HTML file could not be read; please upload it as plain text or PDF."
NOTE_REPLACED_BYTES = "Some bytes were not valid UTF-8 and were replaced with �."
NOTE_LEGACY_ENCODING = "The file is not UTF-8; it was read as {encoding}."


def _docx_too_big(max_bytes: int) -> str:
    return (
        f"This Word document is too large once unpacked (over {_megabytes(max_bytes)} MB); "
        "please upload a smaller document."
    )


def _megabytes(size_bytes: int) -> str:
    return f"{size_bytes / MIB:.1f}".removesuffix(".0")


# --- sniffing -------------------------------------------------------------------
_OLE2_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
_BINARY_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF87a", "a GIF image"),
    (b"GIF89a", "a GIF image"),
    (b"II*\x00", "a TIFF image"),
    (b"MM\x00*", "a TIFF image"),
    (b"\x1f\x8b", "a gzip archive"),
    (b"\xfd7zXZ\x00", "an xz archive"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"),
    (b"Rar!\x1a\x07", "a RAR archive"),
    (b"\x7fELF", "a program (ELF executable)"),
    (b"ID3", "an MP3 audio file"),
)


def _binary_kind(data: bytes) -> str | None:
    """What a known non-document binary format is, from its magic bytes."""
    for magic, what in _BINARY_MAGIC:
        if data.startswith(magic):
            return what
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "a WebP image"
    if data[4:8] == b"ftyp":
        return "a video or audio file"
    if data[:3] == b"BZh" and data[4:10] == b"1AY&SY":
        return "a bzip2 archive"
    if data[:2] == b"MZ" and b"\x00" in data[:1024]:
        return "a program (Windows executable)"
    return None


def _base_name(filename: str) -> str:
    return filename.replace("\\", "/").rsplit("/", 1)[-1] or "file"


def _extension(filename: str) -> str:
    name = _base_name(filename).lower()
    return name[name.rfind(".") :] if "." in name else ""


def _zip_kind(data: bytes, name: str, extension: str) -> str:
    """'docx' for a Word zip; raise for other zips (a damaged one named .docx is still 'docx')."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = set(archive.namelist()[:MAX_DOCX_MEMBERS])
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError):
        if extension == ".docx":
            return "docx"  # extraction reports it as damaged
        raise DocumentError(_binary(name, "a damaged ZIP archive")) from None
    if "word/document.xml" in names:
        return "docx"
    if extension == ".docx":
        raise DocumentError(_not_a_docx(name))
    if "xl/workbook.xml" in names:
        raise DocumentError(_binary(name, "an Excel workbook"))
    if "ppt/presentation.xml" in names:
        raise DocumentError(_binary(name, "a PowerPoint presentation"))
    raise DocumentError(_binary(name, "a ZIP archive"))


def _looks_binary(data: bytes) -> bool:
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
    return controls > limit or _legacy_encoding(sample) is None


def _has_utf16_bom(data: bytes) -> bool:
    return data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))


def sniff_kind(data: bytes, filename: str) -> str:
    """The document kind by content (magic bytes); the extension only picks text/markdown/html.

    Raises DocumentError for empty files and for formats we cannot read.
    """
    name = _base_name(filename)
    extension = _extension(filename)
    if not data:
        raise DocumentError(_empty(name))
    if b"%PDF-" in data[:PDF_MAGIC_WINDOW_BYTES]:
        return "pdf"
    if data.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return _zip_kind(data, name, extension)
    if data.startswith(_OLE2_MAGIC):
        raise DocumentError(DOCX_PROTECTED if extension == ".docx" else LEGACY_OFFICE)
    what = _binary_kind(data)
    if what is not None:
        raise DocumentError(_binary(name, what))
    if not _has_utf16_bom(data) and _looks_binary(data):
        if extension == ".pdf":
            raise DocumentError(_not_a_pdf(name))
        if extension == ".docx":
            raise DocumentError(_not_a_docx(name))
        raise DocumentError(_unknown_binary(name))
    head = data[:512].decode("utf-8", errors="replace").lstrip("\ufeff \t\r\n").lower()
    if head.startswith(("<!doctype html", "<html")) or extension in HTML_EXTENSIONS:
        return "html"
    if extension in MARKDOWN_EXTENSIONS:
        return "markdown"
    return "text"


# --- extraction -----------------------------------------------------------------
def extract_document(
    data: bytes, filename: str, *, max_pages: int, max_docx_uncompressed_bytes: int, max_chars: int
) -> Document:
    """Plain text of an uploaded file, or DocumentError with the sentence to show the user."""
    name = _base_name(filename)
    kind = sniff_kind(data, filename)
    notes: list[str] = []
    if kind == "pdf":
        text = _pdf_text(data, max_pages, max_chars, notes)
    elif kind == "docx":
        text = _docx_text(data, max_docx_uncompressed_bytes)
    else:
        text = _decode_text(data, notes)
        if kind == "html":
            text = _html_text(text)
    text = _normalise(text)
    if not text:
        raise DocumentError(_no_text(name))
    if len(text) > max_chars:
        text = text[:max_chars].rstrip()
        notes.append(f"The document is long: only its first {max_chars:,} characters were read.")
    return Document(name=name, kind=kind, text=text, notes=tuple(notes))


def _normalise(text: str) -> str:
    """Unix newlines, no trailing spaces, at most one blank line in a row."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    lines = [line.rstrip() for line in text.split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def _decode_text(data: bytes, notes: list[str]) -> str:
    """UTF-16 (by BOM) or UTF-8; a file with no UTF-8 beyond ASCII is read in its detected 8-bit encoding."""
    encoding = "utf-16" if _has_utf16_bom(data) else "utf-8-sig"  # utf-8-sig strips a BOM
    try:
        return data.decode(encoding)
    except UnicodeDecodeError:
        text = data.decode(encoding, errors="replace")
    if encoding != "utf-16" and not any(ord(c) > 127 and c != "\ufffd" for c in text):
        legacy = _legacy_encoding(data)  # e.g. cp1251 from an old Windows machine
        if legacy is not None:
            notes.append(NOTE_LEGACY_ENCODING.format(encoding=legacy))
            return data.decode(legacy, errors="replace")
    notes.append(NOTE_REPLACED_BYTES)  # UTF-8 with a few broken bytes
    return text


def _legacy_encoding(data: bytes) -> str | None:
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


def _pdf_text(data: bytes, max_pages: int, max_chars: int, notes: list[str]) -> str:
    # pypdf raises many exception types on damaged input; any of them means "damaged".
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            _decrypt_with_empty_password(reader)
        total_pages = len(reader.pages)
        texts: list[str] = []
        chars = 0
        empty_pages = 0
        for page in reader.pages[:max_pages]:
            text = (page.extract_text() or "").strip()
            empty_pages += not text
            texts.append(text)
            chars += len(text)
            if chars > max_chars:
                break
    except DocumentError:
        raise
    except Exception as error:
        logger.info("unreadable PDF: %s: %s", type(error).__name__, error)
        raise DocumentError(PDF_CORRUPT) from error
    if not any(texts):
        raise DocumentError(PDF_SCANNED if total_pages else PDF_CORRUPT)
    if len(texts) < total_pages:
        notes.append(f"Only the first {len(texts)} of {total_pages} pages were read.")
    if empty_pages:
        notes.append(f"{empty_pages} page(s) had no text layer (scanned?) and were skipped.")
    return "\n\n".join(text for text in texts if text)


def _decrypt_with_empty_password(reader: PdfReader) -> None:
    """PDFs with only an owner password open with an empty user password."""
    try:
        result = reader.decrypt("")
    except Exception as error:  # unsupported algorithm, missing crypto backend
        logger.info("PDF decryption failed: %s: %s", type(error).__name__, error)
        raise DocumentError(PDF_ENCRYPTED) from error
    if result == PasswordType.NOT_DECRYPTED:
        raise DocumentError(PDF_ENCRYPTED)


def _docx_text(data: bytes, max_uncompressed_bytes: int) -> str:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as error:
        raise DocumentError(DOCX_CORRUPT) from error
    with archive:
        check_zip_sizes(archive, max_uncompressed_bytes)
        inflate_bounded(archive, max_uncompressed_bytes)
    # The archive really inflates to at most the limit, so python-docx may now read it.
    try:
        document = docx.Document(io.BytesIO(data))
        return "\n\n".join(_block_texts(document))
    except Exception as error:  # python-docx/lxml raise many types on damaged parts
        logger.info("unreadable docx: %s: %s", type(error).__name__, error)
        raise DocumentError(DOCX_CORRUPT) from error


def check_zip_sizes(archive: zipfile.ZipFile, max_uncompressed_bytes: int) -> None:
    """Reject zips whose headers declare a bomb: too many members, huge ratio or total."""
    members = archive.infolist()
    if len(members) > MAX_DOCX_MEMBERS:
        raise DocumentError(DOCX_BOMB)
    for info in members:
        if info.flag_bits & 0x1:
            raise DocumentError(DOCX_PROTECTED)
        ratio = info.file_size / max(info.compress_size, 1)
        if info.file_size >= DOCX_RATIO_CHECK_MIN_BYTES and ratio > MAX_DOCX_COMPRESSION_RATIO:
            raise DocumentError(DOCX_BOMB)
    if sum(info.file_size for info in members) > max_uncompressed_bytes:
        raise DocumentError(_docx_too_big(max_uncompressed_bytes))


def inflate_bounded(archive: zipfile.ZipFile, max_uncompressed_bytes: int) -> int:
    """Inflate every member in chunks, stopping past the limit whatever the headers say.

    Returns the real uncompressed size; also verifies CRCs (damaged -> DocumentError).
    """
    total_bytes = 0
    try:
        for info in archive.infolist():
            if info.is_dir():
                continue
            with archive.open(info) as member:
                while chunk := member.read(INFLATE_CHUNK_BYTES):
                    total_bytes += len(chunk)
                    if total_bytes > max_uncompressed_bytes:
                        raise DocumentError(_docx_too_big(max_uncompressed_bytes))
    except DocumentError:
        raise
    except Exception as error:  # bad CRC, truncated data, unsupported compression
        logger.info("damaged docx zip: %s: %s", type(error).__name__, error)
        raise DocumentError(DOCX_CORRUPT) from error
    return total_bytes


def _block_texts(container: object) -> list[str]:
    """Paragraph texts and table rows (cells joined by ' | ') in document order."""
    texts: list[str] = []
    for block in container.iter_inner_content():  # type: ignore[attr-defined]
        if isinstance(block, Paragraph):
            texts.append(block.text)
        elif isinstance(block, Table):
            for row in block.rows:
                seen: set[int] = set()
                cells: list[str] = []
                for cell in row.cells:
                    if id(cell._tc) in seen:  # a merged cell repeats in row.cells
                        continue
                    seen.add(id(cell._tc))
                    cell_text = " ".join(" ".join(_block_texts(cell)).split())
                    if cell_text:
                        cells.append(cell_text)
                texts.append(" | ".join(cells))
    return texts


_SKIPPED_TAGS = frozenset({"script", "style", "noscript", "template", "svg", "iframe", "object"})
_BLOCK_TAGS = frozenset(
    {
        "address", "article", "aside", "blockquote", "br", "dd", "div", "dl", "dt", "fieldset",
        "figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6", "header",
        "hr", "li", "main", "nav", "ol", "p", "pre", "section", "table", "tbody",
        "thead", "title", "tr", "ul",
    }
)  # fmt: skip


class _HTMLText(HTMLParser):
    """Collects visible text; script/style dropped, block elements become line breaks."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip_depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIPPED_TAGS:
            self._skip_depth += 1
        elif tag in _BLOCK_TAGS:
            self.parts.append("\n")
        elif tag in ("td", "th"):
            self.parts.append(" ")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _BLOCK_TAGS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIPPED_TAGS:
            self._skip_depth = max(0, self._skip_depth - 1)
        elif tag in _BLOCK_TAGS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skip_depth:
            self.parts.append(data)


def _html_text(markup: str) -> str:
    parser = _HTMLText()
    try:
        parser.feed(markup)
        parser.close()
    except Exception as error:  # html.parser is lenient; this is a last resort
        raise DocumentError(HTML_CORRUPT) from error
    lines = (" ".join(line.split()) for line in "".join(parser.parts).split("\n"))
    return "\n\n".join(line for line in lines if line)


# --- chunking -------------------------------------------------------------------
_PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n\s*")
_SENTENCE_BREAK = re.compile(r"(?<=[.!?…。！？])\s+|(?<=[.!?][\"'”’)\]])\s+")
_JOINERS = ("\n\n", "\n", " ", "")
_Piece = tuple[str, int, str]  # text, tokens, joiner placed before it inside a chunk


def split_into_chunks(text: str, count_tokens: Callable[[str], int], max_tokens_per_chunk: int) -> list[str]:
    """Split `text` into chunks of at most `max_tokens_per_chunk` tokens each, in order.

    Paragraphs first, then lines, sentences, words (and characters for a giant word);
    whitespace between pieces is normalised, no other text is lost. Pieces are
    counted once and summed; each chunk is verified once and re-split if the sum lied.
    """
    if max_tokens_per_chunk < 1:
        raise ValueError("max_tokens_per_chunk must be at least 1")
    pieces: list[_Piece] = []
    for paragraph in _PARAGRAPH_BREAK.split(text):
        paragraph = paragraph.strip()
        if paragraph:
            pieces.extend(_pieces_of(paragraph, "\n\n", count_tokens, max_tokens_per_chunk))
    joiner_tokens = {joiner: count_tokens(joiner) for joiner in _JOINERS}
    chunks: list[str] = []
    for group in _pack(pieces, max_tokens_per_chunk, joiner_tokens):
        chunks.extend(
            _verified(group, count_tokens, max_tokens_per_chunk, max_tokens_per_chunk, joiner_tokens)
        )
    return chunks


def _split_lines(text: str) -> list[str]:
    return [line.strip() for line in text.split("\n") if line.strip()]


def _split_sentences(text: str) -> list[str]:
    return [sentence for sentence in _SENTENCE_BREAK.split(text) if sentence]


_SPLITTERS: tuple[tuple[Callable[[str], list[str]], str], ...] = (
    (_split_lines, "\n"),
    (_split_sentences, " "),
    (str.split, " "),
)


def _pieces_of(
    text: str, joiner: str, count_tokens: Callable[[str], int], limit: int, level: int = 0
) -> list[_Piece]:
    """`text` as pieces of at most `limit` tokens, splitting ever finer only where needed."""
    tokens = count_tokens(text)
    if tokens <= limit:
        return [(text, tokens, joiner)]
    for depth in range(level, len(_SPLITTERS)):
        splitter, inner_joiner = _SPLITTERS[depth]
        parts = splitter(text)
        if len(parts) > 1:
            pieces: list[_Piece] = []
            for index, part in enumerate(parts):
                part_joiner = joiner if index == 0 else inner_joiner
                pieces.extend(_pieces_of(part, part_joiner, count_tokens, limit, depth + 1))
            return pieces
    return _split_characters(text, joiner, count_tokens, limit)


def _split_characters(word: str, joiner: str, count_tokens: Callable[[str], int], limit: int) -> list[_Piece]:
    """A giant 'word' (base64, a URL) cut into the longest slices that fit, found by search."""
    pieces: list[_Piece] = []
    start = 0
    while start < len(word):
        remaining = len(word) - start
        good, bad = 0, min(max(limit, 1), remaining)
        while count_tokens(word[start : start + bad]) <= limit:  # grow until too long or done
            good = bad
            if bad == remaining:
                break
            bad = min(bad * 2, remaining)
        if good < bad and good != remaining:
            while bad - good > 1:  # largest fitting length lies in (good, bad)
                middle = (good + bad) // 2
                if count_tokens(word[start : start + middle]) <= limit:
                    good = middle
                else:
                    bad = middle
        if good == 0:
            raise ValueError(f"max_tokens_per_chunk={limit} cannot hold even one character")
        piece = word[start : start + good]
        pieces.append((piece, count_tokens(piece), joiner if start == 0 else ""))
        start += good
    return pieces


def _pack(pieces: list[_Piece], budget: int, joiner_tokens: dict[str, int]) -> list[list[_Piece]]:
    """Greedy packing by summed token counts, order preserved."""
    groups: list[list[_Piece]] = []
    current: list[_Piece] = []
    total = 0
    for piece in pieces:
        added = piece[1] + (joiner_tokens[piece[2]] if current else 0)
        if current and total + added > budget:
            groups.append(current)
            current, total, added = [], 0, piece[1]
        current.append(piece)
        total += added
    if current:
        groups.append(current)
    return groups


def _render(group: list[_Piece]) -> str:
    return group[0][0] + "".join(joiner + text for text, _tokens, joiner in group[1:])


def _verified(
    group: list[_Piece],
    count_tokens: Callable[[str], int],
    limit: int,
    budget: int,
    joiner_tokens: dict[str, int],
) -> list[str]:
    """The group's text if it really fits; else repack it with a smaller budget (tokenizers merge)."""
    text = _render(group)
    if len(group) == 1:
        return [text]
    actual = count_tokens(text)
    if actual <= limit:
        return [text]
    smaller = min(budget - 1, budget * limit // actual)
    chunks: list[str] = []
    for subgroup in _pack(group, max(smaller, 1), joiner_tokens):
        chunks.extend(_verified(subgroup, count_tokens, limit, max(smaller, 1), joiner_tokens))
    return chunks


# --- ranking --------------------------------------------------------------------
_WORD = re.compile(r"\w+")


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def rank_chunks(chunks: list[str], question: str, top_k: int) -> list[int]:
    """Indices of the `top_k` chunks most relevant to `question` (BM25), in document order."""
    if top_k <= 0 or not chunks:
        return []
    if top_k >= len(chunks):
        return list(range(len(chunks)))
    corpus = [_words(chunk) for chunk in chunks]
    query = _words(question)
    if not query or not any(corpus):
        return list(range(top_k))
    scores = BM25Okapi(corpus).get_scores(query)
    wanted = set(query)
    # BM25's idf is 0 for a word in half of a tiny corpus: raw overlap breaks such ties.
    overlap = [sum(word in wanted for word in words) for words in corpus]
    best = sorted(range(len(chunks)), key=lambda index: (-scores[index], -overlap[index], index))
    return sorted(best[:top_k])


# --- summary cache --------------------------------------------------------------
def summary_key(text: str, settings_fingerprint: str) -> str:
    """Cache key of a summary: sha256 of the settings fingerprint and the text."""
    digest = hashlib.sha256()
    fingerprint = settings_fingerprint.encode("utf-8", errors="surrogatepass")
    digest.update(len(fingerprint).to_bytes(8, "big") + fingerprint)
    digest.update(text.encode("utf-8", errors="surrogatepass"))
    return digest.hexdigest()


def _utf8_size(summary: str) -> int:
    return len(summary.encode("utf-8", errors="surrogatepass"))


class SummaryCache:
    """Summaries by `summary_key`, bounded by entries, total UTF-8 bytes and age."""

    def __init__(
        self,
        max_entries: int,
        max_bytes: int,
        ttl_seconds: float,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_entries < 1 or max_bytes < 1 or ttl_seconds <= 0:
            raise ValueError("SummaryCache limits must be positive")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._cache: TTLCache[str, str] = TTLCache(
            maxsize=max_bytes, ttl=ttl_seconds, timer=timer, getsizeof=_utf8_size
        )
        self._lock = threading.Lock()

    def get(self, key: str) -> str | None:
        with self._lock:
            return self._cache.get(key)

    def put(self, key: str, summary: str) -> bool:
        """Store a summary; False (not cached) when it alone is larger than max_bytes."""
        if _utf8_size(summary) > self.max_bytes:
            return False
        with self._lock:
            self._cache[key] = summary
            while len(self._cache) > self.max_entries:
                self._cache.popitem()  # least recently used first
        return True

    @property
    def size_bytes(self) -> int:
        with self._lock:
            self._cache.expire()
            return int(self._cache.currsize)

    def __len__(self) -> int:
        with self._lock:
            self._cache.expire()
            return len(self._cache)

    def clear(self) -> None:
        with self._lock:
            self._cache.clear()
