"""The overload bench's replicas arm without servers: counters and /status summed over replicas, the
sticky cookie read back, the engine server given the in-process engine's defaults, and the verdict
holding the replicas to the managed arm's targets (the run itself: bench/load/overload.py)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.load.deployments import (
    combined_status,
    engine_server_options,
    marked_down,
    merged_cookie,
    replica_of,
    sum_counters,
)
from bench.load.overload import turns_by_replica, verdict
from services.config import Settings

REPLICA_1 = """# TYPE chat_admission_refusals_total counter
chat_admission_refusals_total{reason="user_concurrent_turns"} 3.0
chat_admission_refusals_total{reason="capacity"} 1.0
"""
REPLICA_2 = """# TYPE chat_admission_refusals_total counter
chat_admission_refusals_total{reason="capacity"} 2.0
"""
ENGINE = """# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{model_name="m",engine="0"} 1200.0
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{model_name="m",engine="0"} 5000.0
"""


def test_counters_are_summed_over_labels_and_replicas_and_missing_ones_are_zero() -> None:
    names = ("chat_admission_refusals_total", "vllm:generation_tokens_total")
    assert sum_counters([REPLICA_1, REPLICA_2], names) == {
        "chat_admission_refusals_total": 6.0,
        "vllm:generation_tokens_total": 0.0,
    }
    assert sum_counters([ENGINE], ("vllm:generation_tokens_total",)) == {
        "vllm:generation_tokens_total": 1200.0
    }


def test_replica_status_is_summed_and_a_replica_that_did_not_say_makes_the_sum_unknown() -> None:
    first = {"sessions": 4, "turns_in_flight": 0, "engine_unfinished_requests": 1,
             "sessions_awaiting_reconnect": 2, "sessions_dropped_total": {"evicted": 1, "closed": 2},
             "event_loop_lag_max_seconds": 0.2, "admission": {"waiting": 0}}  # fmt: skip
    second = {**first, "sessions": 3, "engine_unfinished_requests": 0, "event_loop_lag_max_seconds": 0.7,
              "sessions_dropped_total": {"closed": 5, "expired": 1}}  # fmt: skip
    combined = combined_status([first, second])
    assert combined["sessions_dropped_total"] == {"closed": 7, "evicted": 1, "expired": 1}
    assert combined["sessions"] == 7 and combined["engine_unfinished_requests"] == 1
    assert combined["event_loop_lag_max_seconds"] == 0.7
    assert combined["admission"] == [{"waiting": 0}, {"waiting": 0}]
    assert combined_status([first])["admission"] == {"waiting": 0}, "one process: as it said"
    silent = {k: v for k, v in second.items() if k != "turns_in_flight"}
    assert combined_status([first, silent])["turns_in_flight"] is None, "not counted as nothing held"


def test_the_sticky_cookie_names_the_replica() -> None:
    assert replica_of("access_token=abc; CHAT_REPLICA=app2") == "app2"
    assert replica_of("CHAT_REPLICA=app1;access_token=x=y") == "app1"
    assert replica_of("access_token=abc") == "" and replica_of(None) == ""


def test_a_new_sticky_cookie_replaces_the_old_and_the_sign_in_stays() -> None:
    moved = merged_cookie("access_token=a.b=; CHAT_REPLICA=app2", {"CHAT_REPLICA": "app1"})
    assert moved == "access_token=a.b=; CHAT_REPLICA=app1" and replica_of(moved) == "app1"
    assert merged_cookie("access_token=x; CHAT_REPLICA=app2", {}) == "access_token=x; CHAT_REPLICA=app2"


HAPROXY_LOG = """[WARNING]  (1634) : Server replicas/app2 is DOWN, reason: Layer7 timeout, check duration: \
1006ms. 1 active and 0 backup servers left. 6 sessions active, 0 requeued, 0 remaining in queue.
Server replicas/app2 is DOWN, reason: Layer7 timeout, check duration: 1006ms. 1 active and 0 backup servers \
left. 6 sessions active, 0 requeued, 0 remaining in queue.
[WARNING]  (1634) : Server replicas/app2 is UP, reason: Layer7 check passed, code: 200, check duration: \
10ms. 2 active and 0 backup servers online. 0 sessions requeued, 0 total in queue.
[WARNING]  (1634) : Server replicas/app1 is DOWN, reason: Layer4 connection problem. 1 active and 0 backup \
servers left. 0 sessions active, 0 requeued, 0 remaining in queue.
[WARNING]  (1634) : Server replicas/app2 is DOWN, reason: Layer7 wrong status, code: 503. 1 active and 0 \
backup servers left. 2 sessions active, 0 requeued, 0 remaining in queue.
"""


def test_each_time_the_balancer_marked_a_replica_down_is_counted_once_with_the_pages_it_cut() -> None:
    assert marked_down(HAPROXY_LOG) == {
        "app2": {"times": 2, "sessions_cut": 8},
        "app1": {"times": 1, "sessions_cut": 0},
    }
    assert marked_down("") == {}


def test_turns_are_counted_by_replica_and_person() -> None:
    turns = [{"user": "1", "replica": "app1"}, {"user": "1", "replica": "app1"},
             {"user": "2", "replica": "app2"}, {"user": "3", "replica": ""}]  # fmt: skip
    assert turns_by_replica(turns) == {
        "?": {"turns": 1, "people": 1},
        "app1": {"turns": 2, "people": 1},
        "app2": {"turns": 1, "people": 1},
    }


@pytest.mark.parametrize("priority", [True, False])
def test_the_engine_server_gets_the_in_process_engines_defaults(priority: bool) -> None:
    settings = Settings.from_env({"DTYPE": "float32", "PRIORITY_SCHEDULING": str(priority).lower()})
    args, env = engine_server_options(settings)
    options = dict(zip(args[::2], args[1::2], strict=True))
    assert options["--dtype"] == "float32"
    assert options["--max-num-seqs"] == str(settings.max_num_seqs)
    assert options["--max-num-batched-tokens"] == str(settings.max_num_batched_tokens)
    assert options["--long-prefill-token-threshold"] == str(settings.long_prefill_token_threshold)
    assert options["--block-size"] == str(settings.block_size)
    assert options["--scheduling-policy"] == ("priority" if priority else "fcfs")
    assert env["VLLM_CPU_KVCACHE_SPACE"] == str(settings.cpu_kvcache_space_gib)
    assert "VLLM_CPU_OMP_THREADS_BIND" in env


def patient_arm(**changes: Any) -> dict[str, Any]:
    """An arm's summary that meets every patient target, with `changes` on top."""
    after = {"engine_unfinished_requests": 0, "turns_in_flight": 0, "engine_server_requests_held": 0.0}
    arm = {
        "chat_ttft_seconds": {"p50": 1.0, "p95": 4.0, "p99": 8.0},
        "stream_tokens_per_second": {"p5": 5.5, "p50": 7.0},
        "refusal_told_seconds": {"p50": 0.1, "p95": 0.2, "p99": 0.3, "max": 0.4},
        "max_silence_seconds": 1.5,
        "connect_seconds": {"p50": 0.1, "p95": 0.2, "p99": 0.3},
        "after_load": after,
    }
    for key, value in changes.items():
        (after if key in after else arm)[key] = value
    return arm


