"""The client boundary: the SDK interface the shell calls, and the backends behind `--backend`.

`ServiceClient`, `TrainingClient` and `SamplingClient` are `typing.Protocol`s holding exactly
the methods the shell calls (the training loop, the policy update, checkpoints and resume, the
completers, the recipes and the demo), each with the Tinker SDK 0.38 signature: the same
parameter names, order, kinds, defaults and types. Three implementations satisfy them, checked
by `tests/shell/test_client_protocols.py` both under mypy and at runtime:

- `tinker.ServiceClient` (and its `TrainingClient`, `SamplingClient`), the real service;
- `shell.local.LocalServiceClient` (`LocalTrainingClient`, `LocalSamplingClient`), the local
  JAX backend;
- `shell.fakes.FakeServiceClient` (`FakeTrainingClient`, `FakeSamplingClient`), the scripted
  stand-in for tests.

Conventions (SDK 0.38):
- Every method returns at once with an `APIFuture` of its result (what a `tinker.APIFuture`
  offers the shell: `await f`, or `await f.result_async()`); nothing here is an `async def`.
  The client factories (`create_*_client`, `save_weights_and_get_sampling_client`) return a
  future of the client, awaited before use.
- The shell never retries around these calls: the SDK retries transient failures itself.
- `make_service_client(config)` opens the backend a config names (`config.backend`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

import tinker
from tinker import types
from tinker.lib.retry_handler import RetryConfig

from shell.errors import ConfigError

__all__ = [
    "APIFuture",
    "BackendOptions",
    "NamesItsBackend",
    "SamplingClient",
    "ServiceClient",
    "TrainingClient",
    "backend_of",
    "describe_tinker_error",
    "make_service_client",
    "watch_tinker_retries",
]

logger = logging.getLogger(__name__)

T_co = TypeVar("T_co", covariant=True)


@runtime_checkable
class APIFuture(Protocol[T_co]):
    """What the shell uses of `tinker.APIFuture[T]`: awaiting it gives the `T`.

    `result_async` is the typed spelling of the same wait: the SDK's `__await__` carries no
    annotation, so it is through `result_async` that a type checker sees what an
    implementation's futures hold (a `tinker.APIFuture[tinker.TrainingClient]` is an
    `APIFuture[TrainingClient]` because `tinker.TrainingClient` is a `TrainingClient`).
    """

    def __await__(self) -> Generator[Any, Any, T_co]: ...

    async def result_async(self, timeout: float | None = None) -> T_co: ...


@runtime_checkable
class SamplingClient(Protocol):
    """The `tinker.SamplingClient` methods the shell calls (completers and the KL reference)."""

    def sample(
        self,
        prompt: types.ModelInput,
        num_samples: int,
        sampling_params: types.SamplingParams,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        topk_sample_logprobs: int = 0,
        target_prompt_logprobs: types.TensorData | None = None,
        prompt_alt_tokens_k: int = 0,
        prompt_logprobs_last_n: int | None = None,
    ) -> APIFuture[types.SampleResponse]:
        """`num_samples` completions of `prompt` (`SampleResponse.sequences`, one each)."""
        ...

    def compute_logprobs(
        self, prompt: types.ModelInput, prompt_logprobs_last_n: int | None = None
    ) -> APIFuture[list[float | None]]:
        """The logprob of every prompt token given those before it (None for the first)."""
        ...


@runtime_checkable
class TrainingClient(Protocol):
    """The `tinker.TrainingClient` methods the shell calls (policy update, checkpoints, recipes)."""

    def forward_backward(
        self,
        data: list[types.Datum],
        loss_fn: types.LossFnType,
        loss_fn_config: Mapping[str, float | str] | None = None,
    ) -> APIFuture[types.ForwardBackwardOutput]:
        """Adds the gradient of the summed loss over `data` to the accumulated gradient."""
        ...

    def forward(
        self,
        data: list[types.Datum],
        loss_fn: types.LossFnType,
        loss_fn_config: Mapping[str, float | str] | None = None,
    ) -> APIFuture[types.ForwardBackwardOutput]:
        """The loss and each datum's logprobs under the current weights, without gradients."""
        ...

    def optim_step(
        self,
        optim_params: types.OptimParams | None = None,
        *,
        adam_params: types.AdamParams | None = None,
    ) -> APIFuture[types.OptimStepResponse]:
        """Applies the accumulated gradient with the optimizer (the shell passes `AdamParams`)."""
        ...

    def save_state(
        self,
        name: str,
        ttl_seconds: int | None = None,
        overwrite: bool = False,
        user_metadata: dict[str, str] | None = None,
    ) -> APIFuture[types.SaveWeightsResponse]:
        """Saves weights and optimizer state; `.path` names the state for a later restore."""
        ...

    def save_weights_for_sampler(
        self,
        name: str,
        ttl_seconds: int | None = None,
        user_metadata: dict[str, str] | None = None,
    ) -> APIFuture[types.SaveWeightsForSamplerResponse]:
        """Saves the weights for `ServiceClient.create_sampling_client(model_path=...)`."""
        ...

    def save_weights_and_get_sampling_client(
        self,
        name: str | None = None,
        retry_config: RetryConfig | None = None,
        record_stability_info: bool = False,
        kind: types.SamplingClientKind = "snapshot",
    ) -> APIFuture[SamplingClient]:
        """A sampling client on the current weights."""
        ...

    # Any: Tinker's tokenizer is a `transformers` tokenizer, the local backend's and the fakes'
    # a `rlpure.model.ByteTokenizer`. The shell uses it as a `rlpure.render.TokenizerLike`,
    # which Hugging Face's `decode(token_ids, ...) -> str | list[str]` does not match statically.
    def get_tokenizer(self) -> Any:
        """The model's tokenizer (Tinker: loaded from the Hugging Face hub, blocking IO)."""
        ...


