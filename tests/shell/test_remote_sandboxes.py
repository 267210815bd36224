"""`shell.sandboxes._remote`: the SandboxFusion client against a scripted server, and the Modal
classes that fail when built (never when imported)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from shell.errors import ConfigError
from shell.sandboxes import (
    MODAL_UNAVAILABLE,
    SANDBOXFUSION_START,
    ModalSandbox,
    ModalSandboxPool,
    SandboxBackend,
    SandboxFusionClient,
)


class _Server:
    """A scripted SandboxFusion: records each request body and answers with `reply`."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.reply: tuple[int, bytes] = (200, b'{"status": "Success"}')
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                owner.requests.append({"path": self.path, "body": json.loads(body)})
                status, payload = owner.reply
                self.send_response(status)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                return None

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/run_code"


@pytest.fixture
def server() -> Iterator[_Server]:
    scripted = _Server()
    thread = threading.Thread(target=scripted.httpd.serve_forever, daemon=True)
    thread.start()
    yield scripted
    scripted.httpd.shutdown()
    scripted.httpd.server_close()


def _run(client: SandboxFusionClient, **kwargs: Any) -> tuple[bool, dict[str, Any]]:
    async def go() -> tuple[bool, dict[str, Any]]:
        try:
            return await client.run(**kwargs)
        finally:
            await client.close()

    return asyncio.run(go())


def test_run_posts_the_cookbooks_payload_and_reads_success(server: _Server) -> None:
    server.reply = (200, b'{"status": "Success", "run_result": {"stdout": "hi\\n"}}')
    ok, response = _run(
        SandboxFusionClient(url=server.url),
        code="print(open('data.txt').read())",
        files={"data.txt": "héllo"},
        timeout=7.9,
    )
    assert ok is True
    assert response == {"status": "Success", "run_result": {"stdout": "hi\n"}}
    (request,) = server.requests
    assert request["path"] == "/run_code"
    assert request["body"] == {
        "code": "print(open('data.txt').read())",
        "language": "python",
        "run_timeout": 7,
        "files": {"data.txt": base64.b64encode("héllo".encode()).decode()},
    }


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ((200, b'{"status": "Failed", "x": 1}'), {"status": "Failed", "x": 1}),
        (
            (200, b'{"status": "SandboxError", "message": "boom"}'),
            {"error": "boom", "status": "SandboxError", "message": "boom"},
        ),
        ((200, b'{"status": "SandboxError"}'), {"error": "SandboxError", "status": "SandboxError"}),
        ((503, b"busy"), {"error": "HTTP 503: busy"}),
        ((200, b"[1, 2]"), {"error": "SandboxFusion answered [1, 2]; expected a JSON object"}),
    ],
)
def test_failures_come_back_as_false_and_the_response(
    server: _Server, reply: tuple[int, bytes], expected: dict[str, Any]
) -> None:
    server.reply = reply
    ok, response = _run(SandboxFusionClient(url=server.url), code="x", files={}, timeout=1)
    assert ok is False
    assert response == expected
    assert list(response) == list(expected)  # the error first, as the cookbook's


def test_a_body_that_is_not_json_is_an_error(server: _Server) -> None:
    server.reply = (200, b"<html>")
    ok, response = _run(SandboxFusionClient(url=server.url), code="x", files={}, timeout=1)
    assert ok is False
    assert set(response) == {"error"}


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/run_code"


def test_an_unreachable_server_names_sandboxfusion_and_how_to_start_it_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = _closed_port_url()
    client = SandboxFusionClient(url=url)

    async def twice() -> list[tuple[bool, dict[str, Any]]]:
        results = [await client.run("x", {}, 1) for _ in range(2)]
        await client.close()
        return results

    with caplog.at_level(logging.WARNING, logger="shell.sandboxes._remote"):
        results = asyncio.run(twice())
    for ok, response in results:
        assert ok is False
        error = response["error"]
        assert error.startswith(f"SandboxFusion is not reachable at {url} (ConnectError")
        assert error.endswith(f"start it with `{SANDBOXFUSION_START}` or set SANDBOX_URL")
        assert "\n" not in error
    assert [r.getMessage() for r in caplog.records] == [results[0][1]["error"]]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://localhost:99999/run_code", "port 99999 of"),
        ("localhost:8080", "'localhost:8080' is not an http(s) URL with a host"),
    ],
)
def test_a_url_that_names_no_server_is_refused_when_made(url: str, message: str) -> None:
    # a bad port surfaced at the first run as ExceptionGroup(OverflowError), not caught
    with pytest.raises(ValueError, match=re.escape(f"SandboxFusionClient.url: {message}")):
        SandboxFusionClient(url=url)


def test_url_and_concurrency_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, server: _Server
) -> None:
    monkeypatch.setenv("SANDBOX_URL", server.url)
    monkeypatch.setenv("SANDBOX_MAX_CONCURRENCY", "2")
    client = SandboxFusionClient()
    assert (client._url, client._max_concurrency) == (server.url, 2)
    assert _run(client, code="x", files={}, timeout=1)[0] is True
    monkeypatch.delenv("SANDBOX_URL")
    monkeypatch.delenv("SANDBOX_MAX_CONCURRENCY")
    default = SandboxFusionClient()
    assert (default._url, default._max_concurrency) == ("http://localhost:8080/run_code", 4)


def test_concurrent_runs_share_one_client_and_close_reopens(server: _Server) -> None:
    client = SandboxFusionClient(url=server.url, max_concurrency=2)

    async def go() -> list[bool]:
        first = await asyncio.gather(*(client.run(f"print({i})", {}, 1) for i in range(5)))
        await client.close()
        second = await client.run("again", {}, 1)
        await client.close()
        return [ok for ok, _ in [*first, second]]

    assert asyncio.run(go()) == [True] * 6
    assert sorted(r["body"]["code"] for r in server.requests) == sorted(
        [*(f"print({i})" for i in range(5)), "again"]
    )


def test_backends_are_the_cookbooks_names() -> None:
    assert [(m.name, m.value) for m in SandboxBackend] == [
        ("SANDBOXFUSION", "sandboxfusion"),
        ("MODAL", "modal"),
    ]
    assert SandboxBackend("modal") is SandboxBackend.MODAL


def test_modal_classes_fail_when_built_with_one_line() -> None:
    def check(caught: pytest.ExceptionInfo[ConfigError], name: str) -> None:
        assert str(caught.value) == MODAL_UNAVAILABLE.format(name=name)
        assert "\n" not in str(caught.value)
        assert "Modal" in str(caught.value)

    with pytest.raises(ConfigError) as caught:
        asyncio.run(ModalSandbox.create(timeout=5))
    check(caught, "ModalSandbox.create")
    with pytest.raises(ConfigError) as caught:
        ModalSandbox(timeout=1, image=None, app=None, sandbox=None)
    check(caught, "ModalSandbox")
    with pytest.raises(ConfigError) as caught:
        ModalSandboxPool(pool_size=2)
    check(caught, "ModalSandboxPool")
