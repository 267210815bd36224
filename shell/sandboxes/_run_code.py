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
A body that is not such a request, a file name that is absolute, leaves the directory, names
no file (`.`, `x/`) or clashes with another (`x` and `x/y`, `a` and `./a`), content that is not
base64, a `run_timeout` over `MAX_RUN_TIMEOUT` or a `memory_limit_MB` over `MAX_MEMORY_LIMIT_MB`
is refused with HTTP 400 naming the field. The server's memory limit is a cap: a request's
positive `memory_limit_MB` can lower it, not raise it. A run the system refuses (a file it
cannot write, a process it cannot start) is a `"SandboxError"` reply with the error's message.
Fetched files are read inside the run's directory only (no symlink is followed, on the file or
on a folder of its path; only regular files), at most `max_fetch_bytes` in all (more: a
`"SandboxError"`), off the event loop.

Any web page can make a browser post to a loopback port, and DNS rebinding can make a page's
own name resolve to 127.0.0.1, so a request is refused before anything runs when it carries an
`Origin` header (HTTP 403: browsers send one on cross-origin posts; SandboxFusion clients do
not), when its `Host` is not a loopback name (`localhost`, 127.0.0.0/8, `[::1]`; 403), when its
`Content-Type` is not `application/json` (415: a page can post only form and text types without
a CORS preflight), or when its body is over `max_body_bytes` (413, by `Content-Length` or while
streaming).

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
import logging
import math
import os
import shlex
import socket
import stat
import subprocess
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
from shell.loopback import is_loopback_host
from shell.sandboxes._local import LocalSandbox

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_FETCH_BYTES",
    "MAX_MEMORY_LIMIT_MB",
    "MAX_RUN_TIMEOUT",
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

MAX_RUN_TIMEOUT = 3600.0
"""Largest `run_timeout` (seconds) a request may ask for."""

MAX_MEMORY_LIMIT_MB = 1 << 20
"""Largest `memory_limit_MB` a request may give (1 TiB; the server's limit still caps it)."""

DEFAULT_MAX_BODY_BYTES = 64 << 20
"""Largest request body by default (the code, stdin and base64 files)."""

DEFAULT_MAX_FETCH_BYTES = 64 << 20
"""Most bytes of `fetch_files` one reply carries by default (before base64)."""

_CODE_FILE = {"python": "__run_code__.py", "bash": "__run_code__.sh"}
_STDIN_FILE = "__run_code__.stdin"


class _RunRefused(Exception):
    """A run the server cannot complete (answered as a `"SandboxError"` with the message)."""


class RunCodeRequest(msgspec.Struct, frozen=True, kw_only=True):
    """SandboxFusion's `/run_code` request (see the module docstring)."""

    code: str
    language: str = "python"
    compile_timeout: float = 10.0
    run_timeout: Annotated[float, msgspec.Meta(gt=0, le=MAX_RUN_TIMEOUT)] = 10.0
    memory_limit_MB: Annotated[int, msgspec.Meta(le=MAX_MEMORY_LIMIT_MB)] = -1
    stdin: str | None = None
    files: dict[str, str | None] = msgspec.field(default_factory=dict)
    fetch_files: tuple[str, ...] = ()


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
    """`name` as a file's relative path inside the run's directory, else `ValueError` naming
    `field` (absolute, leaving the directory, or naming a folder: `.`, `x/.`, `x/`)."""
    path = PurePosixPath(name)
    parts = name.split("/")
    if path.is_absolute() or ".." in parts or parts[-1] in ("", "."):
        raise ValueError(f"{field}: {name!r} must name a file inside the run's directory")
    return path


def _decoded_files(files: dict[str, str | None]) -> dict[PurePosixPath, bytes]:
    """`files` checked and base64-decoded (a None content is an empty file).

    Raises:
        ValueError: a name `_checked_name` refuses, one naming the same file as an earlier name
            or a file where another's folder is (`x` and `x/y`), or content that is not base64.
    """
    decoded: dict[PurePosixPath, bytes] = {}
    folders: set[PurePosixPath] = set()
    for name, content in files.items():
        path = _checked_name(name, field="files")
        if path in decoded or path in folders or any(p in decoded for p in path.parents):
            raise ValueError(f"files: {name!r} clashes with another name (same file or folder)")
        folders.update(path.parents)
        try:
            decoded[path] = base64.b64decode(content or "", validate=True)
        except binascii.Error as err:
            raise ValueError(f"files[{name!r}]: not base64 ({err})") from None
    return decoded


