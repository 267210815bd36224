"""Starts `rlpure serve` in a subprocess on a free loopback port, for tests that drive it.

`running_server(state_dir, ...)` yields a `Server` (its URL, process and log) once
`/api/v1/healthz` answers, and stops it (SIGTERM, then SIGKILL after a grace period) on exit.
`sdk_env(server)` is the environment an SDK client needs (`TINKER_BASE_URL`, a `tml-` key,
telemetry off), for `monkeypatch.setenv` or a child process. The server inherits the test
session's `RLPURE_HOME` (tests/conftest.py), so nothing is written under the user's home.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

RLPURE = str(Path(sys.executable).with_name("rlpure"))
STARTUP_S = 120.0


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    url: str
    port: int
    state_dir: Path
    process: subprocess.Popen[bytes]
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60.0) -> int:
        """Sends `sig` and waits; returns the exit code (kills after `timeout_s`)."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return int(self.process.returncode)


def _wait_healthy(server: Server, api_key: str | None) -> None:
    deadline = time.monotonic() + STARTUP_S
    request = urllib.request.Request(f"{server.url}/api/v1/healthz")
    if api_key:
        request.add_header("X-API-Key", api_key)
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(
                f"rlpure serve exited ({server.process.returncode}):\n{server.log_text()}"
            )
        try:
            with urllib.request.urlopen(request, timeout=2):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    raise RuntimeError(f"rlpure serve did not answer in {STARTUP_S} s:\n{server.log_text()}")


@contextmanager
def running_server(
    state_dir: Path, *args: str, api_key: str | None = None, port: int | None = None
) -> Iterator[Server]:
    """`rlpure serve --state-dir state_dir [args]` on a free loopback port, healthy."""
    port = port or free_port()
    log = state_dir.parent / f"serve-{port}.log"
    command = [RLPURE, "serve", "--port", str(port), "--state-dir", str(state_dir), *args]
    if api_key:
        command += ["--api-key", api_key]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    server = Server(f"http://127.0.0.1:{port}", port, state_dir, process, log)
    try:
        _wait_healthy(server, api_key)
        yield server
    finally:
        server.stop()


def sdk_env(server: Server, api_key: str = "tml-local") -> dict[str, str]:
    """What an SDK client needs to reach `server`."""
    return {
        "TINKER_BASE_URL": server.url,
        "TINKER_API_KEY": api_key,
        "TINKER_TELEMETRY": "0",
    }


def child_env(server: Server, api_key: str = "tml-local") -> dict[str, str]:
    """This process's environment plus `sdk_env`, for a client subprocess."""
    return {**os.environ, **sdk_env(server, api_key)}
