"""A scripted Tinker SDK stand-in: fake service, training and sampling clients.

Gathered by `shell.fakes`. `FakeServiceClient` → `FakeTrainingClient` →
`FakeSamplingClient` — the `shell.clients` protocols (the SDK methods the shell calls, with their
SDK 0.38 signatures; options a fake has no use for are accepted and ignored) plus
`load_state_with_optimizer`, with the SDK's own types (`tinker.SampleResponse`,
`tinker.AdamParams`, `tinker.Datum`, `tinker.ForwardBackwardOutput`), SDK 0.38 calling
conventions (methods return a `tinker.APIFuture` at once; await it), and an ordered `events`
log of every call, submit and await. `forward_backward` checks the `Datum`s as
the SDK would send them: it builds the SDK's `ForwardBackwardRequest`, serialises it with the
SDK's own wire encoder, and checks the bytes equal those of the same datums rebuilt through the
SDK's pydantic-validating constructors.

Conventions: the fake sampler draws 1–`max_tokens` (at most 4) tokens uniformly from
`[0, vocab_size)` with a `numpy` generator seeded by `SamplingParams.seed` (or the client's own
seed); with temperature 0 it returns the single token `prompt[-1] % vocab_size`. Logprobs are
those of a uniform distribution, `-log(vocab_size)`, so sampling and "training" logprobs agree.
Saved states live in a `FakeCheckpointStore` that outlives clients, as a server would.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import itertools
import json
import math
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np
import tinker
from tinker.lib.retry_handler import RetryConfig
from tinker.proto.request_conv import forward_backward_request_to_proto
from tinker.types import (
    ForwardBackwardInput,
    ForwardBackwardRequest,
    LoadWeightsResponse,
    SaveWeightsForSamplerResponse,
    SaveWeightsResponse,
)

from rlpure.losses import LOSSES
from rlpure.model import ByteTokenizer

__all__ = [
    "FakeCheckpointStore",
    "FakeFuture",
    "FakeSamplingClient",
    "FakeServiceClient",
    "FakeTrainingClient",
]

T = TypeVar("T")


class FakeFuture(tinker.APIFuture[T]):
    """An `APIFuture` holding a ready value; awaiting it logs `("await", label)` in `events`."""

    def __init__(self, value: T, *, events: list[tuple[Any, ...]], label: str) -> None:
        self._value = value
        self._events = events
        self.label = label

    async def result_async(self, timeout: float | None = None) -> T:
        self._events.append(("await", self.label))
        await asyncio.sleep(0)
        return self._value

    def result(self, timeout: float | None = None) -> T:
        self._events.append(("await", self.label))
        return self._value

    def future(self) -> concurrent.futures.Future[T]:
        done: concurrent.futures.Future[T] = concurrent.futures.Future()
        done.set_result(self._value)
        return done


class _LatentFuture(tinker.APIFuture[T]):
    """An `APIFuture` whose value an `async` function computes when first awaited."""

    def __init__(self, make: Callable[[], Awaitable[T]]) -> None:
        self._make = make

    async def result_async(self, timeout: float | None = None) -> T:
        return await self._make()

    def result(self, timeout: float | None = None) -> T:
        raise RuntimeError("fake futures are awaited, not waited on with .result()")

    def future(self) -> concurrent.futures.Future[T]:
        raise RuntimeError("fake futures are awaited, not converted")


class FakeCheckpointStore:
    """Saved training states by path; shared by clients, so it survives a "restart".

    With `file`, states are also kept in that JSON file (rewritten atomically on each save), so
    a new process — e.g. a run restarted after a kill — sees the states saved before it.
    """

    def __init__(self, file: str | os.PathLike[str] | None = None) -> None:
        self.file = None if file is None else Path(file)
        self.states: dict[str, dict[str, Any]] = {}
        if self.file is not None and self.file.exists():
            self.states = json.loads(self.file.read_text(encoding="utf-8"))

    def save(self, path: str, state: dict[str, Any]) -> None:
        self.states[path] = dict(state)
        if self.file is not None:
            tmp = self.file.with_name(self.file.name + ".tmp")
            tmp.write_text(json.dumps(self.states), encoding="utf-8")
            os.replace(tmp, self.file)

    def load(self, path: str) -> dict[str, Any]:
        if path not in self.states:
            raise FileNotFoundError(f"no saved state at {path}")
        return self.states[path]


class FakeSamplingClient:
    """`sample` / `compute_logprobs` of `tinker.SamplingClient` (SDK 0.38: futures at once).

    Attributes:
        version: number of optimizer steps behind these weights.
        sample_calls: `(prompt tokens, num_samples, sampling_params)` of every call.
    """

    def __init__(
        self,
        *,
        version: int = 0,
        vocab_size: int = 16,
        seed: int = 0,
        events: list[tuple[Any, ...]] | None = None,
        fail_at: Mapping[int, BaseException] | None = None,
        latency: float = 0.0,
    ) -> None:
        self.version = version
        self.vocab_size = vocab_size
        self.events = events if events is not None else []
        self.fail_at = dict(fail_at or {})
        self.latency = latency
        self.sample_calls: list[tuple[list[int], int, tinker.SamplingParams]] = []
        self._rng = np.random.default_rng(seed)

    def sample(
        self,
        prompt: tinker.ModelInput,
        num_samples: int,
        sampling_params: tinker.SamplingParams,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        topk_sample_logprobs: int = 0,
        target_prompt_logprobs: tinker.TensorData | None = None,
        prompt_alt_tokens_k: int = 0,
        prompt_logprobs_last_n: int | None = None,
    ) -> tinker.APIFuture[tinker.SampleResponse]:
        """Validates the request at once (as the SDK does), samples when awaited.

        The SDK's prompt-logprob and top-k options are accepted and ignored.
        """
        if not isinstance(prompt, tinker.ModelInput):
            raise TypeError(f"sample.prompt: expected tinker.ModelInput, got {type(prompt)}")
        if not isinstance(sampling_params, tinker.SamplingParams):
            raise TypeError("sample.sampling_params: expected tinker.SamplingParams")
        return _LatentFuture(lambda: self._sample(prompt, num_samples, sampling_params))

    async def _sample(
        self,
        prompt: tinker.ModelInput,
        num_samples: int,
        sampling_params: tinker.SamplingParams,
    ) -> tinker.SampleResponse:
        n = len(self.sample_calls)
        tokens_in = prompt.to_ints()
        self.sample_calls.append((tokens_in, num_samples, sampling_params))
        self.events.append(("sample", self.version, len(tokens_in), num_samples))
        if self.latency:
            await asyncio.sleep(self.latency)
        if n in self.fail_at:
            raise self.fail_at[n]
        rng = (
            self._rng
            if sampling_params.seed is None
            else np.random.default_rng(sampling_params.seed)
        )
        max_tokens = min(4, sampling_params.max_tokens or 4)
        sequences = []
        for i in range(num_samples):
            if sampling_params.temperature == 0:
                tokens = np.asarray([tokens_in[-1] % self.vocab_size if tokens_in else 0])
            else:
                length = int(rng.integers(1, max_tokens + 1))
                tokens = rng.integers(0, self.vocab_size, size=length)
            sequences.append(
                tinker.SampledSequence(
                    stop_reason="stop",
                    sequence_id=f"v{self.version}-c{n}-s{i}",
                    tokens_np=tokens.astype(np.int32),
                    logprobs_np=np.full(len(tokens), -math.log(self.vocab_size), np.float32),
                )
            )
        return tinker.SampleResponse(sequences=sequences)

    def compute_logprobs(
        self, prompt: tinker.ModelInput, prompt_logprobs_last_n: int | None = None
    ) -> tinker.APIFuture[list[float | None]]:
        """Logprob of each prompt token under the fake reference: `-log(V) - 0.1` (None first).

        `prompt_logprobs_last_n` is accepted and ignored (every token is scored).
        """
        tokens = prompt.to_ints()
        self.events.append(("compute_logprobs", self.version, len(tokens)))
        logprobs: list[float | None] = [None]
        logprobs += [-math.log(self.vocab_size) - 0.1] * (len(tokens) - 1)
        return FakeFuture(logprobs, events=self.events, label="compute_logprobs")


# Tinker's inputs per built-in loss (`rlpure.losses.LOSSES`; gspo's `sequence_ratio_mask`
# included, which this table once left out)
_LOSS_INPUTS = {name: set(spec.required_inputs) for name, spec in LOSSES.items()}


def _check_datums(data: list[tinker.Datum], loss_fn: str) -> None:
    """Checks each datum's type, its `loss_fn_inputs` keys for `loss_fn` and their lengths."""
    expected = _LOSS_INPUTS.get(loss_fn)
    for d, datum in enumerate(data):
        if not isinstance(datum, tinker.Datum):
            raise TypeError(f"forward_backward.data[{d}]: expected tinker.Datum")
        keys = set(datum.loss_fn_inputs)
        if expected is not None and keys != expected:
            raise ValueError(
                f"forward_backward.data[{d}].loss_fn_inputs: keys {sorted(keys)} != "
                f"{sorted(expected)} for loss_fn {loss_fn!r}"
            )
        for key, td in datum.loss_fn_inputs.items():
            if td.shape != [datum.model_input.length]:
                raise ValueError(
                    f"forward_backward.data[{d}].loss_fn_inputs[{key!r}]: shape {td.shape} "
                    f"!= model_input length {datum.model_input.length}"
                )


