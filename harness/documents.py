"""Real document files built in memory for tests and benchmarks (good, broken and hostile)."""

from __future__ import annotations

import io
import random
import zipfile

import docx
from fpdf import FPDF
from pypdf import PdfReader, PdfWriter

MIB = 1024 * 1024
PNG_HEADER = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10\x00\x00\x00\x10\x08\x06\x00\x00\x00"


def make_pdf(paragraphs: list[str], *, page_per_paragraph: bool = False) -> bytes:
    """A text PDF (core font Helvetica, latin-1 text), one page or one page per paragraph."""
    pdf = FPDF()
    pdf.set_font("Helvetica", size=11)
    pdf.add_page()
    for index, paragraph in enumerate(paragraphs):
        if page_per_paragraph and index:
            pdf.add_page()
        pdf.multi_cell(0, 6, paragraph, new_x="LMARGIN", new_y="NEXT")
        pdf.ln(4)
    return bytes(pdf.output())


def make_encrypted_pdf(paragraphs: list[str], user_password: str = "secret") -> bytes:
    """make_pdf's PDF encrypted; with user_password="" it opens without a password."""
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(make_pdf(paragraphs))))
    writer.encrypt(user_password=user_password, owner_password="owner-secret", algorithm="AES-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def make_scanned_pdf(pages: int = 2) -> bytes:
    """A PDF whose pages hold only drawings (like a scan): no text layer."""
    pdf = FPDF()
    for page in range(pages):
        pdf.add_page()
        pdf.set_fill_color(40 + 50 * page, 40, 40)
        for row in range(20):
            pdf.rect(20, 20 + row * 12, 170 - (row % 5) * 20, 6, style="F")
    return bytes(pdf.output())


def make_corrupt_pdf(seed: int = 1) -> bytes:
    """A PDF header followed by garbage."""
    return b"%PDF-1.7\n" + random.Random(seed).randbytes(4000) + b"\n%%EOF\n"


def make_docx(paragraphs: list[str], table_rows: list[list[str]] | None = None) -> bytes:
    """A real .docx with the paragraphs and, after them, an optional table."""
    document = docx.Document()
    for paragraph in paragraphs:
        document.add_paragraph(paragraph)
    if table_rows:
        table = document.add_table(rows=len(table_rows), cols=len(table_rows[0]))
        for row, values in zip(table.rows, table_rows, strict=True):
            for cell, value in zip(row.cells, values, strict=True):
                cell.text = value
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def make_corrupt_docx() -> bytes:
    """A real .docx cut in half: the zip's central directory is gone."""
    data = make_docx(["This document will be truncated."] * 20)
    return data[: len(data) // 2]


def make_docx_with_broken_xml() -> bytes:
    """A well-formed zip shaped like a .docx whose document.xml is not XML."""
    good = zipfile.ZipFile(io.BytesIO(make_docx(["placeholder"])))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as broken:
        for info in good.infolist():
            data = good.read(info)
            if info.filename == "word/document.xml":
                data = b"<w:document><w:body><w:p>unterminated"
            broken.writestr(info.filename, data)
    return out.getvalue()


def make_docx_zip_bomb(uncompressed_bytes: int = 200 * MIB) -> bytes:
    """A zip with word/document.xml of `uncompressed_bytes` zeros, written in streamed chunks."""
    out = io.BytesIO()
    chunk = bytes(MIB)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        archive.writestr("[Content_Types].xml", b"<Types/>")
        with archive.open("word/document.xml", "w") as member:
            for _ in range(uncompressed_bytes // MIB):
                member.write(chunk)
    return out.getvalue()


def make_lying_zip_bomb(uncompressed_bytes: int = 64 * MIB, declared_bytes: int = 1000) -> bytes:
    """make_docx_zip_bomb with its size fields patched to claim `declared_bytes`."""
    data = bytearray(make_docx_zip_bomb(uncompressed_bytes))
    name = b"word/document.xml"
    local = data.find(b"PK\x03\x04")
    while local != -1:
        name_length = int.from_bytes(data[local + 26 : local + 28], "little")
        if data[local + 30 : local + 30 + name_length] == name:
            data[local + 22 : local + 26] = declared_bytes.to_bytes(4, "little")
        local = data.find(b"PK\x03\x04", local + 4)
    central = data.find(b"PK\x01\x02")
    while central != -1:
        name_length = int.from_bytes(data[central + 28 : central + 30], "little")
        if data[central + 46 : central + 46 + name_length] == name:
            data[central + 24 : central + 28] = declared_bytes.to_bytes(4, "little")
        central = data.find(b"PK\x01\x02", central + 4)
    return bytes(data)


def make_big_docx(media_bytes: int, seed: int = 3) -> bytes:
    """A real .docx carrying an incompressible 'image' of `media_bytes` (honest, just large)."""
    good = zipfile.ZipFile(io.BytesIO(make_docx(["A report with a large picture."])))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as big:
        for info in good.infolist():
            big.writestr(info.filename, good.read(info))
        big.writestr("word/media/image1.png", random.Random(seed).randbytes(media_bytes))
    return out.getvalue()


def make_zip(files: dict[str, bytes]) -> bytes:
    """A plain zip archive (not a Word document)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return out.getvalue()


def make_html(title: str, paragraphs: list[str]) -> bytes:
    """An HTML page with head, script, style, entities, a list and the paragraphs."""
    body = "\n".join(f"<p>{paragraph}</p>" for paragraph in paragraphs)
    page = f"""<!DOCTYPE html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>{title}</title>
  <style>body {{ font-family: sans-serif; }} .hidden {{ display: none; }}</style>
  <script>var secretTracking = "do-not-extract"; console.log(secretTracking);</script>
</head>
<body>
  <h1>{title}</h1>
  {body}
  <ul><li>First   point</li><li>Second&nbsp;point &amp; more</li></ul>
  <noscript>Enable JavaScript please</noscript>
</body>
</html>
"""
    return page.encode("utf-8")


def random_bytes(size: int = 4096, seed: int = 7) -> bytes:
    return random.Random(seed).randbytes(size)


def png_bytes(seed: int = 5) -> bytes:
    """A PNG header followed by random data."""
    return PNG_HEADER + random.Random(seed).randbytes(2000)


def invalid_utf8_text() -> bytes:
    """Mostly valid UTF-8 text with a few Latin-1 bytes in it."""
    return "Café menu: crème brûlée.\n\nPrice: ".encode() + b"12\xa3 and na\xefve text.\n"


# --- a long, realistic-ish report -------------------------------------------------
_TOPICS = (
    "Supply chain",
    "Energy use",
    "Customer support",
    "Hiring",
    "Security",
    "Product roadmap",
    "Regional sales",
    "Infrastructure",
    "Quality assurance",
    "Finance",
)
_SUBJECTS = (
    "The team",
    "Our northern office",
    "The warehouse group",
    "Management",
    "The data platform",
    "Each regional lead",
    "The pilot project",
    "The audit committee",
    "Field engineers",
)
_VERBS = (
    "reduced",
    "increased",
    "reviewed",
    "delayed",
    "expanded",
    "measured",
    "replaced",
    "simplified",
    "automated",
    "documented",
)
_OBJECTS = (
    "delivery times",
    "monthly costs",
    "the backlog of open tickets",
    "server capacity",
    "onboarding steps",
    "the number of incidents",
    "vendor contracts",
    "training hours",
    "inventory levels",
    "response quality",
)
_REASONS = (
    "after the spring reorganisation",
    "because demand grew faster than planned",
    "following customer feedback",
    "to meet the new compliance rules",
    "despite a tight budget",
    "thanks to better forecasting",
    "while two suppliers changed terms",
    "ahead of the holiday peak",
)
_FOLLOW_UPS = (
    "Further work is planned for the next quarter.",
    "The results will be reviewed in March.",
    "Several risks remain open.",
    "This matches the targets set last year.",
    "Staff reported the change as positive.",
    "Costs stayed within the approved range.",
)


def _sentence(rng: random.Random, topic: str) -> str:
    kind = rng.randrange(4)
    subject = rng.choice(_SUBJECTS)
    verb = rng.choice(_VERBS)
    obj = rng.choice(_OBJECTS)
    if kind == 0:
        return f"{subject} {verb} {obj} by {rng.randint(2, 45)} percent {rng.choice(_REASONS)}."
    if kind == 1:
        return f"In the area of {topic.lower()}, {subject.lower()} {verb} {obj} {rng.choice(_REASONS)}."
    if kind == 2:
        return f"{rng.choice(_FOLLOW_UPS)}"
    return f"{subject} {verb} {obj}, and {rng.choice(_SUBJECTS).lower()} {rng.choice(_VERBS)} {obj}."


def long_document(words: int, seed: int = 0) -> str:
    """A deterministic report of exactly `words` words: titled sections of varied paragraphs."""
    rng = random.Random(seed)
    parts: list[str] = []
    remaining = words
    section = 0
    while remaining > 0:
        topic = _TOPICS[section % len(_TOPICS)]
        section += 1
        blocks = [f"## Section {section}: {topic}"]
        blocks += [
            " ".join(_sentence(rng, topic) for _ in range(rng.randint(3, 7)))
            for _ in range(rng.randint(2, 5))
        ]
        for block in blocks:
            block_words = block.split(" ")
            if len(block_words) >= remaining:
                parts.append(" ".join(block_words[:remaining]))
                return "\n\n".join(parts)
            parts.append(block)
            remaining -= len(block_words)
    return "\n\n".join(parts)
