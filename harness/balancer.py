"""Debian's HAProxy with deploy/haproxy.cfg in front of two app replicas, on a free loopback port."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from harness.server import ROOT, free_port, stop_tree

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
CONFIG = ROOT / "deploy" / "haproxy.cfg"


class Balancer:
    """`haproxy -db -f deploy/haproxy.cfg` with the replicas' addresses (host:port) filled in."""

    def __init__(self, replica_addresses: list[str], log_path: Path, port: int | None = None) -> None:
        if not Path(HAPROXY).exists():
            raise RuntimeError("haproxy is missing: run scripts/setup.sh --test")
        if len(replica_addresses) != 2:
            raise ValueError("deploy/haproxy.cfg names two replicas")
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "BALANCER_BIND": f"127.0.0.1:{self.port}",
            "APP1_ADDRESS": replica_addresses[0],
            "APP2_ADDRESS": replica_addresses[1],
        }
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 30) -> Balancer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        check_config = [HAPROXY, "-c", "-f", str(CONFIG)]
        check = subprocess.run(check_config, env=self.env, capture_output=True, text=True, timeout=30)
        if check.returncode != 0:
            raise RuntimeError(f"deploy/haproxy.cfg does not check: {check.stdout}{check.stderr}")
        with self.log_path.open("ab") as log:
            command = [HAPROXY, "-db", "-f", str(CONFIG)]
            self.process = subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"haproxy exited with {self.process.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=2):
                    return self
            except urllib.error.HTTPError:
                return self  # it answers; a replica may still be warming up
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"haproxy not answering in {timeout} s; see {self.log_path}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None and self.process.poll() is None:
            stop_tree(self.process, [], sig)