def _check_wire_encoding(
    data: list[tinker.Datum],
    loss_fn: str,
    loss_fn_config: Mapping[str, float | str] | None,
    *,
    seq_id: int,
) -> None:
    """Checks `data` encode to the same wire bytes as their SDK-validated rebuild."""
    # The SDK's own request record and wire encoder (what a real call would send).
    request = ForwardBackwardRequest(
        forward_backward_input=ForwardBackwardInput(
            data=data,
            loss_fn=loss_fn,  # type: ignore[arg-type]
            loss_fn_config=loss_fn_config,
        ),
        model_id="fake-model",
        seq_id=seq_id,
    )
    wire = forward_backward_request_to_proto(request).SerializeToString()
    # The same datums rebuilt through the SDK's validating constructors (pydantic
    # `ModelInput.from_ints`, list-based `loss_fn_inputs`) must encode to the same bytes.
    validated = [
        tinker.Datum(
            model_input=tinker.ModelInput.from_ints([int(t) for t in datum.model_input.to_ints()]),
            loss_fn_inputs={  # lists are coerced by `Datum.__post_init__`
                k: td.tolist()  # type: ignore[misc]
                for k, td in datum.loss_fn_inputs.items()
            },
            model_input_spans=datum.model_input_spans,
            loss_fn_input_spans=datum.loss_fn_input_spans,
        )
        for datum in data
    ]
    check = dataclasses.replace(
        request,
        forward_backward_input=dataclasses.replace(request.forward_backward_input, data=validated),
    )
    if forward_backward_request_to_proto(check).SerializeToString() != wire:
        raise ValueError("forward_backward: datums differ from their SDK-validated form")


