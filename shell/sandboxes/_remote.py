"""The cookbook's remote sandbox backends: SandboxFusion and Modal.

- `SandboxBackend` names them (`"sandboxfusion"`, `"modal"`), as recipe configs do.
- `SandboxFusionClient` is a working client of SandboxFusion's HTTP API (`POST /run_code`), the
  cookbook's signature and results: `run(code, files, timeout, language)` gives
  `(success, response)`, `success` only for `status == "Success"`, and an outside failure (the
  service unreachable, an HTTP error, a body that is not JSON) comes back as
  `(False, {"error": ...})`. SandboxFusion is a docker container rlpure does not run: when it is
  unreachable the error names it and the command that starts it, and is logged once per client.
  The HTTP client is `httpx` (the cookbook's is `aiohttp`, which rlpure does not depend on).
- `ModalSandbox` and `ModalSandboxPool` keep the cookbook's classes and signatures; Modal is a
  cloud service this project does not integrate, so building either raises `ConfigError` with
  one line saying what to use instead. They import without `modal` (the cookbook's module does
  not), so recipes that only name them still import.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
from enum import StrEnum
from typing import Any, NoReturn

import httpx

from shell.errors import ConfigError
from shell.sandboxes._interface import SandboxResult

__all__ = [
    "MODAL_UNAVAILABLE",
    "SANDBOXFUSION_START",
    "ModalSandbox",
    "ModalSandboxPool",
    "SandboxBackend",
    "SandboxFusionClient",
]

logger = logging.getLogger(__name__)

SANDBOXFUSION_START = "docker run -it -p 8080:8080 volcengine/sandbox-fusion:server-20250609"
"""The command that starts a SandboxFusion server on port 8080 (the cookbook's)."""

MODAL_UNAVAILABLE = (
    "{name}: Modal (modal.com) is a cloud sandbox service rlpure does not integrate; install "
    "tinker-cookbook[modal] and use its tinker_cookbook.sandbox.modal_sandbox, or give the "
    "recipe a local sandbox (shell.cookbook.sandbox.LocalSandbox, or "
    "sandbox_backend=sandboxfusion with a SandboxFusion server)"
)
"""The one-line error of every Modal entry point (`{name}` is the class or method)."""

_DEFAULT_URL = "http://localhost:8080/run_code"
_TOTAL_TIMEOUT_S = 6000.0  # the cookbook's aiohttp total timeout


class SandboxBackend(StrEnum):
    """The code-execution backends a cookbook recipe can choose."""

    SANDBOXFUSION = "sandboxfusion"
    MODAL = "modal"


def _checked_url(url: str) -> str:
    """`url` if it can name a SandboxFusion server: http(s), a host, a port in [1, 65535].

    Raises:
        ValueError: naming the URL and what is wrong (a bad port used to surface at the first
            run as an `ExceptionGroup(OverflowError)` from the connection).
    """
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as err:
        raise ValueError(f"SandboxFusionClient.url: {url!r} is not a URL ({err})") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"SandboxFusionClient.url: {url!r} is not an http(s) URL with a host")
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise ValueError(
            f"SandboxFusionClient.url: port {parsed.port} of {url!r} is not in [1, 65535]"
        )
    return url


