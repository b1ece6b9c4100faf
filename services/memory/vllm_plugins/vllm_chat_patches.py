"""Workarounds applied inside vLLM's processes, as vLLM's general plugin (see __init__.py).

Standard library, pyzmq and vLLM only: this module is imported by its own name
from a folder on sys.path, in processes that may not see the repository.

## Busy shared-memory readers pile up libzmq commands: drain them

vLLM's processes pass each engine step through a shared-memory ring
(`vllm.distributed.device_communicators.shm_broadcast.MessageQueue`): EngineCore
writes the step for the worker, the worker writes its result back. After every
write the writer also sends a wake-up on a zmq PUB socket (`SpinCondition.notify`).
The reader's SUB socket has ZMQ_CONFLATE, so libzmq keeps one message, but its I/O
thread still posts an `activate_read` command (40 bytes, in 16-command chunks) to
the socket's mailbox for each one, and a socket's mailbox is emptied only when the
program calls into that socket. The reader does so only after a second without
work (`SpinCondition.wait`), so as long as the engine stays busy, EngineCore and
the worker each keep ~48 bytes per step: ~4 MB an hour at ~25 steps a second,
freed only when the engine next idles for a second. (Found in the 2-hour soak:
BENCHMARKS.md, "libzmq wake-ups in busy vLLM processes".)

The workaround: after a read, at most once every DRAIN_SECONDS, the reader asks
its notify socket for ZMQ_EVENTS, which makes libzmq process the queued commands.
It costs one system call a second and keeps the mailbox to a second's worth.

## oneDNN primitives: fewer kept per weight

On CPU, each of vLLM's linear layers keeps an LRU of oneDNN matmul primitives,
one per step size M (`ops.create_onednn_mm(weight, 32)` in
`vllm/model_executor/layers/utils.py`; `MSizeCache` in `csrc/cpu/dnnl_helper.cpp`).
Primitives for large steps are large, and the LRU evicts only when a new size
arrives, so the worker steps up by MBs at its first peak of load and keeps them
(BENCHMARKS.md, "The worker's step at a new peak"). The workaround caps the
cache at ENGINE_ONEDNN_MM_CACHE primitives per weight: the variable the app sets
from its constant of that name (services/engine/backends/local/engine.py); unset
or 0: vLLM's own.
"""

from __future__ import annotations

import ctypes
import inspect
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

DRAIN_SECONDS = 1.0
ONEDNN_CACHE_ENV = "ENGINE_ONEDNN_MM_CACHE"
ONEDNN_FACTORIES = ("create_onednn_mm", "create_onednn_scaled_mm")
_DRAINED_AT = "_vllm_chat_drained_at"
# vLLM's logger tree: its handlers print from EngineCore and the workers too.
logger = logging.getLogger("vllm.vllm_chat_patches")


def apply() -> None:
    """vLLM's entry point: apply every workaround (safe to call more than once)."""
    for name, patch in (("spin_condition", drain_busy_readers), ("onednn_cache", cap_onednn_primitives)):
        applied = patch()
        state = "applied" if applied else "not applicable to this vLLM"
        logger.info("vllm_chat_patches: %s %s in pid %d", name, state, os.getpid())


def drain_busy_readers() -> bool:
    """Patch `SpinCondition.record_read`; False when this vLLM has no such reader to patch."""
    try:
        import zmq
        from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
    except ImportError:
        return False
    original = getattr(SpinCondition, "record_read", None)
    if original is None or getattr(original, "drains_notifications", False):
        return original is not None

    def record_read(self: Any) -> None:
        original(self)
        now = time.monotonic()
        if now - getattr(self, _DRAINED_AT, 0.0) >= DRAIN_SECONDS:
            setattr(self, _DRAINED_AT, now)
            self.local_notify_socket.getsockopt(zmq.EVENTS)  # libzmq runs the socket's commands

    record_read.drains_notifications = True  # type: ignore[attr-defined]
    SpinCondition.record_read = record_read
    return True


