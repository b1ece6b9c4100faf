"""HAProxy with deploy/haproxy.cfg in front of two stand-in replicas (no engine, no app: seconds): a
replica whose engine is down (/healthz 503) but that serves pages (/readyz 200) stays in, and so do
its open connections, past the checks that would take it out; one that cannot serve pages (/readyz
503) is taken out and its pages go to the other. The real replicas behind it, a router stopped
among them: tests/system/scale/test_topology.py (long)."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from harness.balancer import Balancer

# deploy/haproxy.cfg: three failed checks, 2 s then 0.5 s apart, take a replica out
OUT_SECONDS = 6.0
STREAM_LINES = 16  # one every 0.5 s: the stream outlasts OUT_SECONDS


class StandIn(ThreadingHTTPServer):
    """A replica's probes and pages: /readyz as `ready` says, /healthz always 503 (the engine tier is
    down), / names the replica, /stream sends a line every half second."""

    daemon_threads = True

    def __init__(self, name: str, ready: bool) -> None:
        self.name, self.ready = name, ready
        super().__init__(("127.0.0.1", 0), StandInHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


class StandInHandler(BaseHTTPRequestHandler):
    server: StandIn

    def do_GET(self) -> None:
        if self.path == "/stream":
            self.send_response(200)
            self.end_headers()
            for number in range(STREAM_LINES):
                self.wfile.write(f"{self.server.name} {number}\n".encode())
                self.wfile.flush()
                time.sleep(0.5)
            return
        status = {"/readyz": 200 if self.server.ready else 503, "/healthz": 503}.get(self.path, 200)
        body = f"{self.server.name} {self.path}".encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def balancer(tmp_path: Path) -> Iterator[Balancer]:
    replicas = [StandIn("app1", ready=True), StandIn("app2", ready=False)]
    balancer = Balancer([r.address for r in replicas], tmp_path / "haproxy.log").start()
    yield balancer
    balancer.stop()
    for replica in replicas:
        replica.shutdown()
        replica.server_close()


def get(balancer: Balancer, path: str, replica: str) -> str:
    request = urllib.request.Request(balancer.url + path, headers={"Cookie": f"CHAT_REPLICA={replica}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.read().decode()


def test_the_balancer_keeps_replicas_whose_engine_is_down_and_their_connections(balancer: Balancer) -> None:
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(get(balancer, "/stream", "app1").splitlines()))
    reader.start()
    time.sleep(OUT_SECONDS + 2)
    assert get(balancer, "/", "app1") == "app1 /", "its engine is down, yet it serves its pages"
    assert get(balancer, "/", "app2") == "app1 /", "not ready: its pages went to the other"
    reader.join(timeout=30)
    assert lines == [f"app1 {n}" for n in range(STREAM_LINES)], "the open connection was not cut"
    log = balancer.log_path.read_text(errors="replace")
    assert "app2 is DOWN" in log and "app1 is DOWN" not in log, log
