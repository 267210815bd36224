"""A SandboxFusion-compatible `POST /run_code` endpoint over `LocalSandbox`, on loopback only.

The cookbook's `SandboxFusionClient` (and `shell.sandboxes.SandboxFusionClient`) talks to a
SandboxFusion server, a docker container. This serves the same request and response on this
machine, each run in a fresh `LocalSandbox` (a temporary directory, a subprocess with time and
memory limits and, where the kernel allows, no network; its docstring says what is and is not
enforced), so a recipe whose grader uses SandboxFusion runs unchanged: start
`rlpure sandbox-serve` (port 8080, the client's default URL) or set `SANDBOX_URL`.

The wire format (SandboxFusion's `RunCodeRequest` / `RunCodeResponse`):
- request: `code`, `language` (`python` or `bash` here), `run_timeout` (seconds), `stdin`,
  `memory_limit_MB` (-1: the server's limit), `files` (name → base64 content, written beside
  the code), `fetch_files` (names whose content comes back base64-encoded); `compile_timeout`
  is accepted and unused (no compiled language is served);
- response: `status` `"Success"` (the run finished with exit code 0), `"Failed"` (it did not),
  or `"SandboxError"` (a language this server does not run); `run_result` with its `status`
  (`"Finished"` or `"TimeLimitExceeded"`), `execution_time`, `return_code` (None after a
  timeout), `stdout`, `stderr`; `compile_result` and `executor_pod_name` are null.
A body that is not such a request, a file name that is absolute or leaves the directory, or
content that is not base64 is refused with HTTP 400 naming the field.

Deliberate differences from SandboxFusion: the timeout is rounded up to whole seconds
(`LocalSandbox`'s); there is no container, so filesystem isolation is not enforced — which is
why the server binds loopback addresses only.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import contextlib
import ipaddress
import logging
import math
import os
import shlex
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Annotated, Literal

import msgspec
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from shell.commands import Command
from shell.errors import ConfigError
from shell.sandboxes._local import LocalSandbox

__all__ = [
    "RUN_CODE_COMMAND",
    "CommandRunResult",
    "RunCodeRequest",
    "RunCodeResponse",
    "run_code",
    "run_code_app",
    "running_run_code_server",
    "serve_run_code",
]

logger = logging.getLogger(__name__)

LANGUAGES = ("python", "bash")
"""The `language` values this server runs."""

_CODE_FILE = {"python": "__run_code__.py", "bash": "__run_code__.sh"}
_STDIN_FILE = "__run_code__.stdin"


class RunCodeRequest(msgspec.Struct, frozen=True, kw_only=True):
    """SandboxFusion's `/run_code` request (see the module docstring)."""

    code: str
    language: str = "python"
    compile_timeout: float = 10.0
    run_timeout: Annotated[float, msgspec.Meta(gt=0)] = 10.0
    memory_limit_MB: int = -1
    stdin: str | None = None
    files: dict[str, str | None] = msgspec.field(default_factory=dict)
    fetch_files: list[str] = msgspec.field(default_factory=list)


class CommandRunResult(msgspec.Struct, frozen=True, kw_only=True):
    """One command's outcome, as SandboxFusion reports it."""

    status: Literal["Finished", "TimeLimitExceeded"]
    execution_time: float
    return_code: int | None
    stdout: str
    stderr: str


class RunCodeResponse(msgspec.Struct, frozen=True, kw_only=True):
    """SandboxFusion's `/run_code` response (see the module docstring)."""

    status: Literal["Success", "Failed", "SandboxError"]
    message: str = ""
    compile_result: None = None
    run_result: CommandRunResult | None = None
    executor_pod_name: None = None
    files: dict[str, str] = msgspec.field(default_factory=dict)


_decode_request = msgspec.json.Decoder(RunCodeRequest).decode
_encode = msgspec.json.Encoder().encode


def _checked_name(name: str, *, field: str) -> PurePosixPath:
    """`name` as a relative path inside the run's directory, else `ValueError` naming `field`."""
    path = PurePosixPath(name)
    if not name or path.is_absolute() or ".." in path.parts:
        raise ValueError(f"{field}: {name!r} must be a relative path inside the run's directory")
    return path


