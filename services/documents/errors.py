"""Why a file cannot be read: `DocumentError`, whose text is the one sentence the user sees."""

from __future__ import annotations

SUPPORTED = "a PDF, Word (.docx), HTML, Markdown or plain-text file"
MIB = 1024 * 1024


class DocumentError(ValueError):
    """A file cannot be turned into text; str() is the short sentence shown to the user."""


# --- user-facing messages: one per failure ------------------------------------
def empty_message(name: str) -> str:
    return f"'{name}' is empty; please upload a file with some text in it."


def no_text_message(name: str) -> str:
    return f"'{name}' contains no text to read."


def binary_message(name: str, what: str) -> str:
    return f"'{name}' is {what}, not a text document we can read; please upload {SUPPORTED}."


def unknown_binary_message(name: str) -> str:
    return f"'{name}' is not a text document we can read (it holds binary data); please upload {SUPPORTED}."


def not_a_pdf_message(name: str) -> str:
    return f"'{name}' is named like a PDF but is not a valid PDF file; please upload the original PDF."


def not_a_docx_message(name: str) -> str:
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
NOTE_LEGACY_ENCODING = "The file is not UTF-8; it was read as {encoding}."


def replaced_bytes_note(count: int) -> str:
    """The note for a UTF-8 file with `count` broken bytes."""
    which = "1 byte was" if count == 1 else f"{count:,} bytes were"
    return f"The file is UTF-8 except for a few bytes: {which} not valid UTF-8 and replaced with �."


def docx_too_big_message(max_bytes: int) -> str:
    return (
        f"This Word document is too large once unpacked (over {_megabytes(max_bytes)} MB); "
        "please upload a smaller document."
    )


def _megabytes(size_bytes: int) -> str:
    return f"{size_bytes / MIB:.1f}".removesuffix(".0")