class FakeTrainingClient:
    """A `shell.clients.TrainingClient` recording every call in `events`.

    Events: `("forward_backward", n_datums, loss_fn, loss_fn_config)`, `("forward", ...)` alike,
    `("optim_step", adam_params)`, `("await", label)`, `("save_state", name)`,
    `("load_state_with_optimizer", path)`, `("save_weights_and_get_sampling_client", version)`.
    Methods return futures at once, as SDK 0.38 does (`forward_backward(...)` submits; the
    result is awaited later). A subclass changes what its samplers do by setting
    `sampling_client_type`.
    """

    sampling_client_type: ClassVar[type[FakeSamplingClient]] = FakeSamplingClient
    """The class of the samplers `save_weights_and_get_sampling_client` returns."""

    def __init__(
        self,
        *,
        base_model: str,
        rank: int,
        store: FakeCheckpointStore,
        events: list[tuple[Any, ...]],
        vocab_size: int = 16,
        seed: int = 0,
        forward_backward_error: BaseException | None = None,
    ) -> None:
        self.base_model = base_model
        self.rank = rank
        self.store = store
        self.events = events
        self.vocab_size = vocab_size
        self.seed = seed
        self.forward_backward_error = forward_backward_error
        self.optim_steps = 0
        self.sent_data: list[list[tinker.Datum]] = []
        self._requests = itertools.count(1)

    def forward_backward(
        self,
        data: list[tinker.Datum],
        loss_fn: str,
        loss_fn_config: Mapping[str, float | str] | None = None,
    ) -> FakeFuture[tinker.ForwardBackwardOutput]:
        n = next(self._requests)
        self.events.append(("forward_backward", len(data), loss_fn, loss_fn_config))
        if self.forward_backward_error is not None:
            raise self.forward_backward_error
        if not data:
            raise ValueError("No data provided")  # what the SDK raises
        _check_datums(data, loss_fn)
        _check_wire_encoding(data, loss_fn, loss_fn_config, seq_id=n)
        self.sent_data.append(list(data))
        result = self._fake_output(data)
        return FakeFuture(result, events=self.events, label=f"forward_backward#{n}")

    def forward(
        self,
        data: list[tinker.Datum],
        loss_fn: str,
        loss_fn_config: Mapping[str, float | str] | None = None,
    ) -> FakeFuture[tinker.ForwardBackwardOutput]:
        """The fake model's logprobs without gradients: uniform `-log(V)` on every target (what
        the fake sampler reports for its tokens), loss = -sum; no gradient is accumulated."""
        n = next(self._requests)
        self.events.append(("forward", len(data), loss_fn, loss_fn_config))
        if not data:
            raise ValueError("No data provided")  # what the SDK raises
        _check_datums(data, loss_fn)
        outputs = []
        for datum in data:
            arr = np.full(datum.model_input.length, -math.log(self.vocab_size), np.float32)
            outputs.append({"logprobs": tinker.TensorData.from_numpy(arr)})
        loss = -float(sum(o["logprobs"].to_numpy().sum() for o in outputs))
        result = tinker.ForwardBackwardOutput(
            loss_fn_output_type="ArrayRecord", loss_fn_outputs=outputs, metrics={"loss:sum": loss}
        )
        return FakeFuture(result, events=self.events, label=f"forward#{n}")

    def _fake_output(self, data: list[tinker.Datum]) -> tinker.ForwardBackwardOutput:
        """Each datum's `logprobs` input (else uniform `-log(V)`) as its output; loss = -sum."""
        outputs = []
        loss = 0.0
        for datum in data:
            logprobs = datum.loss_fn_inputs.get("logprobs")
            arr = (
                logprobs.to_numpy()
                if logprobs is not None
                else np.full(datum.model_input.length, -math.log(self.vocab_size), np.float32)
            )
            outputs.append({"logprobs": tinker.TensorData.from_numpy(arr.astype(np.float32))})
            loss -= float(arr.sum())
        return tinker.ForwardBackwardOutput(
            loss_fn_output_type="ArrayRecord",
            loss_fn_outputs=outputs,
            metrics={"loss:sum": loss},
        )

    def optim_step(
        self,
        optim_params: tinker.OptimParams | None = None,
        *,
        adam_params: tinker.AdamParams | None = None,
    ) -> FakeFuture[tinker.OptimStepResponse]:
        """One optimizer step: `AdamParams` as `optim_params` or the legacy `adam_params`."""
        if optim_params is not None and adam_params is not None:
            raise ValueError("Specify optim_params or legacy adam_params, not both")  # the SDK's
        params = optim_params if optim_params is not None else adam_params
        if not isinstance(params, tinker.AdamParams):
            raise TypeError("optim_step.optim_params: expected tinker.AdamParams")
        n = next(self._requests)
        self.events.append(("optim_step", params))
        self.optim_steps += 1
        response = tinker.OptimStepResponse(metrics={"optim/step": float(self.optim_steps)})
        return FakeFuture(response, events=self.events, label=f"optim_step#{n}")

    def save_weights_and_get_sampling_client(
        self,
        name: str | None = None,
        retry_config: RetryConfig | None = None,
        record_stability_info: bool = False,
        kind: tinker.types.SamplingClientKind = "snapshot",
    ) -> FakeFuture[FakeSamplingClient]:
        """A sampler on the current weights (the SDK's options are accepted and ignored)."""
        self.events.append(("save_weights_and_get_sampling_client", self.optim_steps))
        client = self.sampling_client_type(
            version=self.optim_steps,
            vocab_size=self.vocab_size,
            seed=self.seed + self.optim_steps,
            events=self.events,
        )
        return FakeFuture(client, events=self.events, label="sampling_client")

    def save_state(
        self,
        name: str,
        ttl_seconds: int | None = None,
        overwrite: bool = False,
        user_metadata: dict[str, str] | None = None,
    ) -> FakeFuture[SaveWeightsResponse]:
        """Saves the state under `fake://<base_model>/state/<name>` (always overwriting)."""
        path = f"fake://{self.base_model}/state/{name}"
        self.events.append(("save_state", name))
        self.store.save(path, {"optim_steps": self.optim_steps})
        return FakeFuture(SaveWeightsResponse(path=path), events=self.events, label="save_state")

    def save_weights_for_sampler(
        self,
        name: str,
        ttl_seconds: int | None = None,
        user_metadata: dict[str, str] | None = None,
    ) -> FakeFuture[SaveWeightsForSamplerResponse]:
        """Saves the weights under `fake://<base_model>/sampler/<name>`."""
        path = f"fake://{self.base_model}/sampler/{name}"
        self.events.append(("save_weights_for_sampler", name))
        self.store.save(path, {"optim_steps": self.optim_steps})
        response = SaveWeightsForSamplerResponse(path=path)
        return FakeFuture(response, events=self.events, label="save_weights_for_sampler")

    def load_state_with_optimizer(
        self, path: str, weights_access_token: str | None = None
    ) -> FakeFuture[LoadWeightsResponse]:
        self.events.append(("load_state_with_optimizer", path))
        self.optim_steps = int(self.store.load(path)["optim_steps"])
        return FakeFuture(LoadWeightsResponse(path=path), events=self.events, label="load_state")

    def get_tokenizer(self) -> ByteTokenizer:
        return ByteTokenizer()


