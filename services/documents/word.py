"""Text of Word (.docx) files, with the archive checked against zip bombs before python-docx reads it."""

from __future__ import annotations

import io
import logging
import zipfile

import docx
from docx.table import Table
from docx.text.paragraph import Paragraph

from services.documents.errors import (
    DOCX_BOMB,
    DOCX_CORRUPT,
    DOCX_PROTECTED,
    DocumentError,
    docx_too_big_message,
)

logger = logging.getLogger(__name__)

MAX_DOCX_MEMBERS = 5000  # real .docx files hold tens of parts
MAX_DOCX_COMPRESSION_RATIO = 100  # deflated XML is ~5-20x; zeros compress ~1000x
DOCX_RATIO_CHECK_MIN_BYTES = 1024 * 1024  # tiny members may compress well without being bombs
INFLATE_CHUNK_BYTES = 64 * 1024


def docx_text(data: bytes, max_uncompressed_bytes: int) -> str:
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
        raise DocumentError(docx_too_big_message(max_uncompressed_bytes))


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
                        raise DocumentError(docx_too_big_message(max_uncompressed_bytes))
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
