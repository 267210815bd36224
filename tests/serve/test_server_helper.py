"""The test helper `running_server` under parallel workers: without a port, the server binds
one of its own choosing and the helper reads it from the banner, so no other process can take
it first; a port the caller gives that another process holds is an error, and whatever
answers on it is never taken for the server (tests/serve/server.py)."""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.serve import server as server_helper


class _AnswersEverything(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def squatter() -> Iterator[int]:
    """A port held by an HTTP server that answers every GET with 200 (as `/healthz` would)."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _AnswersEverything)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(httpd.server_address[1])
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_the_server_chooses_its_port_and_the_helper_reads_it_from_the_banner(
    tmp_path: Path, squatter: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # were the helper to pick the port itself, it would pick the squatter's
    monkeypatch.setattr(server_helper, "free_port", lambda: squatter)
    with server_helper.running_server(tmp_path / "state") as server:
        assert server.port not in (0, squatter)
        assert server.process.poll() is None
        assert f"rlpure serve: {server.url} " in server.log_text()
        with urllib.request.urlopen(f"{server.url}/api/v1/healthz", timeout=10) as reply:
            assert reply.status == 200


def test_a_given_port_another_process_holds_is_an_error_not_the_other_server(
    tmp_path: Path, squatter: int
) -> None:
    with (
        pytest.raises(RuntimeError, match="cannot listen there"),
        server_helper.running_server(tmp_path / "state", port=squatter),
    ):
        pass