def _decoded_files(files: dict[str, str | None]) -> dict[PurePosixPath, bytes]:
    """`files` checked and base64-decoded (a None content is an empty file)."""
    decoded: dict[PurePosixPath, bytes] = {}
    for name, content in files.items():
        path = _checked_name(name, field="files")
        try:
            decoded[path] = base64.b64decode(content or "", validate=True)
        except binascii.Error as err:
            raise ValueError(f"files[{name!r}]: not base64 ({err})") from None
    return decoded


def _command(request: RunCodeRequest, *, python: str) -> str:
    interpreter = shlex.quote(python) if request.language == "python" else "/bin/bash"
    command = f"{interpreter} {_CODE_FILE[request.language]}"
    return command + (f" < {_STDIN_FILE}" if request.stdin is not None else "")


def _fetched(workdir: Path, names: list[str]) -> dict[str, str]:
    """The `fetch_files` that exist after the run, base64-encoded."""
    fetched: dict[str, str] = {}
    for name in names:
        path = workdir / _checked_name(name, field="fetch_files")
        if path.is_file():
            fetched[name] = base64.b64encode(path.read_bytes()).decode("ascii")
    return fetched


async def run_code(
    request: RunCodeRequest,
    *,
    python: str = sys.executable,
    memory_limit_bytes: int | None = 1 << 30,
) -> RunCodeResponse:
    """Runs `request` in a fresh `LocalSandbox` and answers as SandboxFusion does.

    Args:
        request: the run (see the module docstring).
        python: the interpreter of `language="python"`.
        memory_limit_bytes: each process's address-space limit when the request's
            `memory_limit_MB` is not positive; None: none.

    Raises:
        ValueError: a file name outside the run's directory or content that is not base64.
    """
    if request.language not in LANGUAGES:
        return RunCodeResponse(
            status="SandboxError",
            message=f"language {request.language!r} is not served here (only {LANGUAGES})",
        )
    files = _decoded_files(request.files)
    reserved = {PurePosixPath(_CODE_FILE[request.language]), PurePosixPath(_STDIN_FILE)}
    if taken := sorted(str(path) for path in reserved & files.keys()):
        raise ValueError(f"files: {taken} are the server's own names for the code and stdin")
    for name in request.fetch_files:
        _checked_name(name, field="fetch_files")
    limit = request.memory_limit_MB << 20 if request.memory_limit_MB > 0 else memory_limit_bytes
    sandbox = LocalSandbox(memory_limit_bytes=limit)
    try:
        workdir = Path(sandbox.sandbox_id)
        for path, content in files.items():
            (workdir / path).parent.mkdir(parents=True, exist_ok=True)
            (workdir / path).write_bytes(content)
        (workdir / _CODE_FILE[request.language]).write_text(request.code)
        if request.stdin is not None:
            (workdir / _STDIN_FILE).write_text(request.stdin)
        started = time.monotonic()
        result = await sandbox.run_command(
            _command(request, python=python), timeout=math.ceil(request.run_timeout)
        )
        elapsed = time.monotonic() - started
        timed_out = bool(result.metrics.get("timed_out"))
        run_result = CommandRunResult(
            status="TimeLimitExceeded" if timed_out else "Finished",
            execution_time=elapsed,
            return_code=None if timed_out else result.exit_code,
            stdout=result.stdout,
            stderr=result.stderr,
        )
        return RunCodeResponse(
            status="Success" if run_result.return_code == 0 else "Failed",
            run_result=run_result,
            files=_fetched(workdir, request.fetch_files),
        )
    finally:
        await sandbox.cleanup()