def cap_onednn_primitives() -> bool:
    """Cap the primitives each oneDNN matmul handler keeps; False when unset or nothing to cap.

    Wraps vLLM's handler factories in `vllm._custom_ops`, which its layers call
    through the module when the model loads (after the plugins, in the worker).
    """
    limit = int(os.environ.get(ONEDNN_CACHE_ENV) or 0)
    try:
        from vllm import _custom_ops as ops
    except ImportError:
        return False
    if limit <= 0 or not getattr(ops, "_supports_onednn", False):
        return False
    applied = False
    for name in ONEDNN_FACTORIES:
        factory = getattr(getattr(ops, name, None), "uncapped", getattr(ops, name, None))
        if factory is not None and "primitive_cache_size" in inspect.signature(factory).parameters:
            setattr(ops, name, _capped(factory, limit))
            applied = True
    return applied


def _capped(factory: Callable[..., Any], limit: int) -> Callable[..., Any]:
    """`factory` with its `primitive_cache_size` argument at most `limit`."""
    signature = inspect.signature(factory)

    def capped(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        bound.arguments["primitive_cache_size"] = min(bound.arguments["primitive_cache_size"], limit)
        return factory(*bound.args, **bound.kwargs)

    capped.uncapped = factory  # type: ignore[attr-defined]
    capped.primitive_cache_limit = limit  # type: ignore[attr-defined]
    return capped


def malloc_in_use_bytes() -> int:
    """Bytes allocated with glibc's malloc in this process (all arenas), from mallinfo2().

    (services/observability/maintenance.py reads the same for the app; this module stays
    self-contained, see the module's docstring.)"""

    class MallInfo2(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in (
                "arena",
                "ordblks",
                "smblks",
                "hblks",
                "hblkhd",
                "usmblks",
                "fsmblks",
                "uordblks",
                "fordblks",
                "keepcost",
            )
        ]

    mallinfo2: Callable[[], MallInfo2] = ctypes.CDLL("libc.so.6").mallinfo2
    mallinfo2.restype = MallInfo2
    info = mallinfo2()
    return int(info.uordblks + info.hblkhd)


def kept_bytes_per_notification(notifications: int, pace_seconds: float = 0.0005) -> float:
    """Run a busy vLLM reader against its writer and return the malloc bytes kept per wake-up.

    The writer notifies every `pace_seconds` (about an engine step's pace, so that
    PUB's high-water mark of 1 drops none); the reader reads after each, as a busy
    EngineCore or worker does, and never waits. Run it in a fresh process on glibc:
    it reads this process's malloc totals.
    """
    import zmq
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    folder = tempfile.mkdtemp(prefix="vllm-chat-notify-")
    address = f"ipc://{folder}/notify"
    contexts = [zmq.Context(), zmq.Context()]
    writer = SpinCondition(is_reader=False, context=contexts[0], notify_address=address)
    reader = SpinCondition(is_reader=True, context=contexts[1], notify_address=address)
    try:
        for _ in range(200):  # connect, and let the first chunks be allocated
            writer.notify()
            reader.record_read()
            time.sleep(pace_seconds)
        before = malloc_in_use_bytes()
        pause = threading.Event()
        for _ in range(notifications):
            writer.notify()
            reader.record_read()
            pause.wait(pace_seconds)
        time.sleep(DRAIN_SECONDS + 0.2)  # the last wake-ups reach the reader's I/O thread
        reader.record_read()  # a drain is due here if the reader drains at all
        return (malloc_in_use_bytes() - before) / notifications
    finally:
        for condition in (writer, reader):
            condition.local_notify_socket.close(linger=0)
        reader.read_cancel_socket.close(linger=0)
        reader.write_cancel_socket.close(linger=0)
        for context in contexts:
            context.term()
        shutil.rmtree(folder, ignore_errors=True)