def _command(request: RunCodeRequest, *, python: str) -> str:
    """The shell command running `request`'s code file (`python` or bash), stdin redirected."""
    interpreter = shlex.quote(python) if request.language == "python" else "/bin/bash"
    command = f"{interpreter} {_CODE_FILE[request.language]}"
    return command + (f" < {_STDIN_FILE}" if request.stdin is not None else "")


def _write_files(workdir: Path, files: dict[PurePosixPath, bytes], request: RunCodeRequest) -> None:
    """Writes the request's files, code and stdin into the fresh `workdir`."""
    for path, content in files.items():
        (workdir / path).parent.mkdir(parents=True, exist_ok=True)
        (workdir / path).write_bytes(content)
    (workdir / _CODE_FILE[request.language]).write_text(request.code)
    if request.stdin is not None:
        (workdir / _STDIN_FILE).write_text(request.stdin)


def _read_inside(root_fd: int, path: PurePosixPath, budget: int) -> bytes | None:
    """The regular file `path` under the directory `root_fd`, following no symlink; None when
    it is absent or not a regular file reached through real folders.

    Raises:
        _RunRefused: the file holds more than `budget` bytes.
    """
    opened: list[int] = []
    try:
        folder = root_fd
        for part in path.parts[:-1]:
            folder = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=folder)
            opened.append(folder)
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK  # a FIFO opens without a writer
        fd = os.open(path.parts[-1], flags, dir_fd=folder)
    except OSError:  # missing, a symlink (ELOOP), a file where a folder should be
        return None
    finally:
        for folder_fd in opened:
            os.close(folder_fd)
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = file.read(budget + 1)
    if len(data) > budget:
        raise _RunRefused("over budget")
    return data


def _fetched(workdir: Path, names: tuple[str, ...], *, max_bytes: int) -> dict[str, str]:
    """The `fetch_files` that are regular files inside `workdir` after the run, base64-encoded.

    Raises:
        _RunRefused: they hold more than `max_bytes` in all.
    """
    fetched: dict[str, str] = {}
    budget = max_bytes
    root_fd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in names:
            try:
                data = _read_inside(root_fd, _checked_name(name, field="fetch_files"), budget)
            except _RunRefused:
                raise _RunRefused(
                    f"fetch_files: more than {max_bytes} bytes in all (at {name!r})"
                ) from None
            if data is not None:
                budget -= len(data)
                fetched[name] = base64.b64encode(data).decode("ascii")
    finally:
        os.close(root_fd)
    return fetched


async def run_code(
    request: RunCodeRequest,
    *,
    python: str = sys.executable,
    memory_limit_bytes: int | None = 1 << 30,
    max_fetch_bytes: int = DEFAULT_MAX_FETCH_BYTES,
) -> RunCodeResponse:
    """Runs `request` in a fresh `LocalSandbox` and answers as SandboxFusion does.

    Args:
        request: the run (see the module docstring).
        python: the interpreter of `language="python"`.
        memory_limit_bytes: each process's address-space limit, which a request's positive
            `memory_limit_MB` can lower but not raise; None: a request's, else none.
        max_fetch_bytes: most bytes of `fetch_files` in the reply.

    Returns:
        The response; a `"SandboxError"` one for a language not served here, a run the system
        refuses (the `OSError`'s message) or fetched files over `max_fetch_bytes`.

    Raises:
        ValueError: a file name `_decoded_files` refuses, or content that is not base64.
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
    limit = memory_limit_bytes
    if request.memory_limit_MB > 0:
        asked = request.memory_limit_MB << 20
        limit = asked if limit is None else min(asked, limit)
    sandbox = LocalSandbox(memory_limit_bytes=limit)
    try:
        return await _run_in(
            sandbox, request, files, python=python, max_fetch_bytes=max_fetch_bytes
        )
    except (OSError, subprocess.SubprocessError, _RunRefused) as err:
        return RunCodeResponse(status="SandboxError", message=f"run_code: {err}")
    finally:
        await sandbox.cleanup()


async def _run_in(
    sandbox: LocalSandbox,
    request: RunCodeRequest,
    files: dict[PurePosixPath, bytes],
    *,
    python: str,
    max_fetch_bytes: int,
) -> RunCodeResponse:
    """`run_code`'s run in `sandbox`: the files written, the command run, the files fetched."""
    workdir = Path(sandbox.sandbox_id)
    await asyncio.to_thread(_write_files, workdir, files, request)
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
    fetched = await asyncio.to_thread(
        _fetched, workdir, request.fetch_files, max_bytes=max_fetch_bytes
    )
    return RunCodeResponse(
        status="Success" if run_result.return_code == 0 else "Failed",
        run_result=run_result,
        files=fetched,
    )


