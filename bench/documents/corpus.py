"""The real documents of the summary benchmarks, and how a run attaches them and picks their path.

The set is listed with paths, languages and sha256 in bench/data/summary_documents.json;
a document that changed or is missing is skipped and reported. Shared by
summary_quality.py, penalty_sweep.py and bench/memory/native_caches.py.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import tempfile
from collections import deque
from pathlib import Path

from bench.common import DATA, ROOT
from bench.documents.quality_metrics import sections_of
from services.chat.service import ChatService
from services.chat.session import ChatSession
from services.documents.planning import IN_PARTS, WHOLE
from services.engine import ChatEngine, SamplingSettings

DOCUMENTS_FILE = DATA / "summary_documents.json"


def load_documents(ids: set[str] | None) -> tuple[list[dict], list[dict]]:
    """The listed documents that exist with the recorded checksum, and those skipped (with why)."""
    listed = json.loads(DOCUMENTS_FILE.read_text())["documents"]
    kept = []
    skipped = []
    for entry in listed:
        if ids and entry["id"] not in ids:
            continue
        path = ROOT / entry["path"]  # absolute, or from the repository root (the venv's files)
        if not path.exists():
            skipped.append({**entry, "why": "missing"})
            continue
        raw = path.read_bytes()
        if entry.get("sha256") and hashlib.sha256(raw).hexdigest() != entry["sha256"]:
            skipped.append({**entry, "why": "checksum differs"})
            continue
        name = path.name.removesuffix(".gz")
        kept.append({**entry, "name": name, "data": gzip.decompress(raw) if path.suffix == ".gz" else raw})
    return kept, skipped


def write_checksums() -> None:
    listing = json.loads(DOCUMENTS_FILE.read_text())
    for entry in listing["documents"]:
        entry["sha256"] = hashlib.sha256((ROOT / entry["path"]).read_bytes()).hexdigest()
    DOCUMENTS_FILE.write_text(json.dumps(listing, indent=2, ensure_ascii=False) + "\n")


def new_session(chat: ChatService, session_id: str) -> ChatSession:
    s = chat.settings
    sampling = SamplingSettings(
        s.temperature, s.top_p, s.max_new_tokens, s.repetition_penalty, s.frequency_penalty
    )
    return ChatSession(session_id, sampling, s.system_prompt, deque(maxlen=s.max_history_messages))


async def attach(chat: ChatService, session: ChatSession, doc: dict) -> tuple[str, ...]:
    folder = Path(tempfile.mkdtemp(prefix="bench-quality-"))
    path = folder / doc["name"]
    path.write_bytes(doc["data"])
    result = await chat.attach_files(session, [(str(path), doc["name"])])
    folder.rmdir()
    assert result.document is not None, result.errors
    return result.notes


def force_path(chat: ChatService, session: ChatSession, path: str) -> bool:
    """Make the session's document go `path`; False when that path cannot hold it."""
    document = session.document
    assert document is not None
    plan = document.plan or chat.summarizer.plan(chat._job(session, ""), document.tokens)
    if path == "single":
        fits = plan.prompt_tokens + plan.budget.summary_tokens <= plan.budget.max_model_len
        forced = (
            plan if plan.whole else type(plan)(WHOLE, plan.document_tokens, plan.prompt_tokens, plan.budget)
        )
        document.plan = forced if fits else None
        return fits
    if (
        len(sections_of(document.text, chat.engine.count_tokens)) < 2
        or document.tokens <= chat.summarizer.chunk_tokens()
    ):
        return False
    document.plan = type(plan)(IN_PARTS, plan.document_tokens, plan.prompt_tokens, plan.budget)
    return True


def sections_of_document(engine: ChatEngine, doc: dict) -> list[str]:
    from services.documents.extract import extract_document

    extracted = extract_document(
        doc["data"], doc["name"], max_pages=500, max_docx_uncompressed_bytes=10**8, max_chars=10**6
    )
    doc["text"] = extracted.text
    return sections_of(extracted.text, engine.count_tokens)
