"""`rlpure serve` in a subprocess: bad input, the API key, the SDK's CLI, expiry, shutdown, load.

- Bad input is a 4xx whose message names the field, raised by the unmodified SDK as its
  matching exception type (`BadRequestError` 400, `NotFoundError` 404, `RequestFailedError`
  with category `user` for what fails while an operation runs); raw HTTP gets a JSON
  `{"detail": ...}`; no response carries a traceback, and the server stays healthy.
- `--api-key`: the SDK with the key works, a wrong key is `AuthenticationError` at once; a
  non-loopback `--host` without a key is refused before anything starts.
- The SDK's own `tinker` CLI lists, describes, expires and deletes the server's checkpoints.
- Expiry: the janitor's pass (`Engine.delete_expired_checkpoints`) is driven in-process, since
  the server runs it only every 30 s; over HTTP only the listed `expires_at` is checked.
- SIGTERM while work is queued: the server exits 0 within seconds, a save the client already
  got survives a restart, later requests fail instead of hanging; SIGINT exits 0 as well.
- A client that sends half a body, or dies mid-sample, does not hold up the others.

Most tests share one module-scoped server; the key and shutdown tests start their own.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import http.client
import json
import os
import random
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import tinker
from tinker import types
from tinker._client import AsyncTinker  # the SDK's raw API client: one call, no retries
from tinker.lib.public_interfaces.training_client import TrainingClient

import shell.serve as serve_module
from rlpure.model import MODEL_CONFIGS
from shell import cli
from shell.serve import Engine
from shell.serve._paths import parse_tinker_path
from tests.serve.server import RLPURE, Server, child_env, free_port, running_server, sdk_env

MODEL = "rlpure/tiny"
VOCAB = MODEL_CONFIGS[MODEL].vocab_size
TINKER_CLI = str(Path(sys.executable).with_name("tinker"))
SDK_TIMEOUT_S = 120.0  # a result the server owes; far above any op on the toy model
PROMPT = types.ModelInput.from_ints([5, 6, 7])

# -- helpers --


def _datum(ids: list[int]) -> types.Datum:
    """Next-token cross-entropy on `ids` (position i predicts token i+1)."""
    return types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={
            "target_tokens": types.TensorData.from_numpy(np.asarray(ids[1:], dtype=np.int64)),
            "weights": types.TensorData.from_numpy(np.ones(len(ids) - 1, dtype=np.float32)),
        },
    )


BATCH = [_datum([(7 * i + row) % 250 + 1 for i in range(24)]) for row in range(4)]


def _raw(
    server: Server,
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes]:
    """One HTTP request sent as given (no path normalisation); the status and body."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _raw_json(server: Server, method: str, path: str) -> Any:
    """The JSON reply of a request that must succeed."""
    status, body = _raw(server, method, path, b"", {"Host": f"127.0.0.1:{server.port}"})
    assert status == 200, body
    return json.loads(body)


def _detail(status: int, body: bytes) -> str:
    """The `detail` of a 4xx JSON error body (asserting that shape)."""
    assert 400 <= status < 500, (status, body)
    data = json.loads(body)
    assert isinstance(data, dict) and isinstance(data.get("detail"), str), body
    assert "Traceback" not in data["detail"]
    return data["detail"]


def _detail_5xx(body: bytes) -> str:
    data = json.loads(body)
    assert isinstance(data, dict) and isinstance(data.get("detail"), str), body
    return data["detail"]


def _healthy(server: Server, api_key: str | None = None) -> bool:
    request = urllib.request.Request(f"{server.url}/api/v1/healthz")
    if api_key:
        request.add_header("X-API-Key", api_key)
    with urllib.request.urlopen(request, timeout=10) as response:
        return bool(json.loads(response.read()) == {"status": "ok"})


def _raises(kind: type[BaseException], call: Any) -> str:
    """The message of the `kind` exception `call()` raises (no traceback in it)."""
    with pytest.raises(kind) as caught:
        call()
    message = str(caught.value)
    assert "Traceback" not in message
    return message


def _user_failure(call: Any) -> str:
    """The message of a `RequestFailedError` with category user raised by `call()`."""
    with pytest.raises(tinker.RequestFailedError) as caught:
        call()
    assert caught.value.category == types.RequestErrorCategory.User, caught.value
    message = str(caught.value)
    assert "Traceback" not in message
    return message


def _sdk_env(monkeypatch: pytest.MonkeyPatch, server: Server, api_key: str = "tml-local") -> None:
    for key, value in sdk_env(server, api_key).items():
        monkeypatch.setenv(key, value)


def _rest(server: Server, api_key: str = "tml-local") -> tinker.RestClient:
    """A REST client of `server`. Explicit arguments: `RestClient()` from the environment
    reuses a process-wide holder cached under `(None, None)`, whichever server it reached."""
    return tinker.RestClient(base_url=server.url, api_key=api_key)