class SandboxFusionClient:
    """Async client of a SandboxFusion server (a docker container: `SANDBOXFUSION_START`).

    Args:
        url: the `run_code` endpoint; None reads `SANDBOX_URL` (default
            `http://localhost:8080/run_code`).
        max_concurrency: requests in flight at once (more wait for a connection); None reads
            `SANDBOX_MAX_CONCURRENCY` (default 4).
    """

    def __init__(self, url: str | None = None, max_concurrency: int | None = None) -> None:
        self._url: str = _checked_url(url or os.getenv("SANDBOX_URL") or _DEFAULT_URL)
        self._max_concurrency = max_concurrency or int(os.getenv("SANDBOX_MAX_CONCURRENCY", "4"))
        self._client: httpx.AsyncClient | None = None
        self._client_lock = asyncio.Lock()
        self._warned_unreachable = False

    async def _get_client(self) -> httpx.AsyncClient:
        async with self._client_lock:
            if self._client is None or self._client.is_closed:
                limits = httpx.Limits(
                    max_connections=self._max_concurrency,
                    max_keepalive_connections=self._max_concurrency,
                )
                self._client = (
                    httpx.AsyncClient(  # no proxies from the environment (aiohttp's default)
                        limits=limits, timeout=httpx.Timeout(_TOTAL_TIMEOUT_S), trust_env=False
                    )
                )
            return self._client

    async def run(
        self, code: str, files: dict[str, str], timeout: float, language: str = "python"
    ) -> tuple[bool, dict[str, Any]]:
        """Runs `code` with `files` beside it on the server.

        Args:
            code: the program (its entry point).
            files: further files, name → text (sent base64-encoded).
            timeout: the run's time limit in seconds (sent as an int, `run_timeout`).
            language: the server's language name.

        Returns:
            `(success, response)`: the server's JSON response, `success` when its `status` is
            `"Success"`; for a `SandboxError` status, an HTTP error status, an unreachable
            server or a body that is not JSON, `(False, {"error": message, ...})`.
        """
        payload = {
            "code": code,
            "language": language,
            "run_timeout": int(timeout),
            "files": {
                name: base64.b64encode(text.encode("utf-8")).decode("utf-8")
                for name, text in files.items()
            },
        }
        try:
            client = await self._get_client()
            response = await client.post(self._url, json=payload)
            if response.status_code != 200:
                return False, {"error": f"HTTP {response.status_code}: {response.text}"}
            data = response.json()
        except httpx.TransportError as exc:
            return False, {"error": self._unreachable(exc)}
        except (httpx.HTTPError, ValueError) as exc:  # ValueError: a body that is not JSON
            return False, {"error": str(exc)}
        if not isinstance(data, dict):
            return False, {"error": f"SandboxFusion answered {data!r}; expected a JSON object"}
        if data.get("status") == "SandboxError":
            return False, {"error": data.get("message", "SandboxError"), **data}
        return data.get("status") == "Success", data

    def _unreachable(self, exc: httpx.TransportError) -> str:
        message = (
            f"SandboxFusion is not reachable at {self._url} ({type(exc).__name__}: {exc}); "
            f"start it with `{SANDBOXFUSION_START}` or set SANDBOX_URL"
        )
        if not self._warned_unreachable:
            self._warned_unreachable = True
            logger.warning("%s", message)
        return message

    async def close(self) -> None:
        """Closes the HTTP connections (a later `run` opens new ones)."""
        async with self._client_lock:
            if self._client is not None and not self._client.is_closed:
                await self._client.aclose()
            self._client = None


def _modal_unavailable(name: str) -> NoReturn:
    raise ConfigError(MODAL_UNAVAILABLE.format(name=name))


class ModalSandbox:
    """The cookbook's Modal sandbox (a `SandboxInterface`); building one raises `ConfigError`
    (`MODAL_UNAVAILABLE`), as does every method."""

    def __init__(
        self,
        timeout: int,
        image: Any,
        app: Any,
        sandbox: Any,
        max_stream_output_bytes: int = 128 * 1024,
    ) -> None:
        _modal_unavailable("ModalSandbox")

    @classmethod
    async def create(
        cls,
        app_name: str = "tinker-cookbook-runner",
        timeout: int = 600,
        image: Any | None = None,
        max_stream_output_bytes: int = 128 * 1024,
    ) -> ModalSandbox:
        """Raises `ConfigError`: Modal sandboxes are not available here."""
        _modal_unavailable("ModalSandbox.create")

    @property
    def sandbox_id(self) -> str:
        """Raises `ConfigError`."""
        _modal_unavailable("ModalSandbox.sandbox_id")

    async def send_heartbeat(self, timeout: int = 30) -> None:
        """Raises `ConfigError`."""
        _modal_unavailable("ModalSandbox.send_heartbeat")

    async def run_command(
        self,
        command: str,
        workdir: str | None = None,
        timeout: int = 60,
        max_output_bytes: int | None = None,
    ) -> SandboxResult:
        """Raises `ConfigError`."""
        _modal_unavailable("ModalSandbox.run_command")

    async def read_file(
        self, path: str, max_bytes: int | None = None, timeout: int = 60
    ) -> SandboxResult:
        """Raises `ConfigError`."""
        _modal_unavailable("ModalSandbox.read_file")

    async def write_file(
        self, path: str, content: str | bytes = "", executable: bool = False, timeout: int = 60
    ) -> SandboxResult:
        """Raises `ConfigError`."""
        _modal_unavailable("ModalSandbox.write_file")

    async def cleanup(self) -> None:
        """Raises `ConfigError`."""
        _modal_unavailable("ModalSandbox.cleanup")


class ModalSandboxPool:
    """The cookbook's pool of warm Modal sandboxes; building one raises `ConfigError`
    (`MODAL_UNAVAILABLE`), as does every method."""

    def __init__(
        self,
        *,
        pool_size: int | None = None,
        sandbox_timeout_secs: int = 1200,
        image: Any | None = None,
        app_name: str = "tinker-cookbook-runner",
    ) -> None:
        _modal_unavailable("ModalSandboxPool")

    async def run_in_workdir(
        self, files: dict[str, str], command: list[str], timeout: int | None = None
    ) -> SandboxResult:
        """Raises `ConfigError`."""
        _modal_unavailable("ModalSandboxPool.run_in_workdir")

    async def terminate(self) -> None:
        """Raises `ConfigError`."""
        _modal_unavailable("ModalSandboxPool.terminate")