@runtime_checkable
class ServiceClient(Protocol):
    """The `tinker.ServiceClient` methods the shell calls (opening, restoring, KL reference)."""

    def create_lora_training_client(
        self,
        base_model: str,
        rank: int = 32,
        seed: int | None = None,
        train_mlp: bool = True,
        train_attn: bool = True,
        train_unembed: bool = True,
        user_metadata: dict[str, str] | None = None,
        optimizer: types.OptimizerConfig | None = None,
    ) -> APIFuture[TrainingClient]:
        """A new training client on `base_model` (LoRA of rank `rank` on Tinker)."""
        ...

    def create_training_client_from_state(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
        optimizer: types.OptimizerConfig | None = None,
    ) -> APIFuture[TrainingClient]:
        """A training client with the weights saved at `path` and a fresh optimizer."""
        ...

    def create_training_client_from_state_with_optimizer(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
    ) -> APIFuture[TrainingClient]:
        """A training client with the weights and optimizer state saved at `path`."""
        ...

    def create_sampling_client(
        self,
        model_path: str | None = None,
        base_model: str | None = None,
        retry_config: RetryConfig | None = None,
        record_stability_info: bool = False,
    ) -> APIFuture[SamplingClient]:
        """A sampling client on saved sampler weights (`model_path`) or on `base_model`."""
        ...


@runtime_checkable
class NamesItsBackend(Protocol):
    """A service client that says which `TrainConfig.backend` it is (the local backend says
    `"local"`, the scripted stand-in `"fake"`); one that does not, such as the SDK's own
    `tinker.ServiceClient`, is `"tinker"`. A wrapper that forwards attributes keeps its
    service's answer."""

    @property
    def backend_kind(self) -> str:
        """`"local"` or `"fake"`."""
        ...


def backend_of(service_client: object) -> Literal["local", "tinker", "fake"]:
    """The `TrainConfig.backend` of `service_client`, read from what it declares
    (`NamesItsBackend`), never from its class.

    Raises:
        ConfigError: a declared kind that is not a backend.
    """
    if not isinstance(service_client, NamesItsBackend):
        return "tinker"
    kind = service_client.backend_kind
    if not isinstance(kind, str):  # a mock answering every attribute declares nothing
        return "tinker"
    if kind == "local":
        return "local"
    if kind == "fake":
        return "fake"
    raise ConfigError(f"service client declares backend_kind={kind!r}; expected 'local' or 'fake'")


class BackendOptions(Protocol):
    """What `make_service_client` reads of a `shell.config.TrainConfig`.

    A protocol rather than `TrainConfig` itself because `shell.config` imports
    `shell.rollouts`, which imports `shell.completion`, which imports this module's
    `SamplingClient`: naming `TrainConfig` here would close that cycle.
    """

    @property
    def backend(self) -> str:
        """`"tinker"`, `"local"` or `"fake"`."""
        ...

    @property
    def seed(self) -> int:
        """The run's seed (the local and fake backends' randomness)."""
        ...

    @property
    def log_dir(self) -> str:
        """The run's log directory (the local and fake backends keep their states there)."""
        ...