def run_code_app(
    *,
    python: str = sys.executable,
    memory_limit_bytes: int | None = 1 << 30,
    max_concurrency: int | None = None,
) -> Starlette:
    """The ASGI app serving `POST /run_code` (see the module docstring).

    Args:
        python: the interpreter of `language="python"`.
        memory_limit_bytes: the default address-space limit of each process (`run_code`).
        max_concurrency: runs at once (more wait); None: the number of CPUs.
    """
    slots = asyncio.Semaphore(max_concurrency or os.cpu_count() or 1)

    async def handle(request: Request) -> Response:
        try:
            parsed = _decode_request(await request.body())
            async with slots:
                reply = await run_code(parsed, python=python, memory_limit_bytes=memory_limit_bytes)
        except (msgspec.ValidationError, msgspec.DecodeError, ValueError) as err:
            return Response(f"run_code: {err}", status_code=400, media_type="text/plain")
        return Response(_encode(reply), media_type="application/json")

    return Starlette(routes=[Route("/run_code", handle, methods=["POST"])])


def _loopback_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket on the loopback address `host`; `ConfigError` for any other host."""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise ConfigError(
            f"host {host!r}: the run_code server binds loopback only (LocalSandbox does not "
            "isolate the filesystem)"
        )
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise ConfigError(f"host {host!r}, port {port}: cannot listen there: {err}") from err
    return sock


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/run_code"


@contextlib.contextmanager
def running_run_code_server(
    app: Starlette | None = None, *, host: str = "127.0.0.1", port: int = 0
) -> Iterator[str]:
    """Serves `app` on a background thread until the block ends; yields its `/run_code` URL.

    Args:
        app: what to serve; None: `run_code_app()`.
        host: a loopback address.
        port: the port; 0 picks a free one.

    Raises:
        ConfigError: a host that is not loopback, or a port that cannot be bound.
    """
    sock = _loopback_socket(host, port)
    config = uvicorn.Config(app or run_code_app(), log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the run_code server stopped while starting")
            time.sleep(0.01)
        yield _url(sock)
    finally:
        server.should_exit = True
        thread.join()
        sock.close()


def serve_run_code(
    app: Starlette | None = None, *, host: str = "127.0.0.1", port: int = 8080
) -> int:
    """Serves `app` (None: `run_code_app()`) until SIGINT/SIGTERM; returns the exit code.

    Raises:
        ConfigError: a host that is not loopback, or a port that cannot be bound.
    """
    sock = _loopback_socket(host, port)
    url = _url(sock)
    print(f"run_code (SandboxFusion's API) on {url}: SANDBOX_URL={url}", flush=True)
    config = uvicorn.Config(app or run_code_app(), lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])
    return 0


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="a loopback address")
    parser.add_argument(
        "--port", type=int, default=8080, help="port (default 8080, the client's; 0: any free one)"
    )
    parser.add_argument(
        "--python", default=sys.executable, help="the interpreter of language=python runs"
    )
    parser.add_argument(
        "--memory-limit-mb",
        type=int,
        default=1024,
        help="each process's address-space limit when a request sets none (0: no limit)",
    )
    parser.add_argument(
        "--max-concurrency", type=int, default=None, help="runs at once (default: the CPUs)"
    )


def _run(args: argparse.Namespace) -> int:
    app = run_code_app(
        python=args.python,
        memory_limit_bytes=args.memory_limit_mb << 20 if args.memory_limit_mb > 0 else None,
        max_concurrency=args.max_concurrency,
    )
    return serve_run_code(app, host=args.host, port=args.port)


RUN_CODE_COMMAND = Command(
    "sandbox-serve",
    help="Serve SandboxFusion's run_code API on localhost over local subprocess sandboxes, so "
    "cookbook graders that use SandboxFusion (code_rl) run without docker.",
    run=_run,
    add_arguments=_add_arguments,
    description=(
        "Serves POST /run_code as SandboxFusion does, each run in a fresh LocalSandbox (a "
        "temporary directory, time and memory limits, no network where the kernel allows; no "
        "filesystem isolation, so loopback only). The cookbook's SandboxFusionClient reaches it "
        "at its default URL (port 8080) or at SANDBOX_URL=http://127.0.0.1:PORT/run_code."
    ),
)
"""`rlpure sandbox-serve`: `serve_run_code` with the interpreter, memory limit and concurrency."""
