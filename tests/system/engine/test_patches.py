"""Our workarounds for vLLM (services/memory/vllm_plugins): still needed, still working, found by vLLM.

Each measurement runs in a fresh Python process on glibc, so the malloc totals it
reads are its own. No model: the shared-memory queue's wake-ups and the oneDNN
matmul handlers are vLLM's own code, run as EngineCore and the worker run them.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from vllm import _custom_ops as vllm_ops

ROOT = Path(__file__).resolve().parents[3]
NOTIFICATIONS = 10_000  # ~10 s at the pace below; without the workaround ~250 KB pile up


def run_python(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


def kept_per_notification(patched: bool) -> float:
    code = (
        "from services.memory.vllm_plugins import register\n"
        "register()\n"
        "import vllm_chat_patches\n"
        + ("vllm_chat_patches.drain_busy_readers()\n" if patched else "")
        + f"print(vllm_chat_patches.kept_bytes_per_notification({NOTIFICATIONS}))"
    )
    return float(run_python(code))


@pytest.mark.long  # counts over seconds of a busy engine
def test_vllm_readers_still_pile_up_wake_ups_while_busy() -> None:
    """When this fails, vLLM (or libzmq) no longer keeps a command per wake-up in a busy reader:
    remove drain_busy_readers from services/memory/vllm_plugins/vllm_chat_patches.py and this test."""
    kept = kept_per_notification(patched=False)
    assert kept > 15, f"{kept:.1f} B per wake-up: the workaround is no longer needed"


@pytest.mark.long  # counts over seconds of a busy engine
def test_the_workaround_keeps_nothing_per_wake_up() -> None:
    kept = kept_per_notification(patched=True)
    assert kept < 5, f"{kept:.1f} B per wake-up are still kept"


ONEDNN_SIZES = range(2, 50)  # step sizes M: each builds a primitive (~0.3 MB for this weight)


def kept_by_onednn_handler(limit: int) -> float:
    """Malloc bytes a vLLM oneDNN matmul handler keeps after steps of ONEDNN_SIZES tokens, with
    its primitive cache capped at `limit` (0: vLLM's own) and oneDNN's global cache off."""
    code = f"""
import os
os.environ["ENGINE_ONEDNN_MM_CACHE"] = "{limit}"
os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = "0"
from services.memory.vllm_plugins import register
register()
import torch, vllm_chat_patches
from vllm import _custom_ops as ops
assert vllm_chat_patches.cap_onednn_primitives() == ({limit} > 0)
weight = torch.randn(1536, 576)
handler = ops.create_onednn_mm(weight.t(), {vllm_primitives_per_weight()})
x = torch.randn({max(ONEDNN_SIZES)}, 576)
ops.onednn_mm(handler, x[:1], None)
before = vllm_chat_patches.malloc_in_use_bytes()
for m in {list(ONEDNN_SIZES)}:
    ops.onednn_mm(handler, x[:m], None)
print(vllm_chat_patches.malloc_in_use_bytes() - before)
"""
    return float(run_python(code))


def vllm_primitives_per_weight() -> int:
    """The cache size vLLM's CPU linear layers give each oneDNN matmul handler."""
    from vllm.model_executor.layers import utils

    source = Path(utils.__file__).read_text()
    found = re.findall(r"ops\.create_onednn_mm\(.*,\s*(\d+)\)", source)
    assert found, "vLLM's linear layers no longer pass a literal cache size: see cap_onednn_primitives"
    return int(found[0])


HAS_ONEDNN = bool(getattr(vllm_ops, "_supports_onednn", False))
onednn = pytest.mark.skipif(not HAS_ONEDNN, reason="this vLLM build has no oneDNN matmul (CUDA)")


@pytest.mark.long  # oneDNN's cache over many shapes
@onednn
def test_vllm_still_keeps_many_large_primitives_per_weight() -> None:
    """When this fails, vLLM keeps few primitives per linear layer (or makes it a setting of its own):
    revisit cap_onednn_primitives and ENGINE_ONEDNN_MM_CACHE."""
    assert vllm_primitives_per_weight() > 8
    kept = kept_by_onednn_handler(0)
    assert kept > 5e6, f"{kept / 1e6:.1f} MB kept after {len(ONEDNN_SIZES)} step sizes"


@pytest.mark.long  # oneDNN's cache over many shapes
@onednn
def test_the_cap_keeps_fewer_primitives_per_weight() -> None:
    capped, uncapped = kept_by_onednn_handler(4), kept_by_onednn_handler(0)
    assert capped < uncapped / 4, f"{capped / 1e6:.1f} MB capped at 4, {uncapped / 1e6:.1f} MB uncapped"


def test_vllm_and_the_processes_it_spawns_find_the_workarounds(tmp_path: Path) -> None:
    """vLLM's general plugins are loaded in each of its processes; a spawned child inherits sys.path."""
    code = """
import multiprocessing

def load_in_child(queue):
    from vllm.plugins import load_general_plugins
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
    from vllm import _custom_ops as ops
    load_general_plugins()
    drains = getattr(SpinCondition.record_read, "drains_notifications", False)
    queue.put((drains, getattr(ops.create_onednn_mm, "primitive_cache_limit", None)))

if __name__ == "__main__":
    import os
    from services.memory.vllm_plugins import register
    register()
    os.environ["ENGINE_ONEDNN_MM_CACHE"] = "6"
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=load_in_child, args=(queue,))
    child.start()
    print(queue.get(timeout=240))
    child.join(30)
"""
    script = tmp_path / "plugin_child_check.py"
    script.write_text(code)
    found = run_python(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')")
    assert found == f"(True, {6 if HAS_ONEDNN else None})"