def _cli(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [TINKER_CLI, *args],
        env=child_env(server),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    assert "Traceback" not in done.stdout + done.stderr
    return done


def _cli_json(server: Server, *args: str) -> Any:
    return json.loads(_cli(server, "-f", "json", *args).stdout)


def _listed(server: Server, run_id: str) -> dict[str, dict[str, Any]]:
    """`tinker checkpoint list --run-id`: the run's checkpoints by tinker path."""
    page = _cli_json(server, "checkpoint", "list", "--run-id", run_id)
    return {item["tinker_path"]: item for item in page["checkpoints"]}


def _folder(server: Server, tinker_path: str) -> Path:
    """Where the server keeps the checkpoint `tinker_path`."""
    return parse_tinker_path(tinker_path).directory(server.state_dir.resolve() / "checkpoints")


def _expiry(text: str) -> float:
    """Seconds since the epoch of an `expires_at` as the SDK prints it."""
    return dt.datetime.fromisoformat(text).timestamp()


# -- the shared server --


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("safety") / "state") as running:
        yield running


@pytest.fixture(scope="module")
def service(server: Server) -> Iterator[tinker.ServiceClient]:
    with pytest.MonkeyPatch.context() as patch:
        _sdk_env(patch, server)
        client = tinker.ServiceClient()
        try:
            yield client
        finally:
            client.close("success").result(30)


@pytest.fixture(scope="module")
def trainer(service: tinker.ServiceClient) -> TrainingClient:
    return service.create_lora_training_client(base_model=MODEL, rank=4).result(SDK_TIMEOUT_S)


@pytest.fixture(scope="module")
def saved(trainer: TrainingClient) -> dict[str, str]:
    """A state and a sampler checkpoint of `trainer` (tinker paths)."""
    return {
        "state": trainer.save_state("safety-state").result(SDK_TIMEOUT_S).path,
        "sampler": trainer.save_weights_for_sampler("safety-sampler").result(SDK_TIMEOUT_S).path,
    }


# -- 1. bad input through the SDK --


def test_unknown_base_model_is_a_user_error_listing_the_models(service: tinker.ServiceClient):
    message = _user_failure(
        lambda: service.create_lora_training_client(base_model="nope/no-such-model", rank=4).result(
            SDK_TIMEOUT_S
        )
    )
    assert "base_model" in message and "nope/no-such-model" in message
    assert MODEL in message and "rlpure/small" in message


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("tinker://{run}/weights/../etc", ["three parts"]),
        ("tinker://../weights/x", ["run", "'..'"]),
        ("tinker://{run}/weights/..", ["name", "'..'"]),
        ("tinker:///etc/passwd", ["unknown checkpoint kind"]),
        ("tinker://{run}/blobs/x", ["unknown checkpoint kind", "'blobs'"]),
    ],
)
def test_bad_checkpoint_paths_are_400s_naming_the_field(
    service: tinker.ServiceClient, trainer: TrainingClient, path: str, words: list[str]
):
    path = path.format(run=trainer.model_id)
    sampling = _raises(
        tinker.BadRequestError,
        lambda: service.create_sampling_client(model_path=path).result(SDK_TIMEOUT_S),
    )
    assert "model_path" in sampling and all(word in sampling for word in words), sampling
    training = _raises(
        tinker.BadRequestError,
        lambda: service.create_training_client_from_state(path).result(SDK_TIMEOUT_S),
    )
    assert "path" in training and all(word in training for word in words), training


def test_a_filesystem_path_is_refused(service: tinker.ServiceClient, server: Server):
    # The SDK itself refuses a sampling model_path without tinker:// before sending it, so the
    # server's own check is driven raw; the training-from-state path reaches the server.
    message = _raises(
        tinker.BadRequestError,
        lambda: service.create_training_client_from_state("/etc/passwd").result(SDK_TIMEOUT_S),
    )
    assert "'/etc/passwd' is not a tinker:// path" in message
    body = {"session_id": "s-raw", "sampling_session_seq_id": 0, "model_path": "/etc/passwd"}
    status, reply = _raw(
        server, "POST", "/api/v1/create_sampling_session", json.dumps(body).encode(), JSON_HEADERS
    )
    assert status == 400
    assert "model_path" in _detail(status, reply) and "/etc/passwd" in _detail(status, reply)


def test_an_unknown_checkpoint_is_404(service: tinker.ServiceClient, trainer: TrainingClient):
    path = f"tinker://{trainer.model_id}/weights/never-saved"
    message = _raises(
        tinker.NotFoundError,
        lambda: service.create_sampling_client(model_path=path).result(SDK_TIMEOUT_S),
    )
    assert path in message


@pytest.mark.parametrize("where", ["target_tokens", "model_input"])
def test_a_token_id_at_or_past_the_vocabulary_names_the_datum(trainer: TrainingClient, where: str):
    ids = [1, 2, 3, 4, 5]
    datum = _datum(ids)
    if where == "target_tokens":
        datum = types.Datum(
            model_input=datum.model_input,
            loss_fn_inputs={
                **datum.loss_fn_inputs,
                "target_tokens": types.TensorData.from_numpy(
                    np.asarray([2, 3, VOCAB, 5], dtype=np.int64)
                ),
            },
        )
    else:
        datum = types.Datum(
            model_input=types.ModelInput.from_ints([1, VOCAB, 3, 4]),
            loss_fn_inputs=datum.loss_fn_inputs,
        )
    message = _user_failure(
        lambda: trainer.forward_backward([datum], "cross_entropy").result(SDK_TIMEOUT_S)
    )
    assert "Datum[0]" in message and where in message and str(VOCAB) in message, message


