"""`shell.sandboxes._run_code`: SandboxFusion's `POST /run_code` over `LocalSandbox`, on loopback.

Driven through the project's own `SandboxFusionClient` (the cookbook's client's signature and
results), so what a cookbook grader sees is what is checked: the response's fields, files beside
the code, stdin, exit codes, timeouts, memory limits, fetched files, refused requests, and that
the server binds loopback addresses only.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from pathlib import Path
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

JSON = {"Content-Type": "application/json"}


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


# --- what a web page or a hostile request can and cannot do ------------------------------------


@pytest.mark.parametrize(
    ("headers", "status", "named"),
    [
        ({"Content-Type": "text/plain"}, 415, "Content-Type"),  # a form post, no CORS preflight
        ({"Content-Type": "application/x-www-form-urlencoded"}, 415, "Content-Type"),
        ({"Origin": "http://evil.example"}, 403, "Origin"),
        ({"Origin": "http://127.0.0.1:8080"}, 403, "Origin"),
        ({"Host": "evil.example"}, 403, "Host"),  # DNS rebinding
        ({"Host": "evil.example:8080"}, 403, "Host"),
        ({"Host": "10.0.0.1:8080"}, 403, "Host"),
    ],
)
def test_a_request_a_browser_could_send_is_refused_before_running(
    url: str, tmp_path: Path, headers: dict[str, str], status: int, named: str
) -> None:
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w').write('x')"
    reply = httpx.post(
        url,
        content=json.dumps({"code": code}),
        headers={"Content-Type": "application/json", **headers},
        timeout=30,
    )
    assert reply.status_code == status and named in reply.text, reply.text
    assert not marker.exists()


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::1]", "127.0.0.2"])
def test_the_loopback_host_names_are_served(url: str, host: str) -> None:
    # 127.0.0.2: the server may bind any of 127.0.0.0/8, and was then refusing every request
    port = url.rsplit(":", 1)[1].split("/")[0]
    reply = httpx.post(
        url,
        json={"code": "print(1)"},
        headers={"Host": f"{host}:{port}", "Content-Type": "application/json; charset=utf-8"},
        timeout=30,
    )
    assert reply.status_code == 200 and reply.json()["status"] == "Success", reply.text


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"code": "1", "files": {".": ""}}, "files: '.'"),
        ({"code": "1", "files": {"x/.": ""}}, "files: 'x/.'"),
        ({"code": "1", "files": {"x": "", "x/y": ""}}, "files: 'x/y'"),
        ({"code": "1", "files": {"a": "", "./a": ""}}, "files: './a'"),
        ({"code": "1", "fetch_files": ["."]}, "fetch_files: '.'"),
        ({"code": "1", "memory_limit_MB": 2**50}, "memory_limit_MB"),
        ({"code": "1", "run_timeout": 1e300}, "run_timeout"),
    ],
)
def test_a_request_the_server_cannot_honour_is_refused_naming_the_field(
    url: str, body: dict[str, Any], named: str
) -> None:
    reply = httpx.post(url, content=json.dumps(body), headers=JSON, timeout=30)
    assert reply.status_code == 400 and named in reply.text, reply.text


def test_a_file_the_system_refuses_is_a_sandbox_error_naming_it(url: str) -> None:
    reply = httpx.post(url, json={"code": "1", "files": {"x" * 300: ""}}, timeout=30).json()
    assert reply["status"] == "SandboxError" and "File name too long" in reply["message"], reply


def test_the_servers_memory_limit_caps_a_requests() -> None:
    """`--memory-limit-mb` is a cap: a request asking for more gets the server's."""
    hog = {"code": "x = bytearray(512 << 20); print('allocated')", "memory_limit_MB": 4096}
    with running_run_code_server(run_code_app(memory_limit_bytes=256 << 20)) as capped:
        reply = httpx.post(capped, json=hog, timeout=30).json()
        small = httpx.post(capped, json={**hog, "memory_limit_MB": 64}, timeout=30).json()
        tiny = {"code": "x = bytearray(100 << 20)", "memory_limit_MB": 64}
        lower = httpx.post(capped, json=tiny, timeout=30).json()
    assert reply["status"] == "Failed" and "MemoryError" in reply["run_result"]["stderr"], reply
    assert small["status"] == "Failed" and lower["status"] == "Failed", (small, lower)
    assert "MemoryError" in lower["run_result"]["stderr"], lower


def test_fetched_files_stay_inside_the_run_directory(url: str) -> None:
    """A symlink (as the file or a folder on its path) or a FIFO is not fetched; a file is."""
    code = (
        "import os; os.symlink('/etc/hostname', 'link'); os.symlink('/etc', 'etc'); "
        "os.mkfifo('pipe'); open('plain', 'w').write('ok')"
    )
    body = {"code": code, "fetch_files": ["link", "etc/hostname", "pipe", "plain"]}
    reply = httpx.post(url, json=body, timeout=30).json()
    assert reply["status"] == "Success", reply
    assert reply["files"] == {"plain": base64.b64encode(b"ok").decode()}, reply


def test_fetched_bytes_and_request_bodies_are_capped() -> None:
    app = run_code_app(max_fetch_bytes=1000, max_body_bytes=10_000)
    with running_run_code_server(app) as capped:
        code = "open('a', 'wb').write(b'x' * 600); open('b', 'wb').write(b'y' * 600)"
        reply = httpx.post(capped, json={"code": code, "fetch_files": ["a"]}, timeout=30).json()
        assert reply["status"] == "Success" and len(reply["files"]) == 1, reply
        both = httpx.post(capped, json={"code": code, "fetch_files": ["a", "b"]}, timeout=30)
        assert both.json()["status"] == "SandboxError", both.text
        assert "fetch_files" in both.json()["message"] and "1000" in both.json()["message"]
        big = {"code": "#" + "x" * 20_000}
        sized = httpx.post(capped, json=big, timeout=30)
        assert sized.status_code == 413 and "10000" in sized.text, sized.text

        def chunks() -> Iterator[bytes]:  # no Content-Length: the stream is counted
            yield json.dumps(big).encode()

        streamed = httpx.post(capped, content=chunks(), headers=JSON, timeout=30)
        assert streamed.status_code == 413 and "10000" in streamed.text, streamed.text


def test_max_concurrency_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_concurrency"):
        run_code_app(max_concurrency=0)


def test_a_negative_memory_limit_is_refused_not_read_as_no_cap(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # any value <= 0 used to mean "no cap": a typo silently removed the limit
    from shell import cli

    with pytest.raises(SystemExit) as exited:
        cli.main(["sandbox-serve", "--port", "0", "--memory-limit-mb", "-5"])
    assert exited.value.code == 2
    assert "--memory-limit-mb: expected an integer >= 0, got -5" in capsys.readouterr().err
