"""`shell.sandboxes._run_code`: SandboxFusion's `POST /run_code` over `LocalSandbox`, on loopback.

Driven through the project's own `SandboxFusionClient` (the cookbook's client's signature and
results), so what a cookbook grader sees is what is checked: the response's fields, files beside
the code, stdin, exit codes, timeouts, memory limits, fetched files, refused requests, and that
the server binds loopback addresses only.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from shell.errors import ConfigError
from shell.jobs import COMMANDS
from shell.sandboxes import (
    SandboxFusionClient,
    run_code_app,
    running_run_code_server,
    serve_run_code,
)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with running_run_code_server(run_code_app(max_concurrency=2)) as served:
        yield served


def _run(url: str, code: str, **options: Any) -> tuple[bool, dict[str, Any]]:
    async def call() -> tuple[bool, dict[str, Any]]:
        client = SandboxFusionClient(url=url)
        try:
            return await client.run(code, **{"files": {}, "timeout": 10, **options})
        finally:
            await client.close()

    return asyncio.run(call())


def test_a_run_that_exits_0_is_a_success_with_the_files_beside_the_code(url: str) -> None:
    code = "import helper, sys; print(helper.X, open('data/in.txt').read()); print('e', file=sys.stderr)"
    ok, reply = _run(url, code, files={"helper.py": "X = 41 + 1", "data/in.txt": "héllo"})
    assert ok, reply
    assert reply["status"] == "Success" and reply["message"] == ""
    assert reply["compile_result"] is None and reply["executor_pod_name"] is None
    run = reply["run_result"]
    assert (run["status"], run["return_code"]) == ("Finished", 0)
    assert (run["stdout"], run["stderr"]) == ("42 héllo\n", "e\n")
    assert 0.0 < run["execution_time"] < 10.0


def test_a_nonzero_exit_is_failed(url: str) -> None:
    ok, reply = _run(url, "import sys; print('no'); sys.exit(3)")
    assert not ok
    assert reply["status"] == "Failed"
    assert reply["run_result"]["return_code"] == 3 and reply["run_result"]["stdout"] == "no\n"


def test_a_run_past_its_timeout_is_killed(url: str) -> None:
    ok, reply = _run(url, "import time; print('started', flush=True); time.sleep(30)", timeout=1)
    assert not ok and reply["status"] == "Failed"
    run = reply["run_result"]
    assert run["status"] == "TimeLimitExceeded" and run["return_code"] is None
    assert run["stdout"] == "started\n" and run["execution_time"] < 10


def test_stdin_memory_limit_and_fetched_files_over_raw_http(url: str) -> None:
    """Fields the cookbook's client does not send, as SandboxFusion takes them."""
    body = {
        "code": "import sys; open('out.bin', 'wb').write(sys.stdin.read().encode()[::-1])",
        "language": "python",
        "stdin": "abc",
        "fetch_files": ["out.bin", "missing.txt"],
    }
    reply = httpx.post(url, json=body, timeout=30).json()
    assert reply["status"] == "Success", reply
    assert reply["files"] == {"out.bin": base64.b64encode(b"cba").decode()}
    hog = {"code": "x = bytearray(512 << 20)", "memory_limit_MB": 128}
    reply = httpx.post(url, json=hog, timeout=30).json()
    assert reply["status"] == "Failed" and "MemoryError" in reply["run_result"]["stderr"], reply


def test_bash_runs_and_other_languages_are_a_sandbox_error(url: str) -> None:
    ok, reply = _run(url, "echo $((6 * 7))", language="bash")
    assert ok and reply["run_result"]["stdout"] == "42\n"
    ok, reply = _run(url, "int main() {}", language="cpp")
    assert not ok and reply["status"] == "SandboxError"
    assert "'cpp' is not served here" in reply["error"]


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"code": "1", "files": {"../escape.py": ""}}, "files: '../escape.py'"),
        ({"code": "1", "files": {"/etc/x": ""}}, "files: '/etc/x'"),
        ({"code": "1", "files": {"a.py": "not base64!"}}, "files['a.py']: not base64"),
        ({"code": "1", "fetch_files": ["../x"]}, "fetch_files: '../x'"),
        ({"code": "1", "files": {"__run_code__.py": ""}}, "the server's own names"),
        ({"code": "1", "run_timeout": 0}, "run_timeout"),
        ({"language": "python"}, "code"),
    ],
)
def test_a_malformed_request_is_refused_naming_the_field(
    url: str, body: dict[str, Any], named: str
) -> None:
    reply = httpx.post(url, json=body, timeout=30)
    assert reply.status_code == 400 and named in reply.text, reply.text


def test_the_server_binds_loopback_only() -> None:
    with pytest.raises(ConfigError, match="loopback only"):
        serve_run_code(host="0.0.0.0", port=0)
    with (
        pytest.raises(ConfigError, match="loopback only"),
        running_run_code_server(host="192.0.2.1"),
    ):
        pass


def test_rlpure_sandbox_serve_is_a_command() -> None:
    command = COMMANDS["sandbox-serve"]
    assert command.add_arguments is not None and "SANDBOX_URL" in (command.description or "")
