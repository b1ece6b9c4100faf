"""What kind of document a file is, by its content (magic bytes); the extension only picks text kinds."""

from __future__ import annotations

import io
import zipfile

from services.documents.encoding import has_utf16_bom, looks_binary
from services.documents.errors import (
    DOCX_PROTECTED,
    LEGACY_OFFICE,
    DocumentError,
    binary_message,
    empty_message,
    not_a_docx_message,
    not_a_pdf_message,
    unknown_binary_message,
)
from services.documents.word import MAX_DOCX_MEMBERS

HTML_EXTENSIONS = (".html", ".htm", ".xhtml")
MARKDOWN_EXTENSIONS = (".md", ".markdown", ".mdown", ".mkd")
PDF_MAGIC_WINDOW_BYTES = 1024  # the PDF spec tolerates junk before "%PDF-"; readers look this far


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


def base_name(filename: str) -> str:
    return filename.replace("\\", "/").rsplit("/", 1)[-1] or "file"


def _extension(filename: str) -> str:
    name = base_name(filename).lower()
    return name[name.rfind(".") :] if "." in name else ""


def _zip_kind(data: bytes, name: str, extension: str) -> str:
    """'docx' for a Word zip; raise for other zips (a damaged one named .docx is still 'docx')."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = set(archive.namelist()[:MAX_DOCX_MEMBERS])
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError):
        if extension == ".docx":
            return "docx"  # extraction reports it as damaged
        raise DocumentError(binary_message(name, "a damaged ZIP archive")) from None
    if "word/document.xml" in names:
        return "docx"
    if extension == ".docx":
        raise DocumentError(not_a_docx_message(name))
    if "xl/workbook.xml" in names:
        raise DocumentError(binary_message(name, "an Excel workbook"))
    if "ppt/presentation.xml" in names:
        raise DocumentError(binary_message(name, "a PowerPoint presentation"))
    raise DocumentError(binary_message(name, "a ZIP archive"))


def sniff_kind(data: bytes, filename: str) -> str:
    """The document kind by content (magic bytes); the extension only picks text/markdown/html.

    Raises DocumentError for empty files and for formats we cannot read.
    """
    name = base_name(filename)
    extension = _extension(filename)
    if not data:
        raise DocumentError(empty_message(name))
    if b"%PDF-" in data[:PDF_MAGIC_WINDOW_BYTES]:
        return "pdf"
    if data.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return _zip_kind(data, name, extension)
    if data.startswith(_OLE2_MAGIC):
        raise DocumentError(DOCX_PROTECTED if extension == ".docx" else LEGACY_OFFICE)
    what = _binary_kind(data)
    if what is not None:
        raise DocumentError(binary_message(name, what))
    if not has_utf16_bom(data) and looks_binary(data):
        if extension == ".pdf":
            raise DocumentError(not_a_pdf_message(name))
        if extension == ".docx":
            raise DocumentError(not_a_docx_message(name))
        raise DocumentError(unknown_binary_message(name))
    head = data[:512].decode("utf-8", errors="replace").lstrip("\ufeff \t\r\n").lower()
    if head.startswith(("<!doctype html", "<html")) or extension in HTML_EXTENSIONS:
        return "html"
    if extension in MARKDOWN_EXTENSIONS:
        return "markdown"
    return "text"