def test_an_unknown_loss_fn_lists_the_known_ones(trainer: TrainingClient):
    loss_fn = cast(Any, "no_such_loss")
    message = _user_failure(
        lambda: trainer.forward_backward(BATCH[:1], loss_fn).result(SDK_TIMEOUT_S)
    )
    assert "loss_fn" in message and "no_such_loss" in message and "cross_entropy" in message


def test_save_state_over_an_existing_name_needs_overwrite(trainer: TrainingClient):
    trainer.save_state("taken").result(SDK_TIMEOUT_S)
    message = _user_failure(lambda: trainer.save_state("taken").result(SDK_TIMEOUT_S))
    assert "taken" in message and "exists" in message and "overwrite" in message
    again = trainer.save_state("taken", overwrite=True).result(SDK_TIMEOUT_S)
    assert again.path == f"tinker://{trainer.model_id}/weights/taken"


def _image_datum() -> types.Datum:
    image = types.ImageChunk(data=b"\x89PNG....", format="png", expected_tokens=4)
    return types.Datum(
        model_input=types.ModelInput(chunks=[image, types.EncodedTextChunk(tokens=[1, 2, 3])]),
        loss_fn_inputs={
            "target_tokens": types.TensorData.from_numpy(np.arange(1, 8, dtype=np.int64)),
            "weights": types.TensorData.from_numpy(np.ones(7, dtype=np.float32)),
        },
    )


@pytest.mark.parametrize(
    ("refused", "message"),
    [
        (lambda tc: tc.save_state("bad/name"), "not a plain name"),
        (lambda tc: tc.save_state("x", ttl_seconds=-5), "ttl_seconds"),
        (lambda tc: tc.save_weights_for_sampler(".."), "not a plain name"),
        (lambda tc: tc.load_state(f"tinker://{tc.model_id}/blobs/x"), "unknown checkpoint kind"),
        (lambda tc: tc.forward_backward([_image_datum()], "cross_entropy"), "image chunks"),
        (lambda tc: tc.optim_step(types.DimuonParams(learning_rate=1e-3)), "AdamW steps only"),
    ],
    ids=["save-name", "save-ttl", "sampler-name", "load-kind", "image-datum", "optim-dimuon"],
)
@pytest.mark.filterwarnings("ignore:DEPRECATED:FutureWarning")  # load_state
def test_a_refused_training_request_keeps_the_clients_later_requests_in_order(
    refused: Any, message: str, service: tinker.ServiceClient
):
    """The SDK counts a refused request's seq_id as taken; the server must too, or every later
    request of that client waits for it forever (they used to)."""
    trainer = service.create_lora_training_client(base_model=MODEL, rank=4).result(SDK_TIMEOUT_S)
    assert message in _raises(tinker.BadRequestError, lambda: refused(trainer).result(30))
    after = trainer.forward_backward(BATCH, "cross_entropy")
    step = trainer.optim_step(types.AdamParams(learning_rate=1e-3))
    assert after.result(30).metrics["loss:sum"] > 0
    assert step.result(30) is not None


def test_out_of_range_sampling_options_are_failures_naming_the_option(
    service: tinker.ServiceClient,
):
    sampler = service.create_sampling_client(base_model=MODEL).result(SDK_TIMEOUT_S)
    params = types.SamplingParams(max_tokens=2)
    too_many = 10**6  # past what each serves (the vocabulary, or 4,096 draws)
    for option in ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k"):
        options: dict[str, Any] = {option: too_many}
        message = _user_failure(  # checked where the local sampler checks its requests
            lambda options=options: sampler.sample(PROMPT, 1, params, **options).result(
                SDK_TIMEOUT_S
            )
        )
        assert option in message and str(too_many) in message


def test_an_unknown_sampling_session_is_404(service: tinker.ServiceClient):
    message = _raises(
        tinker.NotFoundError,
        lambda: tinker.SamplingClient.create(
            service.holder, sampling_session_id="s-none:sample:7"
        ).result(SDK_TIMEOUT_S),
    )
    assert "s-none:sample:7" in message
    ghost = tinker.SamplingClient(
        service.holder, sampling_session_id="s-none:sample:8", base_model=MODEL
    )
    message = _raises(
        tinker.NotFoundError,
        lambda: ghost.sample(PROMPT, 1, types.SamplingParams(max_tokens=2)).result(SDK_TIMEOUT_S),
    )
    assert "sampling_session_id" in message and "s-none:sample:8" in message


def test_an_unknown_request_id_is_404(server: Server):
    async def retrieve() -> None:
        client = AsyncTinker(api_key="tml-local", base_url=server.url, max_retries=0, timeout=30)
        try:
            await client.futures.retrieve(
                request=types.FutureRetrieveRequest(request_id="no-such-request")
            )
        finally:
            await client.close()

    message = _raises(tinker.NotFoundError, lambda: asyncio.run(retrieve()))
    assert "request_id" in message and "no-such-request" in message


# -- 1. bad input over raw HTTP --


JSON_HEADERS = {"Content-Type": "application/json"}


