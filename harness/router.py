"""vLLM's router (`vllm-router` from PyPI) in front of vLLM servers, as a child process on loopback."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from harness.server import free_port, stop_tree

ROUTER = Path(sys.executable).with_name("vllm-router")


class VllmRouter:
    """`vllm-router --worker-urls ...` on a free port; conversations stay on one server by the
    X-Session-Id header (policy consistent_hash), a failing server is left out within seconds."""

    def __init__(self, worker_urls: list[str], log_path: Path, policy: str = "consistent_hash") -> None:
        if not ROUTER.exists():
            raise RuntimeError("vllm-router is missing: run scripts/setup.sh --test")
        self.port = free_port()
        self.metrics_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [
            str(ROUTER),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--worker-urls",
            *worker_urls,
            "--policy",
            policy,
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(self.metrics_port),
            "--health-check-interval-secs",
            "2",
            "--health-failure-threshold",
            "1",
            "--cb-failure-threshold",
            "1",
            "--cb-timeout-duration-secs",
            "5",
            "--log-level",
            "warning",
        ]
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 60) -> VllmRouter:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vllm-router exited with {self.process.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(f"{self.url}/list_workers", timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"vllm-router not ready in {timeout} s; see {self.log_path}")

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            return response.read().decode()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None and self.process.poll() is None:
            stop_tree(self.process, [], sig)
