"""The overall numbers of a summary_quality.py run: aggregates per side and path, and the targets."""

from __future__ import annotations

from typing import Any

from services.documents.echo import ECHO_THRESHOLD

TARGETS = {
    "min_distinct_4": 0.9,
    "language_match": 0.9,
    "follow_up_ratio": 0.2,
    "max_echoed_ngrams": ECHO_THRESHOLD,
}


def overall(documents: list[dict]) -> dict[str, Any]:
    """Aggregates per side and path, over all runs and over the planned ones, and the targets."""
    table: dict[str, Any] = {}
    for key in sorted({key for doc in documents for key in doc["runs"]}):
        runs = [
            (doc, doc["runs"][key])
            for doc in documents
            if "skipped" not in doc["runs"].get(key, {"skipped": 1})
        ]
        planned = [(doc, r) for doc, r in runs if r["planned"]]
        table[key] = {"all": aggregate(runs), "planned": aggregate(planned)}
    table["first_words"] = first_words(documents)
    after_single = table.get("after/single", {}).get("planned", {})
    table["targets"] = {
        "min_distinct_4_after": min(
            (table[k]["all"].get("min_distinct_4", 1.0) for k in table if k.startswith("after/")),
            default=None,
        ),
        "language_match_after": _mean(
            [table[k]["all"].get("language_match") for k in table if k.startswith("after/")]
        ),
        "max_follow_up_ratio_after_single_planned": after_single.get("max_follow_up_ratio"),
        "coverage_planned": planned_coverage(documents),
        "after_against_each_side": after_against_each_side(documents),
        "after_summaries_above_echo_threshold": sum(
            table[k]["all"].get("echo_above_threshold", 0) for k in table if k.startswith("after/")
        ),
        "targets": TARGETS,
    }
    return table


def planned_coverage(documents: list[dict]) -> dict[str, Any]:
    """Each document's coverage on the path each side picks, paired: the coverage target's comparison."""
    rows = []
    for doc in documents:
        picked = {
            side: next(
                (r for key, r in doc["runs"].items() if key.startswith(f"{side}/") and r.get("planned")), None
            )
            for side in ("before", "after")
        }
        if picked["before"] and picked["after"]:
            rows.append({"id": doc["id"], **{side: run["coverage"] for side, run in picked.items()}})
    differences = [row["after"] - row["before"] for row in rows]
    return {
        "documents": rows,
        "mean_before": _mean([row["before"] for row in rows]),
        "mean_after": _mean([row["after"] for row in rows]),
        "mean_difference": _mean(differences),
        "after_higher": sum(d > 0 for d in differences),
        "after_lower": sum(d < 0 for d in differences),
    }


def after_against_each_side(documents: list[dict]) -> dict[str, Any]:
    """Coverage and echo of today's code against each other side, same document and path, paired."""
    pairs: dict[str, list[tuple[dict, dict]]] = {}
    for doc in documents:
        for key, run in doc["runs"].items():
            side, path = key.split("/")
            after = doc["runs"].get(f"after/{path}", {})
            if side != "after" and "skipped" not in run and "coverage" in after:
                pairs.setdefault(key, []).append((run, after))
    return {
        key: {
            "runs": len(rows),
            "mean_coverage": _mean([other["coverage"] for other, _ in rows]),
            "mean_coverage_after": _mean([after["coverage"] for _, after in rows]),
            "after_higher": sum(after["coverage"] > other["coverage"] for other, after in rows),
            "after_lower": sum(after["coverage"] < other["coverage"] for other, after in rows),
            "max_echoed_ngrams": max(other["echo"]["echoed"] for other, _ in rows),
            "max_echoed_ngrams_after": max(after["echo"]["echoed"] for _, after in rows),
            "above_echo_threshold": sum(other["echo"]["echoed"] > ECHO_THRESHOLD for other, _ in rows),
            "above_echo_threshold_after": sum(after["echo"]["echoed"] > ECHO_THRESHOLD for _, after in rows),
        }
        for key, rows in pairs.items()
    }


def first_words(documents: list[dict]) -> dict[str, Any]:
    """Single pass vs map-reduce time to the summary's first words (after side), and the crossover."""
    pairs = []
    for doc in sorted(documents, key=lambda d: d["tokens"]):
        single, parts = doc["runs"].get("after/single", {}), doc["runs"].get("after/map-reduce", {})
        if single.get("ttft_seconds") and parts.get("ttft_seconds"):
            pairs.append(
                {
                    "id": doc["id"],
                    "tokens": doc["tokens"],
                    "single_ttft_seconds": single["ttft_seconds"],
                    "map_reduce_ttft_seconds": parts["ttft_seconds"],
                }
            )
    sooner_from = None
    for index, pair in enumerate(pairs):  # the shortest length from which map-reduce is always sooner
        if all(p["map_reduce_ttft_seconds"] < p["single_ttft_seconds"] for p in pairs[index:]):
            sooner_from = pair["tokens"]
            break
    return {"pairs": pairs, "map_reduce_sooner_from_tokens": sooner_from}


def aggregate(runs: list[tuple[dict, dict]]) -> dict[str, Any]:
    if not runs:
        return {"runs": 0}
    ratios = [r["follow_up"]["ttft_ratio"] for _, r in runs if r["follow_up"]["ttft_ratio"] is not None]
    return {
        "runs": len(runs),
        "mean_distinct_4": _mean([r["distinct_4"] for _, r in runs]),
        "min_distinct_4": min(r["distinct_4"] for _, r in runs),
        "loop_guard_fired": sum(r["loop_guard_fired"] for _, r in runs),
        "loop_guard_would_fire_on_summary": sum(r["loop_guard_would_fire_on_summary"] for _, r in runs),
        "mean_coverage": _mean([r["coverage"] for _, r in runs]),
        "max_echoed_ngrams": max(r["echo"]["echoed"] for _, r in runs),
        "echo_above_threshold": sum(r["echo"]["echoed"] > ECHO_THRESHOLD for _, r in runs),
        "language_match": _mean([float(r["language_match"]) for _, r in runs]),
        "mean_summary_words": _mean([r["summary_words"] for _, r in runs]),
        "mean_ttft_seconds": _mean([r["ttft_seconds"] or 0.0 for _, r in runs]),
        "mean_total_seconds": _mean([r["total_seconds"] for _, r in runs]),
        "max_follow_up_ratio": max(ratios, default=None),
        "follow_up_hits_at_least_document": sum(
            r["follow_up"]["prefix_cache_hits_tokens"] >= d["tokens"] for d, r in runs
        ),
    }


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None