@pytest.mark.parametrize(
    ("method", "path", "body", "words"),
    [
        ("POST", "/api/v1/create_session", b"not json {", ["body", "JSON"]),
        ("POST", "/api/v1/create_session", b"[1, 2, 3]", ["body", "JSON object"]),
        ("POST", "/api/v1/create_session", b"[" * 100_000 + b"]" * 100_000, ["body", "JSON"]),
        ("PUT", "/api/v1/training_runs/x/checkpoints/weights/a/ttl", b"[" * 100_000, ["JSON"]),
        ("POST", "/api/v1/get_info", b'"a string"', ["body", "JSON object"]),
        (
            "POST",
            "/api/v1/create_model",
            b'{"session_id": "s-x", "model_seq_id": 0}',
            ["base_model"],
        ),
        ("POST", "/api/v1/retrieve_future", b"{}", ["request_id"]),
        ("POST", "/api/v1/optim_step", b'{"model_id": "m"}', ["optim_params"]),
        ("POST", "/api/v1/weights_info", b'{"tinker_path": 5}', ["tinker_path"]),
        ("DELETE", "/api/v1/training_runs/x/checkpoints/../../etc", b"", ["checkpoint_id"]),
        ("DELETE", "/api/v1/training_runs/x/checkpoints/weights/..", b"", ["'..'"]),
        ("DELETE", "/api/v1/training_runs/../checkpoints/weights/x", b"", ["'..'"]),
        ("GET", "/api/v1/training_runs?limit=ten", b"", ["limit"]),
    ],
)
def test_malformed_requests_are_4xx_with_a_json_detail(
    server: Server, method: str, path: str, body: bytes, words: list[str]
):
    status, reply = _raw(server, method, path, body, JSON_HEADERS)
    detail = _detail(status, reply)
    assert all(word in detail for word in words), detail


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_bytes_to_forward_backward_are_a_400(server: Server, seed: int):
    body = random.Random(seed).randbytes(64 + 100 * seed)
    status, reply = _raw(
        server, "POST", "/api/v1/forward_backward", body, {"Content-Type": "application/x-protobuf"}
    )
    assert status == 400
    assert "ForwardBackwardRequest" in _detail(status, reply) or "body" in _detail(status, reply)


def test_a_finished_sessions_heartbeat_is_410_which_stops_the_sdks_loop(server: Server):
    """The SDK stops a session's heartbeat loop on 410 only; a finished session used to be
    re-adopted by every heartbeat (pickled sampling clients keep one each), so it came back
    empty and stayed."""
    host = {"Host": f"127.0.0.1:{server.port}", "Content-Type": "application/json"}

    def post(path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        return _raw(server, "POST", f"/api/v1/{path}", json.dumps(body).encode(), host)

    status, body = post(
        "create_session", {"tags": [], "user_metadata": None, "sdk_version": "0.38.0"}
    )
    assert status == 200, body
    session_id = json.loads(body)["session_id"]
    beat = {"session_id": session_id, "type": "session_heartbeat"}
    assert post("session_heartbeat", beat)[0] == 200
    assert post(f"sessions/{session_id}/finish", {})[0] == 200
    status, body = post("session_heartbeat", beat)
    assert status == 410 and session_id in _detail(status, body)
    listed = _raw_json(server, "GET", "/api/v1/sessions")
    assert session_id not in json.dumps(listed)
    other = {"session_id": "s-restarted000", "type": "session_heartbeat"}
    assert post("session_heartbeat", other)[0] == 200  # unknown (a restart): adopted


def test_sessionless_samples_with_one_seq_id_are_different_requests(server: Server):
    """Two clients sampling a base model without a session may both send `seq_id` 1: each
    gets its own request (the second used to get the first's result)."""

    def asample(tokens: list[int]) -> str:
        body = {
            "base_model": MODEL,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": tokens}]},
            "num_samples": 1,
            "sampling_params": {"max_tokens": 2, "seed": 1},
            "seq_id": 1,
        }
        status, reply = _raw(
            server, "POST", "/api/v1/asample", json.dumps(body).encode(), JSON_HEADERS
        )
        assert status == 200, reply
        return str(json.loads(reply)["request_id"])

    assert asample([104, 105]) != asample([111, 107])


def _zstd_to_forward_backward(server: Server, body: bytes) -> tuple[int, str]:
    status, reply = _raw(
        server,
        "POST",
        "/api/v1/forward_backward",
        body,
        {"Content-Type": "application/x-protobuf", "Content-Encoding": "zstd"},
    )
    return status, _detail(status, reply)


def test_zstd_bodies_are_held_to_the_body_limit_and_a_lying_header_allocates_nothing(
    server: Server,
):
    import zstandard

    # a single-segment frame declaring 2^40 content bytes, then one raw block of one byte
    magic, descriptor, raw_block = b"\x28\xb5\x2f\xfd", b"\xe0", b"\x09\x00\x00x"
    lying = magic + descriptor + (1 << 40).to_bytes(8, "little") + raw_block
    status, detail = _zstd_to_forward_backward(server, lying)
    assert status == 400 and "not valid zstd" in detail, detail
    zeros = zstandard.ZstdCompressor().compress(bytes((128 << 20) + 1))  # ~4 kB, 128 MB + 1
    status, detail = _zstd_to_forward_backward(server, zeros)
    assert status == 413 and "decompresses past the server's limit" in detail, detail
    assert _healthy(server)


# -- 1b. what a web page on this machine could send --


@pytest.mark.parametrize(
    ("headers", "status", "word"),
    [
        # a "simple" cross-site POST: no preflight, so the browser sends it as is
        ({"Content-Type": "text/plain"}, 415, "Content-Type"),
        ({"Content-Type": "application/x-www-form-urlencoded"}, 415, "Content-Type"),
        ({"Content-Type": "multipart/form-data; boundary=x"}, 415, "Content-Type"),
        ({}, 415, "Content-Type"),  # a Blob body without a type
        # any request a page makes carries its Origin
        ({"Content-Type": "application/json", "Origin": "https://evil.example"}, 403, "Origin"),
        ({"Content-Type": "application/json", "Origin": "null"}, 403, "Origin"),
        # DNS rebinding: the page's own name in Host
        ({"Content-Type": "application/json", "Host": "evil.example"}, 403, "Host"),
        ({"Content-Type": "application/json", "Host": "evil.example:8000"}, 403, "Host"),
        ({"Content-Type": "application/json", "Host": "10.0.0.1:8000"}, 403, "Host"),
    ],
)
def test_requests_a_web_page_could_send_are_refused_before_anything_runs(
    server: Server, headers: dict[str, str], status: int, word: str
):
    before = len(_raw_json(server, "GET", "/api/v1/training_runs")["training_runs"])
    got, reply = _raw(server, "POST", "/api/v1/create_session", b"{}", headers)
    assert got == status, reply
    assert word in _detail(got, reply)
    # nothing ran: a model-creating request sent the same way creates no run
    body = json.dumps({"session_id": "s", "model_seq_id": 0, "base_model": MODEL}).encode()
    assert _raw(server, "POST", "/api/v1/create_model", body, headers)[0] == status
    assert len(_raw_json(server, "GET", "/api/v1/training_runs")["training_runs"]) == before


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::1]", "LOCALHOST", "127.0.0.2"])
def test_loopback_host_names_are_answered(server: Server, host: str):
    # 127.0.0.2: `--host 127.0.0.2` binds (any of 127.0.0.0/8 is loopback), and its requests
    # were refused as not loopback (`shell.loopback`, shared with sandbox-serve)
    headers = {"Content-Type": "application/json", "Host": f"{host}:{server.port}"}
    status, _reply = _raw(server, "POST", "/api/v1/create_session", b"{}", headers)
    assert status != 403


