"""The HTTP surface: Tinker's API (SDK 0.38) as Starlette routes over the `Engine`.

Conventions:
- JSON bodies are validated with the SDK's own pydantic request types (`tinker.types`), so a
  malformed request is a 400 whose `detail` names the field; `forward_backward` is protobuf
  (`shell.serve._wire`), zstd-compressed or not. Every error response has a JSON body; an
  unknown id is a 404; nothing deterministic is answered with 408/409/429/5xx (the SDK retries
  those for minutes). 503 means the server is shutting down (the SDK retries, which a restart
  then answers).
- Asynchronous operations answer `{"request_id": ...}` at once; `retrieve_future` long-polls
  up to `poll_s` (well under the SDK's 45 s read timeout) and answers 408 with the queue state
  while the result is not ready.
- Checkpoint paths in requests are `tinker://` paths that resolve inside the state dir only
  (`shell.serve._paths`); responses name checkpoints the same way.
- Middleware (`Guard`): the API key (`X-API-Key`, compared in constant time) when one is set,
  and a size limit on request bodies (413 past it).
- See docs/tinker-protocol.md for the protocol read off the SDK's source.
"""

from __future__ import annotations

import contextlib
import hmac
import io
import json
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pydantic
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from tinker import types

from shell.local import LocalLookupError
from shell.loopback import is_loopback_host
from shell.serve import _ops
from shell.serve._engine import Engine, EngineClosed, SamplerSpec, SessionEnded
from shell.serve._paths import PathError, check_folder_name, parse_checkpoint_id
from shell.serve._replies import JSON, BadRequest, Reply, error_body, json_reply
from shell.serve._ttl import check_ttl
from shell.serve._wire import WireError, decode_forward_backward

__all__ = ["CLIENT_CONFIG", "Guard", "build_app"]

_logger = logging.getLogger("rlpure.serve")

M = TypeVar("M", bound=pydantic.BaseModel)

CLIENT_CONFIG: dict[str, Any] = {
    "pjwt_auth_enabled": False,
    "use_pyqwest_transport": False,
    "proto_compress_fwdbwd": False,
    "sample_use_retrieve_futures": False,
    "custom_loss_server_side": False,
    "sample_join_sampling_session": False,
    "fwdbwd_max_chunk_len": 1 << 20,
    "fwdbwd_max_chunk_bytes_count": 16_000_000,
}
"""What `client/config` answers: plain JWT-less auth, pure-httpx transport, custom losses on
the client, and `forward_backward` in one request per call (up to ~4M tokens), so a call runs
as one local call, as in-process."""


def _field_errors(err: pydantic.ValidationError) -> str:
    parts = []
    for item in err.errors()[:3]:
        where = ".".join(str(part) for part in item["loc"]) or "body"
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts)


async def _parse(request: Request, model: type[M]) -> M:
    """The JSON body as `model` (400 naming the field otherwise)."""
    body = await request.body()
    try:
        data = json.loads(body or b"null")
    except (ValueError, RecursionError) as err:  # RecursionError: nested past Python's stack
        raise BadRequest(f"body: not valid JSON ({err})") from err
    if not isinstance(data, dict):
        raise BadRequest(f"body: expected a JSON object for {model.__name__}")
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as err:
        raise BadRequest(f"{model.__name__}: {_field_errors(err)}") from err


def _send(reply: Reply) -> Response:
    return Response(reply.body, status_code=reply.status, media_type=reply.media_type)


def _ok(value: pydantic.BaseModel | dict[str, Any]) -> Response:
    return _send(json_reply(value))


def _future(request_id: str, **extra: Any) -> Response:
    return _ok({"request_id": request_id, **extra})


