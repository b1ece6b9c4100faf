"""Uploaded documents as plain text, safe on hostile input.

Every function here is pure logic, safe on hostile input (zip bombs, lying
headers, binary files named like documents), and turns each failure into a
`DocumentError` whose text is the one sentence the user sees.
"""

from __future__ import annotations

import io
import logging
import re
from dataclasses import dataclass
from html.parser import HTMLParser

from pypdf import PasswordType, PdfReader

from services.documents.encoding import decode_text
from services.documents.errors import (
    HTML_CORRUPT,
    PDF_CORRUPT,
    PDF_ENCRYPTED,
    PDF_SCANNED,
    DocumentError,
    no_text_message,
)
from services.documents.sniff import base_name, sniff_kind
from services.documents.word import docx_text

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Document:
    """Text of one uploaded file and what the user should be told about it."""

    name: str
    kind: str  # one of KINDS
    text: str
    notes: tuple[str, ...] = ()


# --- extraction -----------------------------------------------------------------
def extract_document(
    data: bytes, filename: str, *, max_pages: int, max_docx_uncompressed_bytes: int, max_chars: int
) -> Document:
    """Plain text of an uploaded file, or DocumentError with the sentence to show the user."""
    name = base_name(filename)
    kind = sniff_kind(data, filename)
    notes: list[str] = []
    if kind == "pdf":
        text = _pdf_text(data, max_pages, max_chars, notes)
    elif kind == "docx":
        text = docx_text(data, max_docx_uncompressed_bytes)
    else:
        text = decode_text(data, notes)
        if kind == "html":
            text = _html_text(text)
    text = _normalise(text)
    if not text:
        raise DocumentError(no_text_message(name))
    if len(text) > max_chars:
        text = text[:max_chars].rstrip()
        notes.append(f"The document is long: only its first {max_chars:,} characters were read.")
    return Document(name=name, kind=kind, text=text, notes=tuple(notes))


def _normalise(text: str) -> str:
    """Unix newlines, no trailing spaces, at most one blank line in a row."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    lines = [line.rstrip() for line in text.split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


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


_SKIPPED_TAGS = frozenset({"script", "style", "noscript", "template", "svg", "iframe", "object"})
_BLOCK_TAGS = frozenset(
    {
        "address",
        "article",
        "aside",
        "blockquote",
        "br",
        "dd",
        "div",
        "dl",
        "dt",
        "fieldset",
        "figcaption",
        "figure",
        "footer",
        "form",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "header",
        "hr",
        "li",
        "main",
        "nav",
        "ol",
        "p",
        "pre",
        "section",
        "table",
        "tbody",
        "thead",
        "title",
        "tr",
        "ul",
    }
)


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
