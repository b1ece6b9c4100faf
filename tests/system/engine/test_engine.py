"""The real vLLM engine on the tiny model: streaming, concurrency, every abort route."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bench.memory.shapes import distinct_size_prompts, sweep, worker_rss_mb
from services.config import Settings
from services.engine.backends.local import RPC_DIR_PREFIX, engine_processes
from services.engine.backends.local.engine import ENGINE_ONEDNN_CACHE_CAPACITY, ENGINE_ONEDNN_MM_CACHE
from services.engine.chat_engine import ChatEngine, SamplingSettings
from services.engine.errors import TokenBudgetError
from services.engine.stream_stats import StreamStats
from services.engine.warmup import BATCH_SIZES, KERNEL_FILL_ANSWER_TOKENS, READING_PACE_HEADROOM, warm_up
from services.engine.warmup_record import WarmUpRecords, record_key
from services.memory import ENGINE_MMAP_THRESHOLD_BYTES, PRELOAD_LIBRARIES
from tests.conftest import tiny_settings

# The engine is the session's in-process runtime's (conftest.py), on the session's event loop.
pytestmark = pytest.mark.asyncio(loop_scope="session")

QUESTION = [{"role": "user", "content": "Tell me a long story."}]
LONG = SamplingSettings(temperature=1.0, top_p=1.0, max_new_tokens=3000)
SHORT = SamplingSettings(temperature=1.0, top_p=1.0, max_new_tokens=24)


@pytest.fixture
def finished(engine: ChatEngine) -> list[StreamStats]:
    """Stats of every request that ends during the test."""
    seen: list[StreamStats] = []
    engine.on_finish(seen.append)
    yield seen
    engine._on_finish.remove(seen.append)


async def collect(engine: ChatEngine, request_id: str, sampling: SamplingSettings = SHORT) -> str:
    return "".join([delta async for delta in engine.generate(QUESTION, sampling, request_id)])


async def wait_until_idle(engine: ChatEngine, timeout: float = 5.0) -> None:
    """An aborted request leaves the engine at once (at the next step, milliseconds here; more with a
    core busy elsewhere), far sooner than the 3,000 tokens it would run for."""
    deadline = asyncio.get_running_loop().time() + timeout
    while engine.unfinished_requests():
        assert asyncio.get_running_loop().time() < deadline, "engine still holds requests"
        await asyncio.sleep(0.01)


async def test_streams_text_deltas(engine: ChatEngine, finished: list[StreamStats]) -> None:
    deltas = [delta async for delta in engine.generate(QUESTION, SHORT, "stream-1")]
    assert len(deltas) > 1, "the answer should arrive in several pieces"
    assert finished[-1].finish_reason in ("length", "stop")
    assert 0 < finished[-1].output_tokens <= SHORT.max_new_tokens
    assert engine.unfinished_requests() == 0


async def test_eight_concurrent_streams(engine: ChatEngine) -> None:
    answers = await asyncio.gather(*(collect(engine, f"concurrent-{i}") for i in range(8)))
    assert all(answers)
    assert engine.unfinished_requests() == 0


async def start_long_stream(engine: ChatEngine, request_id: str) -> tuple[AsyncIterator[str], list[str]]:
    stream = engine.generate(QUESTION, LONG, request_id)
    received = [await anext(stream) for _ in range(3)]
    assert engine.unfinished_requests() == 1
    return stream, received


async def test_explicit_abort_ends_the_stream(engine: ChatEngine, finished: list[StreamStats]) -> None:
    stream, _ = await start_long_stream(engine, "abort-explicit")
    await engine.abort("abort-explicit")
    rest = [delta async for delta in stream]  # the stream ends on its own
    assert len(rest) < LONG.max_new_tokens
    assert finished[-1].finish_reason == "abort"
    await wait_until_idle(engine)


async def test_task_cancellation_aborts(engine: ChatEngine, finished: list[StreamStats]) -> None:
    started = asyncio.Event()

    async def consume() -> None:
        async for _ in engine.generate(QUESTION, LONG, "abort-cancel"):
            started.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(started.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert finished[-1].finish_reason == "abort"
    await wait_until_idle(engine)


async def test_early_close_aborts(engine: ChatEngine, finished: list[StreamStats]) -> None:
    stream, _ = await start_long_stream(engine, "abort-close")
    await stream.aclose()
    assert finished[-1].finish_reason == "abort"
    await wait_until_idle(engine)


async def test_consumer_exception_aborts(engine: ChatEngine) -> None:
    with pytest.raises(RuntimeError, match="consumer failed"):
        stream = engine.generate(QUESTION, LONG, "abort-exception")
        async with contextlib.aclosing(stream):
            async for _ in stream:
                raise RuntimeError("consumer failed")
    await wait_until_idle(engine)


async def test_engine_still_serves_after_aborts(engine: ChatEngine) -> None:
    for i in range(3):
        stream, _ = await start_long_stream(engine, f"churn-{i}")
        await stream.aclose()
    assert await collect(engine, "after-aborts")
    assert engine.unfinished_requests() == 0


async def test_prompt_beyond_context_is_refused(engine: ChatEngine) -> None:
    huge = [{"role": "user", "content": "word " * 5000}]
    with pytest.raises(TokenBudgetError, match="exceeds the model's maximum context length"):
        await anext(engine.generate(huge, SHORT, "too-long"))
    assert engine.unfinished_requests() == 0


async def test_answer_budget_is_capped_by_context(engine: ChatEngine, finished: list[StreamStats]) -> None:
    """A prompt that leaves about 40 tokens of the context: the answer may take those, never more."""

    def asking(words: int) -> list[dict[str, str]]:
        return [{"role": "user", "content": "word " * words}]

    fixed = len(engine.encode_chat(asking(0)))
    per_word = (len(engine.encode_chat(asking(1000))) - fixed) / 1000
    near_full = asking(int((engine.max_model_len - fixed - 40) / per_word))
    prompt_tokens = len(engine.encode_chat(near_full))
    assert 0 < engine.max_model_len - prompt_tokens <= 100, prompt_tokens
    stream = engine.generate(near_full, SamplingSettings(1.0, 1.0, max_new_tokens=100_000), "capped")
    "".join([delta async for delta in stream])
    assert finished[-1].output_tokens <= engine.max_model_len - prompt_tokens


async def test_engine_processes_start_with_the_configured_allocator(engine: ChatEngine) -> None:
    # vLLM spawns its processes from this environment; their own /proc/<pid>/environ cannot be
    # read back (setproctitle overwrites it), but the preloaded malloc shows in their mappings.
    settings = Settings()
    processes = engine_processes()
    assert len(processes) >= 2, "EngineCore and a worker"
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(ENGINE_ONEDNN_CACHE_CAPACITY)
    assert os.environ["ENGINE_ONEDNN_MM_CACHE"] == str(ENGINE_ONEDNN_MM_CACHE)
    preloaded = PRELOAD_LIBRARIES.get(settings.engine_allocator)
    for process in processes:
        maps = Path(f"/proc/{process.pid}/maps").read_text()
        for name in PRELOAD_LIBRARIES.values():
            assert (name in maps) == (name == preloaded), f"{process.name()} maps {name}: {name in maps}"
    if settings.engine_allocator == "glibc":  # without it glibc's threshold drifts up to 32 MB
        assert os.environ["MALLOC_MMAP_THRESHOLD_"] == str(ENGINE_MMAP_THRESHOLD_BYTES)


async def test_vllm_s_temp_files_stay_in_the_engine_s_private_folder(engine: ChatEngine) -> None:
    # The worker's rendezvous file (torch's FileStore) and the ZMQ sockets go where the app removes
    # them on shutdown; this process and its later children keep the session's temp folder.
    folders = list(Path(tempfile.gettempdir()).glob(f"{RPC_DIR_PREFIX}*"))
    assert len(folders) == 1, folders
    names = [path.name for path in folders[0].iterdir()]
    assert any(name.startswith("vllm_dist_") for name in names), names
    assert not list(Path(tempfile.gettempdir()).glob("vllm_dist_*"))
    assert os.environ["TMPDIR"] == tempfile.gettempdir()
    assert "VLLM_RPC_BASE_PATH" not in os.environ


@pytest.mark.long  # the worker's growth over 160 batch sizes: bench/memory/shapes.py is the verdict
async def test_new_batch_sizes_do_not_grow_the_worker(engine: ChatEngine) -> None:
    # Every prefill below has a batch size the worker has not seen, and each compiles oneDNN
    # primitives. With oneDNN's default cache (1024 primitives) the worker grew 184 MB over these 160
    # sizes; with the capped cache (ENGINE_ONEDNN_CACHE_CAPACITY) it stays where the warm-up left it.
    prompts = distinct_size_prompts(engine, 200, first_words=600)
    await sweep(engine, prompts[:40], "sizes-warm")
    before = worker_rss_mb()
    await sweep(engine, prompts[40:], "sizes")
    growth = worker_rss_mb() - before
    assert growth < 30, f"the worker grew {growth:.0f} MB over 160 new batch sizes"
    assert engine.unfinished_requests() == 0


# three warm-ups: per commit, every server start warms up and tests/unit/test_warmup_record.py
@pytest.mark.long
async def test_warm_up_doubles_its_batches_until_one_is_too_slow_for_the_reading_pace(
    engine: ChatEngine, tiny_model_dir: Path
) -> None:
    """Up to the largest batch admission may run, so the worker's kernels for it exist before users.

    Where the doubling stops depends on the machine's speed at that moment (a loaded machine stops
    sooner), so the engine's own warm-up is checked for the rule: every batch but the last kept the
    reading pace, and the last is the largest or the first that did not."""
    settings = tiny_settings(tiny_model_dir)
    slowest = 1 / (settings.reading_pace_tokens_per_second * READING_PACE_HEADROOM)
    speeds = engine.warm_up_report.decode_seconds_per_token
    sizes, allowed = sorted(speeds), sorted({min(s, settings.max_num_seqs) for s in BATCH_SIZES})
    assert sizes == allowed[: len(sizes)], "doubling from one stream, no size skipped"
    assert all(speeds[size] <= slowest for size in sizes[:-1])
    assert sizes[-1] == allowed[-1] or speeds[sizes[-1]] > slowest
    strict = await warm_up(engine, settings.replace(reading_pace_tokens_per_second=1e6))  # no batch keeps it
    assert len(strict.decode_seconds_per_token) == 1
    unpaced = await warm_up(engine, settings.replace(reading_pace_tokens_per_second=0))  # admits all at once
    assert max(unpaced.decode_seconds_per_token) == min(max(BATCH_SIZES), settings.max_num_seqs)


@pytest.mark.long  # two warm-ups: per commit, tests/unit/test_warmup_record.py
async def test_a_restart_takes_the_kept_speeds_and_still_runs_every_batch_size(
    engine: ChatEngine, tiny_model_dir: Path, tmp_path: Path, finished: list[StreamStats]
) -> None:
    """What one start measured, the next start with the same key takes (warmup_record.py), and its
    warm-up still sends each batch size through the worker once, with short answers."""
    settings = tiny_settings(tiny_model_dir)
    records = WarmUpRecords(str(tmp_path), settings.warm_up_reuse_hours)
    key = record_key(settings, engine.max_model_len)
    measured = await warm_up(engine, settings)
    records.save(key, measured.decode_seconds_per_token)
    finished.clear()
    known = records.find(key)
    assert known is not None and known[0] == measured.decode_seconds_per_token
    again = await warm_up(engine, settings, known=known)
    assert again.decode_seconds_per_token == measured.decode_seconds_per_token
    assert again.summary()["decode_age_seconds"] == round(known[1])
    prompts = len(again.prompt_ttft_seconds)
    answers = [stats.output_tokens for stats in finished[prompts:]]
    assert len(answers) == sum(measured.decode_seconds_per_token), "every batch size ran once"
    assert max(answers) <= KERNEL_FILL_ANSWER_TOKENS