class FakeServiceClient:
    """A `shell.clients.ServiceClient` (Tinker's stand-in): creates fake training and sampling
    clients.

    Attributes:
        events: one ordered log shared by every client this service created.
        training_clients: the training clients created, in order.

    A subclass changes its training clients by setting `training_client_type`.
    """

    training_client_type: ClassVar[type[FakeTrainingClient]] = FakeTrainingClient
    """The class of the training clients this service creates."""

    backend_kind = "fake"
    """`shell.clients.NamesItsBackend`: this client is `TrainConfig.backend` `"fake"`."""

    def __init__(
        self,
        *,
        store: FakeCheckpointStore | None = None,
        vocab_size: int = 16,
        seed: int = 0,
    ) -> None:
        self.store = store if store is not None else FakeCheckpointStore()
        self.vocab_size = vocab_size
        self.seed = seed
        self.events: list[tuple[Any, ...]] = []
        self.training_clients: list[FakeTrainingClient] = []

    def _training_client(self, base_model: str, rank: int) -> FakeTrainingClient:
        client = self.training_client_type(
            base_model=base_model,
            rank=rank,
            store=self.store,
            events=self.events,
            vocab_size=self.vocab_size,
            seed=self.seed,
        )
        self.training_clients.append(client)
        return client

    def create_lora_training_client(
        self,
        base_model: str,
        rank: int = 32,
        seed: int | None = None,
        train_mlp: bool = True,
        train_attn: bool = True,
        train_unembed: bool = True,
        user_metadata: dict[str, str] | None = None,
        optimizer: tinker.types.OptimizerConfig | None = None,
    ) -> FakeFuture[FakeTrainingClient]:
        """A new fake training client (`seed`, the `train_*` flags, metadata and `optimizer`
        are accepted and ignored)."""
        self.events.append(("create_lora_training_client", base_model, rank))
        client = self._training_client(base_model, rank)
        return FakeFuture(client, events=self.events, label="training_client")

    def _from_state(self, path: str) -> FakeTrainingClient:
        state = self.store.load(path)
        base_model = path.removeprefix("fake://").split("/state/")[0]
        client = self._training_client(base_model, 0)
        client.optim_steps = int(state["optim_steps"])
        return client

    def create_training_client_from_state(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
        optimizer: tinker.types.OptimizerConfig | None = None,
    ) -> FakeFuture[FakeTrainingClient]:
        """A training client on the weights saved at `path` (the fake has no optimizer state
        beyond the step count its weights stand for, so this restores the same as
        `create_training_client_from_state_with_optimizer`; the other options are ignored)."""
        self.events.append(("create_training_client_from_state", path))
        return FakeFuture(self._from_state(path), events=self.events, label="training_client")

    def create_training_client_from_state_with_optimizer(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
    ) -> FakeFuture[FakeTrainingClient]:
        """A training client restored from `path` (weights and optimizer state)."""
        self.events.append(("create_training_client_from_state_with_optimizer", path))
        return FakeFuture(self._from_state(path), events=self.events, label="training_client")

    def create_sampling_client(
        self,
        model_path: str | None = None,
        base_model: str | None = None,
        retry_config: RetryConfig | None = None,
        record_stability_info: bool = False,
    ) -> FakeFuture[FakeSamplingClient]:
        """A sampler on saved sampler weights (`model_path`) or on the base model (version -1)."""
        self.events.append(("create_sampling_client", base_model, model_path))
        version = -1 if model_path is None else int(self.store.load(model_path)["optim_steps"])
        client = FakeSamplingClient(
            version=version, vocab_size=self.vocab_size, seed=self.seed, events=self.events
        )
        return FakeFuture(client, events=self.events, label="sampling_client")