class Api:
    """The route handlers (one instance per app)."""

    def __init__(
        self,
        engine: Engine,
        *,
        poll_s: float,
        capabilities: types.GetServerCapabilitiesResponse,
        max_body_bytes: int = 128 << 20,
    ) -> None:
        self.engine = engine
        self.poll_s = poll_s
        self.capabilities = capabilities
        self.max_body_bytes = max_body_bytes
        self.ttl = engine.ttl

    # -- service --

    async def client_config(self, request: Request) -> Response:
        return _ok(CLIENT_CONFIG)

    async def dynamic_config(self, request: Request) -> Response:
        return _ok({})

    async def healthz(self, request: Request) -> Response:
        return _ok({"status": "ok"})

    async def telemetry(self, request: Request) -> Response:
        await request.body()  # accepted and dropped
        return _ok({"status": "accepted"})

    async def server_capabilities(self, request: Request) -> Response:
        return _ok(self.capabilities)

    async def create_session(self, request: Request) -> Response:
        await _parse(request, types.CreateSessionRequest)
        return _ok(types.CreateSessionResponse(session_id=self.engine.create_session()))

    async def heartbeat(self, request: Request) -> Response:
        body = await _parse(request, types.SessionHeartbeatRequest)
        try:
            self.engine.touch_session(body.session_id)
        except SessionEnded as err:
            raise BadRequest(str(err), 410) from None
        return _ok({"type": "session_heartbeat"})

    async def finish_session(self, request: Request) -> Response:
        self.engine.finish_session(request.path_params["session_id"])
        return _ok({})

    # -- training --

    async def create_model(self, request: Request) -> Response:
        body = await _parse(request, types.CreateModelRequest)
        model_id = f"{body.session_id}:train:{body.model_seq_id}"
        make = _ops.create_model(self.engine, body, model_id)
        request_id = self.engine.submit_create(body.session_id, model_id, "create_model", make)
        return _future(request_id, model_id=model_id)

    async def get_info(self, request: Request) -> Response:
        body = await _parse(request, types.GetInfoRequest)
        try:
            return _ok(self.engine.info(body.model_id))
        except KeyError:
            raise BadRequest(f"model_id: unknown model {body.model_id!r}", 404) from None

    @contextlib.contextmanager
    def _in_order(self, model_id: str, seq_id: int, what: str) -> Iterator[None]:
        """Refusals inside still take `seq_id` in `model_id`'s order (`skip_training_seq`)."""
        try:
            yield
        except BadRequest:
            self.engine.skip_training_seq(model_id, seq_id, what)
            raise

    async def forward_backward(self, request: Request) -> Response:
        raw = await request.body()
        if request.headers.get("content-encoding", "").lower() == "zstd":
            raw = _zstd_decompressed(raw, limit=self.max_body_bytes)
        if "json" in request.headers.get("content-type", ""):
            raise BadRequest("body: forward_backward takes a protobuf ForwardBackwardRequest")
        try:
            call = decode_forward_backward(raw)
        except WireError as err:
            if err.place is not None and err.place[1] >= 1:
                self.engine.skip_training_seq(*err.place, "forward_backward")
            raise BadRequest(str(err)) from err
        _require_seq(call.seq_id)
        what = "forward" if call.forward_only else "forward_backward"
        request_id = self.engine.submit_training(
            call.model_id, call.seq_id, what, _ops.forward_backward(call)
        )
        return _future(request_id, model_id=call.model_id)

    async def optim_step(self, request: Request) -> Response:
        body = await _parse(request, types.OptimStepRequest)
        seq_id = _require_seq(body.seq_id)
        with self._in_order(body.model_id, seq_id, "optim_step"):
            op = _ops.optim_step(body)
        request_id = self.engine.submit_training(body.model_id, seq_id, "optim_step", op)
        return _future(request_id, model_id=body.model_id)

    async def save_weights(self, request: Request) -> Response:
        body = await _parse(request, types.SaveWeightsRequest)
        seq_id = _require_seq(body.seq_id)
        with self._in_order(body.model_id, seq_id, "save_weights"):
            name = _checkpoint_name(body.path)
            _checked_ttl(body.ttl_seconds)
        op = _ops.save_weights(self.engine, body, name, self.ttl)
        request_id = self.engine.submit_training(body.model_id, seq_id, "save_weights", op)
        return _future(request_id, model_id=body.model_id)

    async def save_weights_for_sampler(self, request: Request) -> Response:
        body = await _parse(request, types.SaveWeightsForSamplerRequest)
        seq_id = _require_seq(body.seq_id)
        with self._in_order(body.model_id, seq_id, "save_weights_for_sampler"):
            if body.path is None and body.sampling_session_seq_id is None:
                raise BadRequest("path or sampling_session_seq_id: one is required")
            name = _checkpoint_name(body.path) if body.path is not None else None
            _checked_ttl(body.ttl_seconds)
        session_id = body.model_id.split(":train:")[0]
        op = _ops.save_weights_for_sampler(self.engine, body, name, session_id, self.ttl)
        request_id = self.engine.submit_training(
            body.model_id, seq_id, "save_weights_for_sampler", op
        )
        return _future(request_id, model_id=body.model_id)

    async def save_weights_external(self, request: Request) -> Response:
        raise BadRequest(
            "save_weights_external: exporting weights for download is not supported by "
            "rlpure serve; the checkpoints are folders under the server's --state-dir",
        )

    async def load_weights(self, request: Request) -> Response:
        body = await _parse(request, types.LoadWeightsRequest)
        if body.model_id is not None:  # legacy load_state into an existing model
            seq_id = _require_seq(body.seq_id)
            with self._in_order(body.model_id, seq_id, "load_weights"):
                ref, directory = self._checkpoint(body.path)
            op = _ops.load_into(directory, ref, with_optimizer=body.optimizer)
            request_id = self.engine.submit_training(body.model_id, seq_id, "load_weights", op)
            return _future(request_id, model_id=body.model_id)
        ref, directory = self._checkpoint(body.path)
        if body.session_id is None or body.model_seq_id is None:
            raise BadRequest("load_weights: give model_id, or session_id and model_seq_id")
        model_id = f"{body.session_id}:train:{body.model_seq_id}"
        make = _ops.create_from_state(self.engine, body, directory, model_id)
        request_id = self.engine.submit_create(body.session_id, model_id, "load_weights", make)
        return _future(request_id, model_id=model_id)

    # -- sampling --

    async def create_sampling_session(self, request: Request) -> Response:
        body = await _parse(request, types.CreateSamplingSessionRequest)
        sampler_id = f"{body.session_id}:sample:{body.sampling_session_seq_id}"
        self.engine.add_sampler(
            sampler_id, self._sampler_spec(body.session_id, body.model_path, body.base_model)
        )
        return _ok(types.CreateSamplingSessionResponse(sampling_session_id=sampler_id))

    def _sampler_spec(
        self, session_id: str, model_path: str | None, base_model: str | None
    ) -> SamplerSpec:
        if model_path is not None:
            ref, directory = self._checkpoint(model_path, field="model_path")
            return SamplerSpec(
                session_id=session_id,
                base_model=_ops.checkpoint_base_model(directory, ref),
                ref=ref,
            )
        if base_model is None:
            raise BadRequest("base_model or model_path: one is required")
        return SamplerSpec(session_id=session_id, base_model=base_model)

    async def get_sampler(self, request: Request) -> Response:
        sampler_id = request.path_params["sampler_id"]
        try:
            spec = self.engine.sampler_spec(sampler_id)
        except KeyError:
            raise BadRequest(f"unknown sampler {sampler_id!r}", 404) from None
        return _ok(
            types.GetSamplerResponse(
                sampler_id=sampler_id, base_model=spec.base_model, model_path=spec.model_path
            )
        )

    async def asample(self, request: Request) -> Response:
        body = await _parse(request, types.SampleRequest)
        _ops.check_sample_request(body)
        sampler_id = body.sampling_session_id
        if sampler_id is None:  # a one-off sampler on a path or base model
            sampler_id = f"direct:{body.model_path or body.base_model}"
            self.engine.add_sampler(
                sampler_id, self._sampler_spec("direct", body.model_path, body.base_model)
            )
        else:
            try:
                self.engine.sampler_spec(sampler_id)
            except KeyError:
                raise BadRequest(f"sampling_session_id: unknown {sampler_id!r}", 404) from None
        # a seq_id identifies a request within its sampling session (the SDK's retries repeat
        # it): sessionless requests from different clients may share one, so never dedupe them
        seq_id = body.seq_id if body.seq_id is not None and body.sampling_session_id else -1
        request_id = self.engine.submit_sample(sampler_id, seq_id, _ops.sample(body))
        sequence_ids = [f"{request_id}-{index}" for index in range(body.num_samples)]
        return _future(request_id, sample_sequence_ids=sequence_ids)

    async def retrieve_future(self, request: Request) -> Response:
        body = await _parse(request, types.FutureRetrieveRequest)
        try:
            reply = await self.engine.wait_result(body.request_id, self.poll_s)
        except KeyError:
            raise BadRequest(f"request_id: unknown {body.request_id!r}", 404) from None
        if reply is None:
            return Response(
                json.dumps(
                    {
                        "type": "try_again",
                        "request_id": body.request_id,
                        "queue_state": "active",
                        "queue_state_reason": f"{self.engine.queue_depth()} requests in flight",
                    }
                ),
                status_code=408,
                media_type=JSON,
            )
        return _send(reply)

    # -- weights and runs (REST) --

    def _checkpoint(self, path: object, *, field: str = "path") -> tuple[Any, str]:
        try:
            return self.engine.resolve(path, field=field)
        except PathError as err:
            raise BadRequest(str(err)) from err

    async def weights_info(self, request: Request) -> Response:
        data = await _json_object(request)
        _, directory = self._checkpoint(data.get("tinker_path"), field="tinker_path")
        return _ok(
            await self._rest(lambda rest: rest.get_weights_info_by_tinker_path(directory).result())
        )

    async def _rest(self, fn: Callable[[Any], Any]) -> Any:
        """`fn` of a local REST client, on a thread beside the worker (`Engine.read_async`)."""

        def run() -> Any:
            return fn(self.engine.service.create_rest_client())

        try:
            return await self.engine.read_async(run)
        except (LookupError, LocalLookupError) as err:  # LocalLookupError is a ValueError
            raise BadRequest(self.engine.public_message(str(err)), 404) from err
        except ValueError as err:
            raise BadRequest(self.engine.public_message(str(err))) from err

    async def training_run(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        run = await self._rest(lambda rest: rest.get_training_run(run_id).result())
        return _ok(_ops.served_run(run, self.engine, self.ttl))

    async def training_runs(self, request: Request) -> Response:
        limit, offset = _paging(request, 20)
        page = await self._rest(
            lambda rest: rest.list_training_runs(limit=limit, offset=offset).result()
        )
        runs = [_ops.served_run(run, self.engine, self.ttl) for run in page.training_runs]
        return _ok(types.TrainingRunsResponse(training_runs=runs, cursor=page.cursor))

    async def run_checkpoints(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        page = await self._rest(lambda rest: rest.list_checkpoints(run_id).result())
        return _ok(_ops.served_checkpoints(page, self.engine, self.ttl))

    async def user_checkpoints(self, request: Request) -> Response:
        limit, offset = _paging(request, 100)
        page = await self._rest(
            lambda rest: rest.list_user_checkpoints(limit=limit, offset=offset).result()
        )
        return _ok(_ops.served_checkpoints(page, self.engine, self.ttl))

    async def checkpoint_action(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        rest_of_path: str = request.path_params["rest"]
        action = ""
        # `<kind>/<name>/<action>`: a third part is the action, so a checkpoint may be named
        # `ttl` (`weights/ttl`, `weights/ttl/ttl`)
        parts = rest_of_path.split("/")
        if len(parts) == 3 and parts[2] in ("ttl", "publish", "external_weights_urls"):
            rest_of_path, action = "/".join(parts[:2]), parts[2]
        try:
            ref = parse_checkpoint_id(run_id, rest_of_path)
        except PathError as err:
            raise BadRequest(str(err)) from err
        directory = str(ref.directory(self.engine.checkpoint_root))
        if action == "" and request.method == "DELETE":
            await self._rest(
                lambda rest: rest.delete_checkpoint_from_tinker_path(directory).result()
            )
            self.ttl.forget(ref)
            return _ok({})
        if action == "ttl" and request.method == "PUT":
            ttl = _checked_ttl((await _json_object(request)).get("ttl_seconds"))
            await self._rest(lambda rest: rest.get_weights_info_by_tinker_path(directory).result())
            self.ttl.set(ref, ttl)
            return _ok({})
        raise BadRequest(
            f"{request.method} {action or 'checkpoint'}: not supported by rlpure serve "
            "(checkpoints are local folders: nothing to publish or download)"
        )

    async def session(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        return _ok(self.engine.session_summary(session_id))

    async def sessions(self, request: Request) -> Response:
        limit, offset = _paging(request, 20)
        return _ok(
            types.ListSessionsResponse(sessions=self.engine.session_ids()[offset : offset + limit])
        )


async def _json_object(request: Request) -> dict[str, Any]:
    """A JSON object body (400 otherwise)."""
    try:
        data = json.loads(await request.body() or b"{}")
    except (ValueError, RecursionError) as err:  # RecursionError: nested past Python's stack
        raise BadRequest(f"body: not valid JSON ({err})") from err
    if not isinstance(data, dict):
        raise BadRequest("body: expected a JSON object")
    return data


def _checked_ttl(ttl_seconds: object) -> int | None:
    try:
        return check_ttl(ttl_seconds)
    except ValueError as err:
        raise BadRequest(str(err)) from err


def _paging(request: Request, default_limit: int) -> tuple[int, int]:
    try:
        limit = int(request.query_params.get("limit", default_limit))
        offset = int(request.query_params.get("offset", 0))
    except ValueError as err:
        raise BadRequest(f"limit/offset: expected integers ({err})") from err
    if limit < 0 or offset < 0:
        raise BadRequest("limit/offset: must be >= 0")
    return limit, offset


def _require_seq(seq_id: int | None) -> int:
    if seq_id is None or seq_id < 1:
        raise BadRequest(f"seq_id: expected an int >= 1, got {seq_id!r}")
    return seq_id


def _checkpoint_name(name: str | None) -> str:
    if name is None:
        raise BadRequest("path: a checkpoint name is required")
    try:
        return check_folder_name(name, "path")
    except PathError as err:
        raise BadRequest(str(err)) from err


def _zstd_decompressed(raw: bytes, *, limit: int) -> bytes:
    """`raw` decompressed, read a megabyte at a time: a frame whose header declares a huge size
    allocates nothing, and one that expands past `limit` bytes (the body limit) is a 413."""
    import zstandard

    out = bytearray()
    try:
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw)) as reader:
            while chunk := reader.read(1 << 20):
                out += chunk
                if len(out) > limit:
                    raise BadRequest(
                        f"body: decompresses past the server's limit of {limit} bytes", 413
                    )
    except zstandard.ZstdError as err:
        raise BadRequest(f"body: not valid zstd ({err})") from err
    return bytes(out)


BROWSER_SIMPLE_TYPES = frozenset(
    {b"", b"text/plain", b"application/x-www-form-urlencoded", b"multipart/form-data"}
)
"""Body types a web page may send cross-site without a CORS preflight (none: a `Blob` body)."""


def _host_name(host: bytes) -> bytes:
    """`Host` less its port: `b"127.0.0.1:8000"` → `b"127.0.0.1"`, `b"[::1]:80"` → `b"[::1]"`."""
    if host.startswith(b"["):
        return host[: host.find(b"]") + 1]
    return host.partition(b":")[0].lower()


def browser_refusal(headers: dict[bytes, bytes], *, check_host: bool) -> str | None:
    """Why a request a web page on this machine could have sent is refused, or None.

    Binding loopback does not stop a browser on the same machine: any page may send requests
    to 127.0.0.1, and DNS rebinding lets it read the replies. The SDK sends no `Origin` and
    names the server in `Host`, so refusing the rest costs it nothing.

    Args:
        headers: the request's headers (lower-case names).
        check_host: whether `Host` must be a loopback name (a server without an API key).

    Returns:
        The one-line reason, naming the header, or None.
    """
    if b"origin" in headers:
        return "Origin: cross-site requests are refused (a web page cannot drive this server)"
    host = _host_name(headers.get(b"host", b"")).decode("latin-1")
    if check_host and not is_loopback_host(host):
        return "Host: a loopback server answers only localhost or a loopback address"
    return None


def body_type_refusal(headers: dict[bytes, bytes], *, method: str) -> str | None:
    """Why a POST whose body type a page may send without a CORS preflight is refused, or None.

    The SDK posts `application/json` or `application/x-protobuf`; other methods with a body
    (DELETE, PUT) need a preflight, which this server never grants.
    """
    if method != "POST":
        return None
    content_type = headers.get(b"content-type", b"").partition(b";")[0].strip().lower()
    if content_type in BROWSER_SIMPLE_TYPES:
        shown = content_type.decode(errors="replace") or "none"
        return f"Content-Type: expected application/json or application/x-protobuf, got {shown!r}"
    return None


class Guard:
    """ASGI middleware: browser-sent requests refused, the API key (when set), the body limit."""

    def __init__(
        self, app: ASGIApp, *, api_key: str | None, max_body_bytes: int, check_host: bool = True
    ) -> None:
        self.app = app
        self.api_key = api_key.encode() if api_key is not None else None
        self.max_body_bytes = max_body_bytes
        self.check_host = check_host

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        refusal = browser_refusal(headers, check_host=self.check_host)
        if refusal is not None:
            await _plain(send, 403, refusal)
            return
        if self.api_key is not None and not scope["path"].endswith("/healthz"):
            given = headers.get(b"x-api-key", b"")
            if not hmac.compare_digest(given, self.api_key):
                await _plain(send, 401, "X-API-Key: missing or wrong API key for this server")
                return
        refusal = body_type_refusal(headers, method=scope["method"])
        if refusal is not None:
            await _plain(send, 415, refusal)
            return
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await _plain(
                send, 413, f"body: larger than the server's limit of {self.max_body_bytes} bytes"
            )
            return
        seen = 0
        limit = self.max_body_bytes

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise HTTPException(
                        413, f"body: larger than the server's limit of {limit} bytes"
                    )
            return message

        await self.app(scope, limited, send)


async def _plain(send: Send, status: int, detail: str) -> None:
    body = error_body(detail)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", JSON.encode()),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _error_handlers() -> dict[Any, Callable[[Request, Exception], Awaitable[Response]]]:
    async def bad_request(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, BadRequest)
        return Response(error_body(exc.detail), status_code=exc.status, media_type=JSON)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return Response(error_body(str(exc.detail)), status_code=exc.status_code, media_type=JSON)

    async def closed(request: Request, exc: Exception) -> Response:
        return Response(error_body("the server is shutting down"), status_code=503, media_type=JSON)

    async def user_input(request: Request, exc: Exception) -> Response:
        return Response(error_body(str(exc)), status_code=400, media_type=JSON)

    async def unknown(request: Request, exc: Exception) -> Response:
        return Response(
            error_body(str(exc.args[0] if exc.args else exc)), status_code=404, media_type=JSON
        )

    async def hung_up(request: Request, exc: Exception) -> Response:
        return Response(error_body("client disconnected"), status_code=400, media_type=JSON)

    async def crash(request: Request, exc: Exception) -> Response:
        _logger.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return Response(
            error_body(f"internal error ({type(exc).__name__}); see the server's log"),
            status_code=500,
            media_type=JSON,
        )

    return {
        BadRequest: bad_request,
        HTTPException: http_error,
        EngineClosed: closed,
        PathError: user_input,
        ClientDisconnect: hung_up,
        LookupError: unknown,
        Exception: crash,
    }


def build_app(
    engine: Engine,
    *,
    api_key: str | None = None,
    max_body_bytes: int = 128 << 20,
    poll_s: float = 20.0,
    capabilities: types.GetServerCapabilitiesResponse | None = None,
) -> ASGIApp:
    """The ASGI app serving Tinker's API over `engine`."""
    api = Api(
        engine,
        poll_s=poll_s,
        capabilities=capabilities or engine.service.get_server_capabilities(),
        max_body_bytes=max_body_bytes,
    )
    v1 = "/api/v1"
    post, get = ["POST"], ["GET"]
    routes = [
        Route(f"{v1}/client/config", api.client_config, methods=post),
        Route(f"{v1}/client/dynamic_config", api.dynamic_config, methods=post),
        Route(f"{v1}/healthz", api.healthz, methods=get),
        Route(f"{v1}/telemetry", api.telemetry, methods=post),
        Route(f"{v1}/get_server_capabilities", api.server_capabilities, methods=get),
        Route(f"{v1}/create_session", api.create_session, methods=post),
        Route(f"{v1}/session_heartbeat", api.heartbeat, methods=post),
        Route(f"{v1}/sessions/{{session_id}}/finish", api.finish_session, methods=post),
        Route(f"{v1}/sessions/{{session_id}}", api.session, methods=get),
        Route(f"{v1}/sessions", api.sessions, methods=get),
        Route(f"{v1}/create_model", api.create_model, methods=post),
        Route(f"{v1}/get_info", api.get_info, methods=post),
        Route(f"{v1}/forward_backward", api.forward_backward, methods=post),
        Route(f"{v1}/forward", api.forward_backward, methods=post),
        Route(f"{v1}/optim_step", api.optim_step, methods=post),
        Route(f"{v1}/save_weights", api.save_weights, methods=post),
        Route(f"{v1}/save_weights_for_sampler", api.save_weights_for_sampler, methods=post),
        Route(f"{v1}/save_weights_external", api.save_weights_external, methods=post),
        Route(f"{v1}/load_weights", api.load_weights, methods=post),
        Route(f"{v1}/create_sampling_session", api.create_sampling_session, methods=post),
        Route(f"{v1}/samplers/{{sampler_id}}", api.get_sampler, methods=get),
        Route(f"{v1}/asample", api.asample, methods=post),
        Route(f"{v1}/retrieve_future", api.retrieve_future, methods=post),
        Route(f"{v1}/weights_info", api.weights_info, methods=post),
        Route(f"{v1}/training_runs", api.training_runs, methods=get),
        Route(f"{v1}/training_runs/{{run_id}}", api.training_run, methods=get),
        Route(f"{v1}/training_runs/{{run_id}}/checkpoints", api.run_checkpoints, methods=get),
        Route(
            f"{v1}/training_runs/{{run_id}}/checkpoints/{{rest:path}}",
            api.checkpoint_action,
            methods=["GET", "PUT", "POST", "DELETE"],
        ),
        Route(f"{v1}/checkpoints", api.user_checkpoints, methods=get),
    ]
    app = Starlette(routes=routes, exception_handlers=_error_handlers())
    # With an API key a page cannot forge requests (it lacks the key); without one the server
    # is loopback-only and `Host` must say so (DNS rebinding).
    return Guard(app, api_key=api_key, max_body_bytes=max_body_bytes, check_host=api_key is None)
