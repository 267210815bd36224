"""Starts `rlpure serve` in a subprocess on a free loopback port, for tests that drive it.

`running_server(state_dir, ...)` yields a `Server` (its URL, process and log) once
`/api/v1/healthz` answers, and stops it (SIGTERM, then SIGKILL after a grace period) on exit.
The tests run in parallel pytest-xdist workers, so a port `free_port` picked may be taken by
another process before the server binds it: `running_server` waits for its own server's
banner (printed once its socket is bound) before asking `/healthz` (another process's server
on that port must not pass for it), and picks another port when the bind failed, up to
`BIND_TRIES` times. `sdk_env(server)` is the environment an SDK client needs (`TINKER_BASE_URL`, a `tml-` key,
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
BIND_TRIES = 3


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


class PortTaken(RuntimeError):
    """The server exited because it could not bind its port (another process holds it)."""


def _wait_healthy(server: Server, api_key: str | None) -> None:
    """Returns once this server has bound its port (its banner is in the log) and `/healthz`
    answers; raises `PortTaken` when it exited unable to bind, RuntimeError otherwise."""
    deadline = time.monotonic() + STARTUP_S
    banner = f"rlpure serve: {server.url} "
    request = urllib.request.Request(f"{server.url}/api/v1/healthz")
    if api_key:
        request.add_header("X-API-Key", api_key)
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            log = server.log_text()
            failure = PortTaken if "cannot listen there" in log else RuntimeError
            raise failure(f"rlpure serve exited ({server.process.returncode}):\n{log}")
        if banner not in server.log_text():
            time.sleep(0.2)
            continue
        try:
            with urllib.request.urlopen(request, timeout=2):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    raise RuntimeError(f"rlpure serve did not answer in {STARTUP_S} s:\n{server.log_text()}")


def _start(state_dir: Path, port: int, args: tuple[str, ...], api_key: str | None) -> Server:
    log = state_dir.parent / f"serve-{port}.log"
    command = [RLPURE, "serve", "--port", str(port), "--state-dir", str(state_dir), *args]
    if api_key:
        command += ["--api-key", api_key]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    return Server(f"http://127.0.0.1:{port}", port, state_dir, process, log)


@contextmanager
def running_server(
    state_dir: Path, *args: str, api_key: str | None = None, port: int | None = None
) -> Iterator[Server]:
    """`rlpure serve --state-dir state_dir [args]` on `port` (else a free loopback port, another
    one if that was taken before the server bound it), healthy."""
    for attempt in range(1, BIND_TRIES + 1):
        server = _start(state_dir, port or free_port(), args, api_key)
        try:
            _wait_healthy(server, api_key)
            break
        except PortTaken:
            server.stop()
            if port is not None or attempt == BIND_TRIES:
                raise
        except BaseException:
            server.stop()
            raise
    try:
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