def _host_name(host: str) -> str:
    """The name in a `Host` header without its port (`[::1]:80` → `::1`)."""
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _refusal(request: Request, *, max_body_bytes: int) -> Response | None:
    """The reply refusing a request a web page could have sent, or None (module docstring)."""
    if "origin" in request.headers:
        reason = (
            403,
            f"a request with an Origin header ({request.headers['origin']!r}) is "
            "refused: web pages may not run code here",
        )
    elif not is_loopback_host(_host_name(request.headers.get("host", "")).lower()):
        reason = (
            403,
            f"Host {request.headers.get('host')!r} is not a loopback name (localhost or a "
            "loopback address)",
        )
    elif request.headers.get("content-type", "").split(";")[0].strip().lower() != (
        "application/json"
    ):
        reason = (
            415,
            f"Content-Type {request.headers.get('content-type')!r}: expected application/json",
        )
    elif int(request.headers.get("content-length") or 0) > max_body_bytes:
        reason = (413, f"the body is over {max_body_bytes} bytes")
    else:
        return None
    return Response(f"run_code: {reason[1]}", status_code=reason[0], media_type="text/plain")


async def _body(request: Request, *, max_bytes: int) -> bytes | None:
    """The request's body, or None once it is over `max_bytes` (read no further)."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            return None
    return bytes(body)


def run_code_app(
    *,
    python: str = sys.executable,
    memory_limit_bytes: int | None = 1 << 30,
    max_concurrency: int | None = None,
    max_fetch_bytes: int = DEFAULT_MAX_FETCH_BYTES,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> Starlette:
    """The ASGI app serving `POST /run_code` (see the module docstring).

    Args:
        python: the interpreter of `language="python"`.
        memory_limit_bytes: the cap on each process's address space (`run_code`).
        max_concurrency: runs at once (more wait); None: the number of CPUs.
        max_fetch_bytes: most bytes of fetched files in one reply.
        max_body_bytes: largest request body.

    Raises:
        ValueError: a `max_concurrency` under 1.
    """
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(
            f"run_code_app.max_concurrency: expected >= 1 or None, got {max_concurrency}"
        )
    slots = asyncio.Semaphore(max_concurrency or os.cpu_count() or 1)

    async def handle(request: Request) -> Response:
        if (refused := _refusal(request, max_body_bytes=max_body_bytes)) is not None:
            return refused
        body = await _body(request, max_bytes=max_body_bytes)
        if body is None:
            return Response(
                f"run_code: the body is over {max_body_bytes} bytes",
                status_code=413,
                media_type="text/plain",
            )
        try:
            parsed = _decode_request(body)
            async with slots:
                reply = await run_code(
                    parsed,
                    python=python,
                    memory_limit_bytes=memory_limit_bytes,
                    max_fetch_bytes=max_fetch_bytes,
                )
        except (msgspec.ValidationError, msgspec.DecodeError, ValueError) as err:
            return Response(f"run_code: {err}", status_code=400, media_type="text/plain")
        return Response(_encode(reply), media_type="application/json")

    return Starlette(routes=[Route("/run_code", handle, methods=["POST"])])


def _loopback_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket on the loopback address `host`; `ConfigError` for any other host."""
    if not is_loopback_host(host):
        raise ConfigError(
            f"host {host!r}: the run_code server binds loopback only (LocalSandbox does not "
            "isolate the filesystem)"
        )
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except (OSError, OverflowError) as err:  # OverflowError: a port outside 0-65535
        sock.close()
        raise ConfigError(f"host {host!r}, port {port}: cannot listen there: {err}") from err
    return sock


def _url(sock: socket.socket) -> str:
    """The `/run_code` URL of the bound `sock` (an IPv6 address in brackets)."""
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
        type=_non_negative_int,
        default=1024,
        help="the cap on each process's address space; a request's memory_limit_MB can lower "
        "it, not raise it (0: no cap)",
    )
    parser.add_argument(
        "--max-concurrency",
        type=_positive_int,
        default=None,
        help="runs at once, at least 1 (default: the number of CPUs)",
    )


def _non_negative_int(text: str) -> int:
    """An argparse type: an integer of at least 0 (a negative memory cap used to mean none)."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def _positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


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