def test_a_200_mb_body_is_refused_from_its_header(server: Server):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        started = time.monotonic()
        connection.putrequest("POST", "/api/v1/create_session")
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Content-Length", str(200 << 20))
        connection.endheaders(b"{" * 1000)  # 1000 bytes of the 200 MB announced
        response = connection.getresponse()
        status, body = response.status, response.read()
        elapsed = time.monotonic() - started
    finally:
        connection.close()
    assert status == 413
    assert "limit" in _detail(status, body)
    assert elapsed < 10.0  # answered from the header, not after waiting for 200 MB
    assert _healthy(server)


def test_deleting_a_checkpoint_that_does_not_exist_is_404(server: Server, trainer: TrainingClient):
    status, reply = _raw(
        server, "DELETE", f"/api/v1/training_runs/{trainer.model_id}/checkpoints/weights/never"
    )
    detail = _detail(status, reply)
    assert status == 404, (status, detail)
    assert str(server.state_dir) not in detail  # the server names checkpoints by tinker path


def test_after_all_the_bad_input_the_server_is_healthy_and_works(
    server: Server, trainer: TrainingClient
):
    assert _healthy(server)
    output = trainer.forward_backward(BATCH, "cross_entropy").result(SDK_TIMEOUT_S)
    assert np.isfinite(output.metrics["loss:sum"])
    assert "Traceback" not in server.log_text()


# -- 2. the API key --


def test_the_api_key_is_required_and_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    with running_server(tmp_path / "state", api_key="tml-secret") as keyed:
        status, reply = _raw(keyed, "POST", "/api/v1/client/config", b"{}", JSON_HEADERS)
        assert status == 401 and "X-API-Key" in _detail(status, reply)
        status, reply = _raw(
            keyed, "POST", "/api/v1/create_session", b"{}", {"X-API-Key": "tml-wrong"}
        )
        assert status == 401

        _sdk_env(monkeypatch, keyed, "tml-wrong")
        started = time.monotonic()
        message = _raises(
            tinker.AuthenticationError,
            lambda: _rest(keyed, "tml-wrong").get_server_capabilities().result(SDK_TIMEOUT_S),
        )
        assert "X-API-Key" in message
        message = _raises(
            tinker.AuthenticationError,
            lambda: (
                tinker.ServiceClient()
                .create_lora_training_client(base_model=MODEL, rank=4)
                .result(SDK_TIMEOUT_S)
            ),
        )
        assert "X-API-Key" in message
        assert time.monotonic() - started < 10.0  # a 401 is not retried

        _sdk_env(monkeypatch, keyed, "tml-secret")
        capabilities = _rest(keyed, "tml-secret").get_server_capabilities().result(SDK_TIMEOUT_S)
        assert MODEL in {model.model_name for model in capabilities.supported_models}
        client = tinker.ServiceClient()
        try:  # a session and a sampling session: no model is built
            sampler = client.create_sampling_client(base_model=MODEL).result(SDK_TIMEOUT_S)
            assert sampler.get_base_model() == MODEL
        finally:
            client.close("success").result(30)
        assert _healthy(keyed)  # healthz needs no key


