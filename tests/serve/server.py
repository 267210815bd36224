"""Starts `rlpure serve` in a subprocess on a loopback port, for tests that drive it.

`running_server(state_dir, ...)` yields a `Server` (its URL, process and log) once
`/api/v1/healthz` answers, and stops it (SIGTERM, then SIGKILL after a grace period) on exit.
Without a `port`, the server binds one of its own choosing (`--port 0`) and the helper reads
it from the banner `rlpure serve` prints once bound: a port picked here and handed over could
be taken by another process first (the suite runs in parallel pytest-xdist workers), and
whatever answered `/healthz` there would pass for this server. `free_port` is for tests that
need a port nobody listens on. `sdk_env(server)` is the environment an SDK client needs
(`TINKER_BASE_URL`, a `tml-` key, telemetry off), for `monkeypatch.setenv` or a child
process. The server inherits the test session's `RLPURE_HOME` (tests/conftest.py), so nothing
is written under the user's home. `assert_same_output` compares two `forward_backward` results
bit for bit (the server and an in-process client run the same programs on the same inputs).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from tinker import types

RLPURE = str(Path(sys.executable).with_name("rlpure"))
STARTUP_S = 120.0
_BANNER = re.compile(r"rlpure serve: http://127\.0\.0\.1:(\d+) ")


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


def _bound_port(process: subprocess.Popen[bytes], log: Path) -> int:
    """The port in the server's banner, once it has bound one; RuntimeError when it exits
    first (a taken `--port`: "cannot listen there") or stays silent for `STARTUP_S`."""
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        found = _BANNER.search(log.read_text(errors="replace"))
        if found:
            return int(found.group(1))
        if process.poll() is not None:
            text = log.read_text(errors="replace")
            raise RuntimeError(f"rlpure serve exited ({process.returncode}):\n{text}")
        time.sleep(0.1)
    raise RuntimeError(f"rlpure serve bound no port in {STARTUP_S} s:\n{log.read_text()}")


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
    """`rlpure serve --state-dir state_dir [args]` on `port`, else on a loopback port it
    chooses itself (read from its banner), healthy."""
    handle, name = tempfile.mkstemp(prefix="serve-", suffix=".log", dir=state_dir.parent)
    os.close(handle)
    log = Path(name)
    command = [RLPURE, "serve", "--port", str(port or 0), "--state-dir", str(state_dir), *args]
    if api_key:
        command += ["--api-key", api_key]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    server = Server("", 0, state_dir, process, log)
    try:
        bound = _bound_port(process, log)
        server = replace(server, url=f"http://127.0.0.1:{bound}", port=bound)
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


def assert_same_output(
    served: types.ForwardBackwardOutput, reference: types.ForwardBackwardOutput
) -> None:
    """Equal metrics and equal per-datum output arrays, bit for bit."""
    assert served.metrics == reference.metrics
    assert len(served.loss_fn_outputs) == len(reference.loss_fn_outputs)
    for got, want in zip(served.loss_fn_outputs, reference.loss_fn_outputs, strict=True):
        assert got.keys() == want.keys()
        for key in want:
            np.testing.assert_array_equal(got[key].to_numpy(), want[key].to_numpy(), err_msg=key)