def unmet(checks: dict[str, Any]) -> set[str]:
    return {name for name, result in checks.items() if not result["met"]}


def test_the_replicas_are_held_to_the_managed_arms_targets_and_to_holding_nothing_after() -> None:
    targets = verdict({"managed": patient_arm(), "replicas": patient_arm()})
    assert set(targets["managed"]) < set(targets["replicas"]), "every managed target, and more"
    assert unmet(targets["replicas"]) == set()
    slow = patient_arm(chat_ttft_seconds={"p50": 3.0, "p95": 10.5, "p99": 12.0}, max_silence_seconds=2.5)
    assert unmet(verdict({"replicas": slow})["replicas"]) == {"chat_ttft_p95_seconds", "max_silence_seconds"}
    held = patient_arm(turns_in_flight=1, engine_server_requests_held=2.0)
    assert unmet(verdict({"replicas": held})["replicas"]) == {
        "turns_in_flight_after",
        "engine_server_requests_after",
    }
    unknown = patient_arm(engine_unfinished_requests=None)  # a replica did not say: not met
    assert unmet(verdict({"replicas": unknown})["replicas"]) == {"unfinished_engine_requests_after"}
    no_refusal = patient_arm(refusal_told_seconds={"p50": None, "p95": None, "p99": None, "max": None})
    assert unmet(verdict({"replicas": no_refusal})["replicas"]) == set(), "no refusal to tell is fine"