def test_the_command_line_refuses_a_public_host_without_a_key_and_documents_the_env(
    tmp_path: Path,
):
    started = time.monotonic()
    public = [RLPURE, "serve", "--host", "0.0.0.0", "--port", str(free_port())]
    refused = subprocess.Popen(
        [*public, "--state-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    helped = subprocess.Popen(  # concurrently: each pays the CLI's imports
        [RLPURE, "serve", "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    out, err = refused.communicate(timeout=60)
    assert time.monotonic() - started < 30.0  # at once, not after starting a model
    assert refused.returncode != 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("rlpure: "), err
    assert "--api-key" in lines[0] and "0.0.0.0" in lines[0]
    assert "Traceback" not in out + err
    assert not (tmp_path / "checkpoints").exists()  # refused before anything started
    help_text, _ = helped.communicate(timeout=60)
    assert helped.returncode == 0
    assert "TINKER_BASE_URL" in help_text and "TINKER_API_KEY" in help_text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "--port", "99999"], "--port 99999: cannot listen there: bind(): port must be"),
        (["serve", "--port", "-5"], "--port -5: cannot listen there"),
        (["sandbox-serve", "--port", "70000"], "port 70000: cannot listen there"),
        (["serve", "--seed", "-1"], "--seed -1: expected an integer >= 0"),
        (
            ["serve", "--seed", str(2**64)],
            f"--seed {2**64}: expected an integer in [0, {2**63 - 1}]",
        ),
        (["serve", "--max-samplers", "0"], "--max-samplers 0: expected an integer >= 1"),
        (["serve", "--max-body-mb", "0"], "--max-body-mb 0: expected an integer >= 1"),
        (["serve", "--session-timeout", "0"], "--session-timeout 0: expected an integer >= 1"),
        (["serve", "--state-dir", "{file}"], "cannot make it a directory: [Errno 17] File exists"),
    ],
    ids=[
        "port-high",
        "port-negative",
        "sandbox-port",
        "seed",
        "seed-high",
        "samplers",
        "body",
        "session-timeout",
        "state-file",
    ],
)
def test_bad_server_arguments_are_one_line_before_anything_starts(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    argv = [arg.replace("{file}", str(a_file)) for arg in argv]
    if argv[0] == "serve" and "--state-dir" not in argv:
        argv += ["--state-dir", str(tmp_path / "state")]
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == [lines[0]] and lines[0].startswith("rlpure: configuration error: "), err
    assert message in lines[0]
    assert not out and not (tmp_path / "state").exists()


def test_the_session_timeout_flag_reaches_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Built(Exception):
        pass

    def engine(**kwargs: Any) -> None:
        raise Built(kwargs)

    monkeypatch.setattr(serve_module, "Engine", engine)
    argv = ["serve", "--port", "0", "--state-dir", str(tmp_path), "--session-timeout", "3600"]
    with pytest.raises(Built) as built:
        cli.main(argv)
    assert built.value.args[0]["session_timeout_s"] == 3600.0


# -- 3. the SDK's tinker CLI --


def test_the_tinker_cli_lists_describes_expires_and_deletes_checkpoints(
    server: Server, trainer: TrainingClient, saved: dict[str, str]
):
    run_id = trainer.model_id
    state, sampler = saved["state"], saved["sampler"]
    assert state == f"tinker://{run_id}/weights/safety-state"
    assert sampler == f"tinker://{run_id}/sampler_weights/safety-sampler"

    everything = _cli_json(server, "checkpoint", "list", "--limit", "0")
    assert {state, sampler} <= {item["tinker_path"] for item in everything["checkpoints"]}
    listed = _listed(server, run_id)
    assert {state, sampler} <= set(listed)
    assert listed[state]["checkpoint_type"] == "training"
    assert listed[sampler]["checkpoint_type"] == "sampler"

    runs = _cli_json(server, "run", "list", "--limit", "0")
    assert run_id in {run["training_run_id"] for run in runs["runs"]}
    info = _cli_json(server, "run", "info", run_id)
    assert info["training_run_id"] == run_id and info["base_model"] == MODEL

    assert _folder(server, state).is_dir()
    before = time.time()
    _cli(server, "checkpoint", "set-ttl", sampler, "--ttl", "7200")
    after = time.time()
    _cli(server, "checkpoint", "delete", "--yes", state)
    listed = _listed(server, run_id)
    assert state not in listed
    assert not _folder(server, state).exists()
    assert sampler in listed and _folder(server, sampler).is_dir()
    expires = listed[sampler]["expires_at"]
    assert expires is not None
    assert before + 7200 - 1 <= _expiry(expires) <= after + 7200 + 1


def test_checkpoints_named_like_an_action_are_deleted_and_given_a_ttl(
    server: Server, trainer: TrainingClient
):
    """`weights/ttl` is the checkpoint `ttl`, `weights/ttl/ttl` its TTL: the action suffix
    used to be stripped from any path, so these were refused as malformed ids."""
    rest = _rest(server)
    named = {
        name: trainer.save_state(name).result(SDK_TIMEOUT_S).path
        for name in ("ttl", "publish", "external_weights_urls")
    }
    rest.set_checkpoint_ttl_from_tinker_path(named["ttl"], 3600).result(SDK_TIMEOUT_S)
    listed = _listed(server, trainer.model_id)
    assert listed[named["ttl"]]["expires_at"] is not None
    for path in named.values():
        rest.delete_checkpoint_from_tinker_path(path).result(SDK_TIMEOUT_S)
        assert not _folder(server, path).exists()


# -- 4. expiry --


def test_a_save_with_a_ttl_lists_its_expiry(
    server: Server, service: tinker.ServiceClient, trainer: TrainingClient
):
    before = time.time()
    short = trainer.save_state("ttl-short", ttl_seconds=1).result(SDK_TIMEOUT_S).path
    long = trainer.save_state("ttl-long", ttl_seconds=3600).result(SDK_TIMEOUT_S).path
    after = time.time()
    rest = _rest(server)
    page = rest.list_checkpoints(trainer.model_id).result(SDK_TIMEOUT_S)
    expiry = {item.tinker_path: item.expires_at for item in page.checkpoints}
    long_expiry = expiry[long]
    assert long_expiry is not None
    assert before + 3600 - 1 <= long_expiry.timestamp() <= after + 3600 + 1
    if short in expiry:
        short_expiry = expiry[short]
        assert short_expiry is not None
        assert before <= short_expiry.timestamp() <= after + 2
    else:  # the server's 30 s janitor ran in between and did its job
        assert not _folder(server, short).exists()


def test_the_janitor_pass_deletes_expired_checkpoints_and_forgets_them(tmp_path: Path):
    engine = Engine(state_dir=tmp_path / "state")
    try:
        client = engine.service.create_lora_training_client(
            MODEL, 4, training_run_id="s-x:train:0"
        ).result()
        doomed = engine.checkpoint_ref(client.save_state("doomed").result().path)
        kept = engine.checkpoint_ref(client.save_state("kept").result().path)
        forever = engine.checkpoint_ref(client.save_state("forever").result().path)
        engine.ttl.set(doomed, 0)
        engine.ttl.set(kept, 3600)
        assert engine.delete_expired_checkpoints() == [doomed.tinker_path]
        assert not doomed.directory(engine.checkpoint_root).exists()
        assert kept.directory(engine.checkpoint_root).is_dir()
        assert forever.directory(engine.checkpoint_root).is_dir()
        assert engine.ttl.expires_at(doomed) is None
        assert engine.ttl.expires_at(kept) is not None
        table = json.loads((engine.checkpoint_root / "ttl.json").read_text())
        assert set(table) == {kept.tinker_path}
        assert engine.delete_expired_checkpoints() == []  # nothing due twice
    finally:
        engine.close()


# -- 5. shutdown --


def _probe_loss(trainer: TrainingClient) -> float:
    return float(trainer.forward(BATCH, "cross_entropy").result(SDK_TIMEOUT_S).metrics["loss:sum"])


def test_sigterm_mid_training_exits_0_soon_and_keeps_the_saves_a_client_got(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    state_dir = tmp_path / "state"
    adam = types.AdamParams(learning_rate=1e-2)
    with running_server(state_dir) as first:
        _sdk_env(monkeypatch, first)
        service = tinker.ServiceClient()
        trainer = service.create_lora_training_client(base_model=MODEL, rank=4).result(
            SDK_TIMEOUT_S
        )
        trainer.forward_backward(BATCH, "cross_entropy").result(SDK_TIMEOUT_S)
        trainer.optim_step(adam).result(SDK_TIMEOUT_S)
        loss_at_save = _probe_loss(trainer)
        kept = trainer.save_state("kept").result(SDK_TIMEOUT_S).path
        queued: list[tinker.APIFuture[Any]] = []
        try:
            for _ in range(6):  # queued back to back, changing the weights after the save
                queued.append(trainer.forward_backward(BATCH, "cross_entropy"))
                queued.append(trainer.optim_step(adam))
            queued.append(trainer.save_state("late"))
            started = time.monotonic()
            first.process.send_signal(signal.SIGTERM)
            time.sleep(0.2)  # the handler has run: the engine refuses work from now on
            step = types.OptimStepRequest(model_id=trainer.model_id, seq_id=1000, optim_params=adam)
            late = urllib.request.Request(
                f"{first.url}/api/v1/optim_step",
                data=step.model_dump_json(exclude_none=True).encode(),
                headers=JSON_HEADERS,
            )
            with pytest.raises(
                (urllib.error.URLError, ConnectionError)
            ) as refused:  # 503 or closed
                urllib.request.urlopen(late, timeout=10)
            assert time.monotonic() - started < 10.0  # refused, not left hanging
            if isinstance(refused.value, urllib.error.HTTPError):
                assert refused.value.code == 503
                assert "shutting down" in _detail_5xx(refused.value.read())
            try:
                code = first.process.wait(15.0)
            except subprocess.TimeoutExpired:
                pytest.fail(f"still running 15 s after SIGTERM:\n{first.log_text()}")
            assert time.monotonic() - started < 15.0
            assert code == 0, first.log_text()
            assert "stopped after" in first.log_text()
            assert "Traceback" not in first.log_text()
        finally:  # passed or not: else the SDK retries them against the dead server for
            # minutes each, in its thread, through the tests that follow in this process
            # (Hypothesis then sees the global `random` move under its strategies: the SDK's
            # retry jitter)
            for future in queued:
                future.future().cancel()
            service.holder.close()

    with running_server(state_dir) as second:
        _sdk_env(monkeypatch, second)
        service = tinker.ServiceClient()
        try:
            resumed = service.create_training_client_from_state(kept).result(SDK_TIMEOUT_S)
            assert resumed.model_id != trainer.model_id
            assert np.isclose(_probe_loss(resumed), loss_at_save, rtol=1e-5, atol=1e-6)
        finally:
            service.close("success").result(30)
        started = time.monotonic()
        assert second.stop(signal.SIGINT, timeout_s=15.0) == 0, second.log_text()
        assert time.monotonic() - started < 15.0
        assert "stopped after" in second.log_text()
        assert "Traceback" not in second.log_text()


# -- 6. slow and dying clients --


_SAMPLE_FOREVER = """
import collections
import sys
import tinker
from tinker import types

sampler = tinker.ServiceClient().create_sampling_client(base_model=sys.argv[1]).result()


def sample():
    prompt = types.ModelInput.from_ints([9, 8, 7])
    return sampler.sample(prompt, 4, types.SamplingParams(max_tokens=48))


in_flight = collections.deque(sample() for _ in range(4))
while True:  # always 3 or 4 requests in flight
    in_flight.popleft().result()
    print("sampled", flush=True)
    in_flight.append(sample())
"""


def _wait_for_line(process: subprocess.Popen[bytes], text: bytes, timeout_s: float) -> None:
    assert process.stdout is not None
    deadline = time.monotonic() + timeout_s
    seen = b""
    while text not in seen:
        left = deadline - time.monotonic()
        if left <= 0 or process.poll() is not None:
            raise AssertionError(f"no {text!r} from the client: {seen!r}")
        ready, _, _ = select.select([process.stdout], [], [], left)
        if ready:
            seen += os.read(process.stdout.fileno(), 4096)


def test_a_half_sent_body_does_not_hold_up_other_clients(
    server: Server, service: tinker.ServiceClient, trainer: TrainingClient
):
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as slow:
        slow.sendall(
            b"POST /api/v1/create_session HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n" + b'{"ta'
        )
        started = time.monotonic()
        sampler = service.create_sampling_client(base_model=MODEL).result(SDK_TIMEOUT_S)
        sample = sampler.sample(PROMPT, 2, types.SamplingParams(max_tokens=4)).result(SDK_TIMEOUT_S)
        output = trainer.forward_backward(BATCH, "cross_entropy").result(SDK_TIMEOUT_S)
        assert time.monotonic() - started < 60.0
        assert len(sample.sequences) == 2
        assert np.isfinite(output.metrics["loss:sum"])
        slow.setblocking(False)
        with pytest.raises(BlockingIOError):
            slow.recv(1)  # the half-sent request is still waiting for its body, unanswered
    assert _healthy(server)
    time.sleep(0.5)  # the server has seen the hang-up before later tests read its log


def test_a_client_hanging_up_mid_body_is_not_logged_as_a_crash(server: Server):
    logged = len(server.log_text())
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as gone:
        gone.sendall(
            b"POST /api/v1/create_session HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n" + b'{"ta'
        )
        time.sleep(0.2)  # the handler is waiting for the rest of the body
    assert _healthy(server)
    time.sleep(1.0)  # the server has seen the hang-up and logged what it logs
    assert "Traceback" not in server.log_text()[logged:]


def test_a_client_killed_mid_sample_leaves_the_server_serving(
    server: Server, service: tinker.ServiceClient, trainer: TrainingClient
):
    logged = len(server.log_text())
    child = subprocess.Popen(
        [sys.executable, "-c", _SAMPLE_FOREVER, MODEL],
        env=child_env(server),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # a failing child shows why in the assertion
    )
    try:
        _wait_for_line(child, b"sampled", 120.0)
        child.send_signal(signal.SIGKILL)  # with requests in flight
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert _healthy(server)
    sampler = service.create_sampling_client(base_model=MODEL).result(SDK_TIMEOUT_S)
    sample = sampler.sample(PROMPT, 3, types.SamplingParams(max_tokens=4)).result(SDK_TIMEOUT_S)
    assert len(sample.sequences) == 3
    output = trainer.forward_backward(BATCH, "cross_entropy").result(SDK_TIMEOUT_S)
    assert np.isfinite(output.metrics["loss:sum"])
    assert "Traceback" not in server.log_text()[logged:]
