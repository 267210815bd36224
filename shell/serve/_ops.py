"""The server's operations: validated SDK requests → calls on the local clients → `Reply`s.

Conventions:
- Each builder checks what it can before anything runs (raising `BadRequest`, a 400 naming the
  field) and returns the operation the engine runs later on its worker: a `TrainingOp` on one
  training model, a factory for a new one, or a coroutine on a sampling client.
- The local clients speak `tinker.types` already; these functions only translate ids and paths
  (local checkpoint folders ↔ `tinker://` paths) and encode results (`shell.serve._wire`).
- `user_metadata` values that are not strings (the SDK's create requests allow any JSON value)
  are stored as their JSON text, since runs and checkpoints record `dict[str, str]`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from tinker import types

from shell.errors import CheckpointError
from shell.local import LocalSamplingClient, LocalTrainingClient
from shell.local._checkpoints import read_checkpoint_info
from shell.serve._engine import Engine, TrainingOp
from shell.serve._paths import CheckpointRef, PathError, ref_from_directory
from shell.serve._replies import BadRequest, Reply, json_reply, proto_reply
from shell.serve._ttl import CheckpointTtl
from shell.serve._wire import (
    ForwardBackwardCall,
    encode_forward_backward_output,
    encode_sample_response,
)

__all__ = [
    "check_sample_request",
    "checkpoint_base_model",
    "create_from_state",
    "create_model",
    "forward_backward",
    "load_into",
    "optim_step",
    "sample",
    "save_weights",
    "save_weights_for_sampler",
    "served_checkpoints",
    "served_run",
]


def _metadata(metadata: dict[str, Any] | None) -> dict[str, str] | None:
    if metadata is None:
        return None
    return {
        str(key): value if isinstance(value, str) else json.dumps(value)
        for key, value in metadata.items()
    }


def _adam_only(optimizer: types.OptimizerConfig | None, field: str) -> None:
    if optimizer is not None and not isinstance(optimizer, types.AdamOptimizerConfig):
        raise BadRequest(f"{field}: rlpure serve trains with AdamW only, got {optimizer.type!r}")


def create_model(
    engine: Engine, body: types.CreateModelRequest, model_id: str
) -> Callable[[], LocalTrainingClient]:
    """`create_model`: a LoRA training client named `model_id` (built on the worker)."""
    _adam_only(body.optimizer_config, "optimizer_config")
    lora = body.lora_config or types.LoraConfig(rank=32)
    if lora.rank < 1:
        raise BadRequest(f"lora_config.rank: expected >= 1, got {lora.rank}")

    def make() -> LocalTrainingClient:
        return engine.service.create_lora_training_client(
            body.base_model,
            lora.rank,
            lora.seed,
            lora.train_mlp,
            lora.train_attn,
            lora.train_unembed,
            _metadata(body.user_metadata),
            training_run_id=model_id,
        ).result()

    return make


def create_from_state(
    engine: Engine, body: types.LoadWeightsRequest, directory: str, model_id: str
) -> Callable[[], LocalTrainingClient]:
    """`load_weights` with a session: a new training client from a saved state."""
    _adam_only(body.optimizer_config, "optimizer_config")
    metadata = _metadata(body.user_metadata)

    def make() -> LocalTrainingClient:
        service = engine.service
        if body.optimizer:
            return service.create_training_client_from_state_with_optimizer(
                directory, body.base_model, metadata, training_run_id=model_id
            ).result()
        return service.create_training_client_from_state(
            directory, body.base_model, metadata, training_run_id=model_id
        ).result()

    return make


def forward_backward(call: ForwardBackwardCall) -> TrainingOp:
    """`forward_backward` (or `forward` when `forward_only`) with the decoded datums."""

    def op(client: LocalTrainingClient) -> Reply:
        run = client.forward if call.forward_only else client.forward_backward
        output = run(list(call.data), call.loss_fn, call.loss_fn_config).result()  # type: ignore[arg-type]
        return proto_reply(encode_forward_backward_output(output))

    return op


def optim_step(body: types.OptimStepRequest) -> TrainingOp:
    if not isinstance(body.optim_params, types.AdamParams):
        raise BadRequest(
            f"optim_params: rlpure serve applies AdamW steps only, got {body.optim_params!r}"
        )
    params = body.optim_params

    def op(client: LocalTrainingClient) -> Reply:
        return json_reply(client.optim_step(params).result())

    return op


def save_weights(
    engine: Engine, body: types.SaveWeightsRequest, name: str, ttl: CheckpointTtl
) -> TrainingOp:
    """`save_weights` (the SDK's `save_state`): weights and Adam state."""

    def op(client: LocalTrainingClient) -> Reply:
        saved = client.save_state(name, None, body.overwrite, body.user_metadata).result()
        ref = engine.checkpoint_ref(saved.path)
        ttl.set(ref, body.ttl_seconds)
        return json_reply(types.SaveWeightsResponse(path=ref.tinker_path))

    return op


def save_weights_for_sampler(
    engine: Engine,
    body: types.SaveWeightsForSamplerRequest,
    name: str | None,
    session_id: str,
    ttl: CheckpointTtl,
) -> TrainingOp:
    """Named: sampler weights on disk (a path). Unnamed: a sampler on the current weights."""

    def op(client: LocalTrainingClient) -> Reply:
        if name is not None:
            saved = client.save_weights_for_sampler(name, None, body.user_metadata).result()
            ref = engine.checkpoint_ref(saved.path)
            ttl.set(ref, body.ttl_seconds)
            return json_reply(types.SaveWeightsForSamplerResponseInternal(path=ref.tinker_path))
        sampler = client.save_weights_and_get_sampling_client(kind=body.kind).result()
        sampler_id = f"{session_id}:sample:{body.sampling_session_seq_id}"
        engine.add_snapshot_sampler(sampler_id, session_id, sampler, client.model_id)
        return json_reply(
            types.SaveWeightsForSamplerResponseInternal(sampling_session_id=sampler_id)
        )

    return op


def load_into(directory: str, ref: CheckpointRef, *, with_optimizer: bool) -> TrainingOp:
    """The SDK's (deprecated) `load_state[_with_optimizer]` into an existing model."""

    def op(client: LocalTrainingClient) -> Reply:
        if with_optimizer:
            client.load_state_with_optimizer(directory).result()
        else:
            client.load_state(directory).result()
        return json_reply(types.LoadWeightsResponse(path=ref.tinker_path, model_id=client.model_id))

    return op


def checkpoint_base_model(directory: str, ref: CheckpointRef) -> str:
    """The base model a checkpoint was trained from (404 when there is no checkpoint)."""
    try:
        return read_checkpoint_info(directory).base_model
    except CheckpointError as err:
        raise BadRequest(f"no readable checkpoint at {ref.tinker_path}", 404) from err


def check_sample_request(body: types.SampleRequest) -> None:
    """Refuses a malformed request (400 naming the option)."""
    if body.num_samples < 1:
        raise BadRequest(f"num_samples: expected >= 1, got {body.num_samples}")
    if body.prompt_logprobs_last_n is not None and not body.prompt_logprobs:
        raise BadRequest("prompt_logprobs_last_n: requires prompt_logprobs")


def _tensor_data(model: Any) -> types.TensorData | None:
    """The SDK's request model of a tensor (JSON) as the `TensorData` the clients take."""
    if model is None:
        return None
    return types.TensorData(
        data=list(model.data),
        dtype=model.dtype,
        shape=None if model.shape is None else list(model.shape),
        sparse_crow_indices=model.sparse_crow_indices,
        sparse_col_indices=model.sparse_col_indices,
    )


def sample(
    body: types.SampleRequest,
) -> Callable[[LocalSamplingClient], Coroutine[Any, Any, Reply]]:
    """`asample` on a sampling client (queued with concurrent requests into shared calls)."""

    async def run(client: LocalSamplingClient) -> Reply:
        future = client.sample(
            body.prompt,
            body.num_samples,
            body.sampling_params,
            include_prompt_logprobs=bool(body.prompt_logprobs),
            prompt_logprobs_last_n=body.prompt_logprobs_last_n,
            topk_prompt_logprobs=body.topk_prompt_logprobs,
            topk_sample_logprobs=body.topk_sample_logprobs,
            prompt_alt_tokens_k=body.prompt_alt_tokens_k,
            target_prompt_logprobs=_tensor_data(body.target_prompt_logprobs),
            request_number=body.seq_id,
        )
        response = await future.result_async()
        return proto_reply(encode_sample_response(response))

    return run


def _served_checkpoint(
    checkpoint: types.Checkpoint, engine: Engine, ttl: CheckpointTtl
) -> types.Checkpoint:
    """A local checkpoint record with its tinker path, SDK id and expiry."""
    try:
        ref = ref_from_directory(checkpoint.tinker_path, engine.checkpoint_root)
    except PathError:
        return checkpoint
    return checkpoint.model_copy(
        update={
            "tinker_path": ref.tinker_path,
            "checkpoint_id": ref.checkpoint_id,
            "expires_at": ttl.expires_at(ref),
        }
    )


def served_run(run: types.TrainingRun, engine: Engine, ttl: CheckpointTtl) -> types.TrainingRun:
    """`run` with its checkpoints named as the server names them."""
    update: dict[str, Any] = {}
    for key in ("last_checkpoint", "last_sampler_checkpoint"):
        checkpoint = getattr(run, key)
        if checkpoint is not None:
            update[key] = _served_checkpoint(checkpoint, engine, ttl)
    return run.model_copy(update=update)


def served_checkpoints(
    page: types.CheckpointsListResponse, engine: Engine, ttl: CheckpointTtl
) -> types.CheckpointsListResponse:
    return page.model_copy(
        update={"checkpoints": [_served_checkpoint(c, engine, ttl) for c in page.checkpoints]}
    )