def make_service_client(config: BackendOptions) -> ServiceClient:
    """The service client of `config.backend` (a `TrainConfig`, or anything with its fields).

    - `tinker`: `tinker.ServiceClient()`; the SDK reads `TINKER_API_KEY` from the environment.
    - `local`: `LocalServiceClient(seed=config.seed)` with states under `<log_dir>/local_states`
      (so a restarted run finds them).
    - `fake`: `FakeServiceClient` with states in `<log_dir>/fake_states.json`.

    Raises:
        ConfigError: `tinker` without `TINKER_API_KEY` in the environment.
    """
    log_dir = Path(config.log_dir)
    if config.backend == "tinker":
        if not os.environ.get("TINKER_API_KEY"):
            raise ConfigError(
                "backend 'tinker' needs the TINKER_API_KEY environment variable "
                "(export TINKER_API_KEY=...; it is never written to logs or configs)"
            )
        return tinker.ServiceClient()
    if config.backend == "local":
        from shell.local import LocalServiceClient

        return LocalServiceClient(seed=config.seed, checkpoint_dir=log_dir / "local_states")
    from shell.fakes import FakeCheckpointStore, FakeServiceClient

    log_dir.mkdir(parents=True, exist_ok=True)
    return FakeServiceClient(
        store=FakeCheckpointStore(log_dir / "fake_states.json"), seed=config.seed
    )


# --- Tinker failures on the console ------------------------------------------------------------


_TINKER_KEY_HINT = "check TINKER_API_KEY (a Tinker API key starts with 'tml-')"


def _tinker_url() -> str:
    from tinker.lib.base_url import resolve_base_url

    return resolve_base_url()


def describe_tinker_error(err: BaseException) -> str | None:
    """One line for a `tinker.TinkerError` (what failed, what to check), or None for others.

    The key's value is never part of the line (the SDK's messages do not carry it either).
    """
    if not isinstance(err, tinker.TinkerError):
        return None
    text = " ".join(str(err).split())
    if isinstance(err, tinker.APIConnectionError):  # APITimeoutError included
        return (
            f"Tinker: cannot reach the service at {_tinker_url()}: {text}; check the network "
            "and TINKER_BASE_URL (unset means the production service)"
        )
    if isinstance(err, (tinker.AuthenticationError, tinker.PermissionDeniedError)):
        return f"Tinker: the service refused the API key: {text}; {_TINKER_KEY_HINT}"
    if isinstance(err, tinker.APIStatusError):
        return f"Tinker: the service refused a request (HTTP {err.status_code}): {text}"
    if "tml-" in text or "api_key" in text:
        return f"Tinker: {text}; {_TINKER_KEY_HINT}"
    return f"Tinker: {type(err).__name__}: {text}"


class _FirstRetryWarning(logging.Filter):
    """On the SDK's first "Retrying request" (a DEBUG record), one WARNING with a hint; the SDK's
    own records pass only at the level the logger would have shown them."""

    def __init__(self, shown_level: int) -> None:
        super().__init__()
        self.shown_level = shown_level
        self.warned = False

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.warned and record.getMessage().startswith("Retrying request"):
            self.warned = True
            logger.warning(
                "Tinker: a request to %s failed and the SDK is retrying it (it keeps its own "
                "retry policy, so this may take minutes); check the network, TINKER_BASE_URL "
                "and TINKER_API_KEY. Run with -v to see every retry.",
                _tinker_url(),
            )
        return record.levelno >= self.shown_level


TINKER_RETRY_LOGGER = "tinker._base_client"
"""The SDK logger whose DEBUG record "Retrying request to ..." marks a failing request."""


def watch_tinker_retries() -> None:
    """Reports the Tinker SDK's first retry at WARNING on the console (once per process).

    Call after `logging` is configured: the SDK logger is opened to DEBUG so its retry record
    is seen, and a filter drops what the configured level would have dropped.
    """
    sdk = logging.getLogger(TINKER_RETRY_LOGGER)
    if any(isinstance(f, _FirstRetryWarning) for f in sdk.filters):
        return
    sdk.addFilter(_FirstRetryWarning(sdk.getEffectiveLevel()))
    sdk.setLevel(logging.DEBUG)
