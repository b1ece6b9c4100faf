"""Our workarounds for vLLM (services/engine/vllm_plugins): still needed, still working, found by vLLM.

Each measurement runs in a fresh Python process on glibc, so the malloc totals it
reads are its own. No model: the shared-memory queue's wake-ups are vLLM's own
code, run as EngineCore and the worker run them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTIFICATIONS = 10_000  # ~10 s at the pace below; without the workaround ~250 KB pile up


def run_python(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


def kept_per_notification(patched: bool) -> float:
    code = (
        "from services.engine.vllm_plugins import register\n"
        "register()\n"
        "import vllm_chat_patches\n"
        + ("vllm_chat_patches.drain_busy_readers()\n" if patched else "")
        + f"print(vllm_chat_patches.kept_bytes_per_notification({NOTIFICATIONS}))"
    )
    return float(run_python(code))


def test_vllm_readers_still_pile_up_wake_ups_while_busy() -> None:
    """When this fails, vLLM (or libzmq) no longer keeps a command per wake-up in a busy reader:
    remove drain_busy_readers from services/engine/vllm_plugins/vllm_chat_patches.py and this test."""
    kept = kept_per_notification(patched=False)
    assert kept > 15, f"{kept:.1f} B per wake-up: the workaround is no longer needed"


def test_the_workaround_keeps_nothing_per_wake_up() -> None:
    kept = kept_per_notification(patched=True)
    assert kept < 5, f"{kept:.1f} B per wake-up are still kept"


def test_vllm_and_the_processes_it_spawns_find_the_workarounds(tmp_path: Path) -> None:
    """vLLM's general plugins are loaded in each of its processes; a spawned child inherits sys.path."""
    code = """
import multiprocessing

def load_in_child(queue):
    from vllm.plugins import load_general_plugins
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
    load_general_plugins()
    queue.put(getattr(SpinCondition.record_read, "drains_notifications", False))

if __name__ == "__main__":
    from services.engine.vllm_plugins import register
    register()
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=load_in_child, args=(queue,))
    child.start()
    print(queue.get(timeout=240))
    child.join(30)
"""
    script = tmp_path / "plugin_child_check.py"
    script.write_text(code)
    assert run_python(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')") == "True"
