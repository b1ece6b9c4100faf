"""Instruction echo of the summaries a saved summary_quality.py run holds, at several n-gram sizes.

    .venv/bin/python bench/documents/echo_rescore.py \
        bench/results/documents/summary-quality-20261201-2135-min64.json \
        --side before=legacy --side after=prompts@444963c --json bench/out/echo-rescore.json

Each side's summaries are scored against the instructions that side sent: `legacy`
(legacy_summaries.py) or `prompts@REV` (services/documents/prompts.py at git revision REV).
What the ECHO_THRESHOLD of services/documents/echo.py was chosen from: the score of
summaries read as honest against those that copy their instructions.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.documents.arms import prompts_at
from bench.documents.corpus import load_documents
from bench.documents.legacy_summaries import LegacyPrompts
from services.config import Settings
from services.documents.echo import echo_of, instruction_texts
from services.documents.extract import extract_document


def prompts_class(name: str):
    return LegacyPrompts if name == "legacy" else prompts_at(name.removeprefix("prompts@"))[0]


def rescore(saved: dict, sides: dict[str, str], sizes: tuple[int, ...]) -> list[dict]:
    documents, _ = load_documents({doc["id"] for doc in saved["documents"]})
    texts = {
        doc["id"]: extract_document(
            doc["data"], doc["name"], max_pages=500, max_docx_uncompressed_bytes=10**8, max_chars=10**6
        ).text
        for doc in documents
    }
    system_prompt = Settings.from_env({}).system_prompt
    rows = []
    for doc in saved["documents"]:
        for key, run in doc["runs"].items():
            side = key.split("/")[0]
            if side not in sides or "summary" not in run or doc["id"] not in texts:
                continue
            language = "en" if sides[side] == "legacy" else doc["language"]
            instructions = instruction_texts(prompts_class(sides[side])(language), system_prompt)
            row: dict = {"id": doc["id"], "run": key}
            for n in sizes:
                echo = echo_of(run["summary"], instructions, texts[doc["id"]], n)
                row[f"echoed_{n}"] = echo.echoed
                row[f"share_{n}"] = round(echo.score, 4)
                row[f"phrases_{n}"] = list(echo.phrases)
            rows.append(row)
    return sorted(rows, key=lambda row: (row[f"echoed_{sizes[-1]}"], row[f"share_{sizes[-1]}"]))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("saved", type=Path, help="a summary_quality.py --json file")
    parser.add_argument("--side", action="append", required=True, help="SIDE=legacy or SIDE=prompts@REV")
    parser.add_argument("--sizes", default="3,4", help="n-gram sizes, comma-separated")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    sides = dict(item.split("=", 1) for item in args.side)
    rows = rescore(json.loads(args.saved.read_text()), sides, tuple(int(n) for n in args.sizes.split(",")))
    for row in rows:
        scores = " ".join(f"{k}={v}" for k, v in row.items() if k.startswith(("echoed_", "share_")))
        print(f"{row['id']:<30} {row['run']:<22} {scores} {row[next(reversed(row))][:3]}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"source": str(args.saved), "sides": sides, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
