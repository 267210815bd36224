"""The test helper `running_server` under parallel workers: a port another process takes
between `free_port` and the server's bind is given up for another, and a server already
answering on that port is never taken for ours (tests/serve/server.py)."""

from __future__ import annotations

import threading
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


def test_a_port_taken_before_the_bind_is_replaced_and_the_squatter_not_mistaken_for_ours(
    tmp_path: Path, squatter: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_free_port = server_helper.free_port
    picks = iter([squatter])
    monkeypatch.setattr(server_helper, "free_port", lambda: next(picks, None) or real_free_port())
    with server_helper.running_server(tmp_path / "state") as server:
        assert server.port != squatter
        assert server.process.poll() is None
        assert f"rlpure serve: http://127.0.0.1:{server.port} " in server.log_text()
    first_try = (tmp_path / f"serve-{squatter}.log").read_text()
    assert "cannot listen there" in first_try


def test_a_taken_port_the_caller_chose_is_an_error_not_a_silent_move(
    tmp_path: Path, squatter: int
) -> None:
    with (
        pytest.raises(server_helper.PortTaken, match="cannot listen there"),
        server_helper.running_server(tmp_path / "state", port=squatter),
    ):
        pass
