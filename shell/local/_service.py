"""The local backend's service client: model configs, client factories and the shared runtime.

Conventions:
- The service owns what its clients share, as one `LocalRuntime` (`shell.local._runtime`) handed
  to every client: the run's `seed` (the base model is `init_params(key(seed))`; unseeded
  sampling derives from it), the checkpoint directory (`checkpoint_dir`, by default
  `shell.data_dir.default_checkpoint_dir()`, durable and shared by every process of the user; a
  temporary one removed at exit with `temporary_checkpoints=True`), the named model configs, the
  training runs it opened (each claims its own folder atomically and records itself there as
  `run.json`: named `local-{seed}-{index}` or by the host, `training_run_id=`; never an id
  already used under the checkpoint directory), the sample-request counter and the memory
  budgets that bound one jitted call. The service itself keeps the counter that numbers
  sampling clients and whether it is closed.
- The constructor takes `tinker.ServiceClient`'s keywords (network-only ones accepted and
  ignored) before the local options; `create_rest_client()` answers run and checkpoint lookups
  from the checkpoint files (`shell.local._rest`); after `close()` (or leaving a `with` block)
  the factories raise `RuntimeError`, as the SDK's closed session rejects requests.
- A training client gets the service's `create_sampling_client` as a plain callable (for its own
  `create_sampling_client(model_path)`), never the service object.
- `create_sampling_client(base_model=...)` samples from the base model on the stream
  `(2, index among this service's create_sampling_client calls, 0)`; `model_path=...` loads a
  checkpoint (its own config and base model name).
- Factories return a `ClientFuture` (await it, `.result()` it, or use it as the client).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Any, Literal

import jax
import optax
import tinker
from tinker import types
from tinker.lib.public_interfaces.custom_loss import LossHandle, PerDatumLossFn, trace_loss

from rlpure import model as model_lib
from rlpure.model import ByteTokenizer
from shell.data_dir import default_checkpoint_dir
from shell.errors import CheckpointError
from shell.local._checkpoints import checked_metadata, read_checkpoint, remove_stale_staging
from shell.local._compile_cache import enable_compilation_cache
from shell.local._futures import ClientFuture, ReadyFuture
from shell.local._rest import LocalRestClient
from shell.local._runtime import LoadedModel, LocalRuntime
from shell.local._sampling import LocalSamplingClient, sampler_params
from shell.local._training import LocalTrainingClient

__all__ = ["LocalServiceClient"]


def _check_adam_optimizer(optimizer: object, where: str) -> None:
    """Refuses any optimizer but Adam (`None` means the SDK's default, AdamW)."""
    if optimizer is not None and not isinstance(optimizer, types.AdamOptimizerConfig):
        raise NotImplementedError(
            f"{where}: the local backend supports the Adam optimizer only "
            f"(None or tinker.types.AdamOptimizerConfig), got {optimizer!r}"
        )


def _checkpoint_root(
    checkpoint_dir: str | os.PathLike[str] | None, *, temporary: bool
) -> Path | None:
    """The runtime's checkpoint directory: the given one, the user's default, or `None` (a
    temporary one) for `temporary`."""
    if not isinstance(temporary, bool):
        raise TypeError(
            "LocalServiceClient.temporary_checkpoints: expected a bool, got "
            f"{type(temporary).__name__}"
        )
    if temporary and checkpoint_dir is not None:
        raise ValueError(
            "LocalServiceClient: checkpoint_dir and temporary_checkpoints=True exclude each "
            f"other (got checkpoint_dir={str(checkpoint_dir)!r})"
        )
    if temporary:
        return None
    return Path(checkpoint_dir) if checkpoint_dir is not None else default_checkpoint_dir()


class LocalServiceClient:
    """Entry point, the SDK's `ServiceClient`, backed by local JAX models.

    The constructor takes every keyword of `tinker.ServiceClient` (SDK 0.38), so
    `tinker.ServiceClient = LocalServiceClient` runs Tinker code unchanged (the cookbook's
    `rl.train.main` calls `tinker.ServiceClient(base_url=..., user_metadata=...,
    display_name=...)`). Checkpoints are durable by default (the user's store,
    `shell.data_dir.default_checkpoint_dir()`), so a run resumes in a new process with no
    extra argument; to keep them elsewhere (e.g. inside a log dir), bind the local options
    first: `tinker.ServiceClient = functools.partial(LocalServiceClient,
    checkpoint_dir="<log_path>/local_states")`.

    Args:
        user_metadata: the session's metadata (the SDK's first positional parameter); kept as
            `self.user_metadata`. A training run's metadata is the `user_metadata` of the
            factory that opened it, as on Tinker.
        project_id: kept as `self.project_id` (default: `$TINKER_PROJECT_ID`, as the SDK);
            it has no effect locally.
        display_name: the session's display name, kept as `self.display_name`.
        base_url: the Tinker server's URL: accepted and ignored (nothing is contacted).
        api_key: accepted and ignored (no credentials are needed, read or stored).
        default_headers_overrides: HTTP headers: accepted and ignored.
        seed: the run's seed: model init and unseeded sampling derive from it.
        checkpoint_dir: where checkpoints and training runs are written, created on first
            use and never removed (default: `shell.data_dir.default_checkpoint_dir()`,
            `$RLPURE_HOME/checkpoints` or `~/.local/share/rlpure/checkpoints`, read when the
            service is made; shared with every process of the user and with `rlpure serve`).
        temporary_checkpoints: write into a new temporary directory instead (`rlpure-local-*`,
            removed when the interpreter exits), for throwaway runs; not with `checkpoint_dir`.
        max_batch_rows: most sample rows served by one jitted sampling call.
        max_batch_tokens: most `rows × (prompt bucket + new-token bucket)` per sampling call
            (bounds the KV cache and prefill memory for long prompts).
        model_configs: extra named model configs (`base_model` name → `ModelConfig`), added to
            (or overriding) `rlpure.model.MODEL_CONFIGS` for this service.
        max_train_tokens: most `datums × length bucket` per jitted training call; larger
            `forward_backward` batches run in chunks (gradients add up, metrics merge by
            suffix), so long sequences do not exhaust memory.

    Making a service turns on JAX's persistent compilation cache for the process (programs
    compiled by earlier runs are read back from `~/.cache/rlpure/jax`; `shell.local._compile_cache`
    says when it does not, and `RLPURE_COMPILATION_CACHE=off` turns it off).

    Unlike the SDK, which warns about unknown keywords and ignores them, an unknown keyword
    is a `TypeError` here (a misspelt `checkpoint_dir` must not silently lose checkpoints).
    The network-only values are checked for type only: a URL or key passed to the local
    backend does no harm, and code that always passes `base_url=config.base_url` must run.

    Examples:
        >>> service = LocalServiceClient(seed=0)
        >>> trainer = service.create_lora_training_client(base_model="rlpure/tiny").result()
        >>> trainer.get_tokenizer().decode([104, 105])
        'hi'
        >>> with LocalServiceClient(base_url=None, user_metadata={"recipe": "x"}) as service:
        ...     service.user_metadata
        {'recipe': 'x'}
    """

    backend_kind = "local"
    """`shell.clients.NamesItsBackend`: this client is `TrainConfig.backend` `"local"`."""

    def __init__(
        self,
        user_metadata: dict[str, str] | None = None,
        project_id: str | None = None,
        *,
        display_name: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        default_headers_overrides: Mapping[str, str] | None = None,
        seed: int = 0,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        temporary_checkpoints: bool = False,
        max_batch_rows: int = 512,
        max_batch_tokens: int = 65_536,
        max_train_tokens: int = 16_384,
        model_configs: Mapping[str, model_lib.ModelConfig] | None = None,
    ) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"LocalServiceClient.seed: expected an int >= 0, got {seed!r}")
        if max_batch_rows < 1:
            raise ValueError(
                f"LocalServiceClient.max_batch_rows: expected >= 1, got {max_batch_rows}"
            )
        for name, value in (
            ("max_batch_tokens", max_batch_tokens),
            ("max_train_tokens", max_train_tokens),
        ):
            if value < 1:
                raise ValueError(f"LocalServiceClient.{name}: expected >= 1, got {value}")
        self.user_metadata: dict[str, str] | None = checked_metadata(
            user_metadata, "LocalServiceClient.user_metadata"
        )
        for name, text in (
            ("project_id", project_id),
            ("display_name", display_name),
            ("base_url", base_url),
            ("api_key", api_key),
        ):
            if text is not None and not isinstance(text, str):
                raise TypeError(
                    f"LocalServiceClient.{name}: expected a str or None, got {type(text).__name__}"
                )
        if default_headers_overrides is not None and not isinstance(
            default_headers_overrides, Mapping
        ):
            raise TypeError(
                "LocalServiceClient.default_headers_overrides: expected a mapping or None, got "
                f"{type(default_headers_overrides).__name__}"
            )
        self.project_id: str | None = (
            project_id if project_id is not None else os.environ.get("TINKER_PROJECT_ID") or None
        )
        self.display_name: str | None = display_name
        self._runtime = LocalRuntime(
            seed=seed,
            model_configs=MappingProxyType({**model_lib.MODEL_CONFIGS, **(model_configs or {})}),
            max_batch_rows=max_batch_rows,
            max_batch_tokens=max_batch_tokens,
            max_train_tokens=max_train_tokens,
            checkpoint_dir=_checkpoint_root(checkpoint_dir, temporary=temporary_checkpoints),
        )
        self._sampling_clients = 0
        self._closed = False
        # XLA programs compiled by earlier processes are read back from disk (shell.local._compile_cache)
        enable_compilation_cache()

    @property
    def model_configs(self) -> Mapping[str, model_lib.ModelConfig]:
        """The named model configs this service knows (`base_model` name → `ModelConfig`)."""
        return self._runtime.model_configs

    @property
    def seed(self) -> int:
        """The run's seed: model init and unseeded sampling derive from it."""
        return self._runtime.seed

    @property
    def max_batch_rows(self) -> int:
        """Most sample rows per jitted sampling call."""
        return self._runtime.max_batch_rows

    @property
    def max_batch_tokens(self) -> int:
        """Most `rows × (prompt bucket + new-token bucket)` per sampling call."""
        return self._runtime.max_batch_tokens

    @property
    def max_train_tokens(self) -> int:
        """Most `datums × length bucket` per jitted training call."""
        return self._runtime.max_train_tokens

    @property
    def closed(self) -> bool:
        """Whether `close` was called (the factories then refuse, as the SDK's session does)."""
        return self._closed

    def __enter__(self) -> LocalServiceClient:
        """`with LocalServiceClient(...) as service:` (refused once closed, as the SDK's)."""
        self._check_open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        status: Literal["success", "errored", "interrupted"]
        if exc_type is None:
            status = "success"
        elif issubclass(exc_type, Exception):
            status = "errored"
        else:
            status = "interrupted"
        self.close(status).result()

    def close(
        self,
        status: Literal["success", "errored", "interrupted"] = "success",
        detail: str | None = None,
    ) -> tinker.APIFuture[None]:
        """Ends the session: the factories refuse afterwards. Clients already made keep
        working, and checkpoints stay on disk (`temporary_checkpoints` ones until exit).

        The SDK's `close(status, detail)`; `status` defaults to `"success"` here.
        """
        if status not in ("success", "errored", "interrupted"):
            raise ValueError(
                "LocalServiceClient.close: status must be 'success', 'errored' or "
                f"'interrupted', got {status!r}"
            )
        self._closed = True
        return ReadyFuture(None)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("LocalServiceClient is closed")

    def create_rest_client(self) -> LocalRestClient:
        """The REST client: training runs and checkpoints, read from local checkpoints.

        Answers what the cookbook's `checkpoint_utils` asks (`get_training_run_by_tinker_path`
        for the renderer-name check on resume, `delete_checkpoint_from_tinker_path` for rolling
        checkpoints) and the other run and checkpoint lookups; see `shell.local._rest`.
        """
        return LocalRestClient(self._runtime)

    # -- internals --

    def _toy_or_named(self, name: str, config: model_lib.ModelConfig | None) -> LoadedModel:
        """The service's `LoadedModel` for `name`, or, for a toy checkpoint that carries its own
        `config`, a toy model of that config (its name need not be one this service knows)."""
        if config is not None:
            return LoadedModel(
                name=name,
                config=config,
                params=None,
                tokenizer=ByteTokenizer(),
                eos_token_ids=(model_lib.EOS_ID,),
                source="checkpoint (toy model)",
            )
        return self._runtime.base_model(name)

    def _new_training_client(
        self,
        base_model: str,
        *,
        params: model_lib.Params | None,
        opt_state: optax.OptState | None,
        seed: int | None,
        rank: int,
        config: model_lib.ModelConfig | None = None,
        optim_steps: int = 0,
        user_metadata: dict[str, str] | None = None,
        lora: model_lib.LoraConfig | None = None,
        model: LoadedModel | None = None,
        training_run_id: str | None = None,
    ) -> LocalTrainingClient:
        self._check_open()
        if model is None:
            model = self._toy_or_named(base_model, config)
        config = model.config
        if model.pretrained and lora is None:
            lora = model_lib.LoraConfig(rank=rank)
        key = jax.random.key(self.seed if seed is None else seed)
        if params is None:
            if lora is None:
                params = model_lib.init_params(key, config)
            else:
                params = model_lib.init_lora(key, config, lora)
        if opt_state is None:
            opt_state = model_lib.init_optimizer_state(params)
        model_id = self._runtime.new_training_run_id(
            base_model=base_model,
            lora_rank=rank,
            is_lora=lora is not None,
            user_metadata=user_metadata,
            run_id=training_run_id,
        )
        return LocalTrainingClient(
            runtime=self._runtime,
            open_sampling_client=self.create_sampling_client,
            base_model=base_model,
            config=config,
            params=params,
            opt_state=opt_state,
            model_id=model_id,
            lora_rank=rank,
            optim_steps=optim_steps,
            run_metadata=user_metadata,
            model=model,
            lora=lora,
        )

    # -- SDK surface --

    def get_server_capabilities(self) -> types.GetServerCapabilitiesResponse:
        """The local model configs, all trainable and sampleable."""
        return self._runtime.server_capabilities()

    async def get_server_capabilities_async(self) -> types.GetServerCapabilitiesResponse:
        return self.get_server_capabilities()

    def create_custom_loss(
        self, fn: PerDatumLossFn, input_ranks: Mapping[str, types.CustomLossInputRank]
    ) -> tinker.APIFuture[LossHandle]:
        """A `LossHandle` for `LocalTrainingClient.forward_backward_custom`: `fn` traced and
        checked by the SDK's own `trace_loss` (torch.fx; torch and math only, a scalar loss,
        metrics keyed `custom/<name>:sum` or `:mean`), for this session's clients. It runs in
        this process, as the SDK runs a loss the server does not take.

        `fn(logprobs, *inputs) -> (loss, metrics)` runs once per datum and the losses add;
        `input_ranks` gives each parameter's rank (`logprobs` first: 0, 1 or 2).

        Raises:
            ImportError: torch is not installed.
            ValueError: `fn` cannot be traced or breaks the rules above (the SDK's messages).
        """
        self._check_open()
        return ReadyFuture(trace_loss(fn, input_ranks, self._runtime.session_id))

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
        *,
        training_run_id: str | None = None,
    ) -> ClientFuture[LocalTrainingClient]:
        """A training client on `base_model` (resolved once per service, see
        `shell.local._models.resolve_base_model`).

        A pretrained model trains LoRA adapters of rank `rank` on the matrices the `train_*`
        flags name (`rlpure.model.LoraConfig`; `B = 0` so step 0 is the base model; the
        adapters are drawn from `seed`, default the service's); the base weights are loaded
        once and shared by every client. A toy model trains in full from
        `init_params(key(seed))` (`rank` and the flags are then recorded only).

        `training_run_id` is a local extension of the SDK's signature (as on every factory of
        a training client): the id of the new run, given by a host (`rlpure serve` names runs
        `{session_id}:train:{n}`, as Tinker does); None: the service names it
        `local-{seed}-{index}`. It is the run's folder under the checkpoint directory.

        Raises:
            ConfigError: unknown `base_model` (the message lists what is available), a bad
                checkpoint, or a `training_run_id` that is not a plain folder name or is taken.
            ValueError: a bad `rank`.
            NotImplementedError: `optimizer` is neither `None` nor `AdamOptimizerConfig`.
        """
        _check_adam_optimizer(optimizer, "create_lora_training_client.optimizer")
        metadata = checked_metadata(user_metadata, "create_lora_training_client.user_metadata")
        self._check_open()
        model = self._runtime.base_model(base_model)
        lora = None
        if model.pretrained:
            lora = model_lib.LoraConfig(
                rank=rank, train_mlp=train_mlp, train_attn=train_attn, train_unembed=train_unembed
            )
        return ClientFuture(
            self._new_training_client(
                base_model,
                params=None,
                opt_state=None,
                seed=seed,
                rank=rank,
                user_metadata=metadata,
                lora=lora,
                model=model,
                training_run_id=training_run_id,
            )
        )

    async def create_lora_training_client_async(
        self,
        base_model: str,
        rank: int = 32,
        seed: int | None = None,
        train_mlp: bool = True,
        train_attn: bool = True,
        train_unembed: bool = True,
        user_metadata: dict[str, str] | None = None,
        optimizer: types.OptimizerConfig | None = None,
        *,
        training_run_id: str | None = None,
    ) -> LocalTrainingClient:
        return await self.create_lora_training_client(
            base_model,
            rank,
            seed,
            train_mlp,
            train_attn,
            train_unembed,
            user_metadata,
            optimizer,
            training_run_id=training_run_id,
        ).result_async()

    def _from_state(
        self,
        path: str,
        *,
        base_model: str | None,
        with_optimizer: bool,
        user_metadata: dict[str, str] | None,
        where: str,
        training_run_id: str | None,
    ) -> ClientFuture[LocalTrainingClient]:
        self._check_open()
        metadata = checked_metadata(user_metadata, f"{where}.user_metadata")
        checkpoint = read_checkpoint(path, with_optimizer=with_optimizer)
        # A run resumed from here writes its checkpoints in its own run folder, so the writes
        # killed beside this one would otherwise stay forever: sweep the dead writers' staging.
        remove_stale_staging(Path(path).parent)
        name = base_model if base_model is not None else checkpoint.base_model
        if checkpoint.lora is not None:
            if name != checkpoint.base_model:
                raise CheckpointError(
                    f"checkpoint {path!r}: holds LoRA adapters of base model "
                    f"{checkpoint.base_model!r}, not of {name!r}"
                )
            model = self._runtime.base_model(name)
            if model.config != checkpoint.config:
                raise CheckpointError(
                    f"checkpoint {path!r}: its model config does not match base model "
                    f"{name!r} as loaded from {model.source}"
                )
        else:
            if base_model is not None and self.model_configs.get(base_model) != checkpoint.config:
                raise CheckpointError(
                    f"checkpoint {path!r}: its model config does not match base model {name!r}"
                )
            model = self._toy_or_named(name, checkpoint.config)
        client = self._new_training_client(
            name,
            params=checkpoint.params,
            opt_state=checkpoint.opt_state,
            seed=None,
            rank=checkpoint.lora.rank if checkpoint.lora is not None else 0,
            optim_steps=checkpoint.optim_steps,
            user_metadata=metadata,
            lora=checkpoint.lora,
            model=model,
            training_run_id=training_run_id,
        )
        return ClientFuture(client)

    def create_training_client_from_state(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
        optimizer: types.OptimizerConfig | None = None,
        *,
        training_run_id: str | None = None,
    ) -> ClientFuture[LocalTrainingClient]:
        """A training client with the checkpoint's weights and a fresh optimizer: a new
        training run (named `training_run_id`, a local extension as in
        `create_lora_training_client`; None: `local-{seed}-{index}`).

        Raises:
            CheckpointError: an unusable checkpoint, or one whose config differs from
                `base_model`'s.
            ConfigError: a `training_run_id` that is not a plain folder name or is taken.
            NotImplementedError: `optimizer` is neither `None` nor `AdamOptimizerConfig`
                (as `create_lora_training_client`).
        """
        _check_adam_optimizer(optimizer, "create_training_client_from_state.optimizer")
        return self._from_state(
            path,
            base_model=base_model,
            with_optimizer=False,
            user_metadata=user_metadata,
            where="create_training_client_from_state",
            training_run_id=training_run_id,
        )

    async def create_training_client_from_state_async(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
        optimizer: types.OptimizerConfig | None = None,
        *,
        training_run_id: str | None = None,
    ) -> LocalTrainingClient:
        return await self.create_training_client_from_state(
            path,
            base_model,
            user_metadata,
            weights_access_token,
            optimizer,
            training_run_id=training_run_id,
        ).result_async()

    def create_training_client_from_state_with_optimizer(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
        *,
        training_run_id: str | None = None,
    ) -> ClientFuture[LocalTrainingClient]:
        """A training client with the checkpoint's weights and Adam state (the SDK's signature
        has no `optimizer`: the checkpoint's optimizer is restored): a new training run, named
        as in `create_training_client_from_state`.

        Raises:
            CheckpointError: as `create_training_client_from_state`.
            ConfigError: a `training_run_id` that is not a plain folder name or is taken.
        """
        return self._from_state(
            path,
            base_model=base_model,
            with_optimizer=True,
            user_metadata=user_metadata,
            where="create_training_client_from_state_with_optimizer",
            training_run_id=training_run_id,
        )

    async def create_training_client_from_state_with_optimizer_async(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
        *,
        training_run_id: str | None = None,
    ) -> LocalTrainingClient:
        return await self.create_training_client_from_state_with_optimizer(
            path, base_model, user_metadata, weights_access_token, training_run_id=training_run_id
        ).result_async()

    def create_sampling_client(
        self,
        model_path: str | None = None,
        base_model: str | None = None,
        retry_config: Any = None,
        record_stability_info: bool = False,
    ) -> ClientFuture[LocalSamplingClient]:
        """A sampling client on saved weights (`model_path`) or on the service's base model
        (the weights every training client of this service starts from).
        """
        self._check_open()
        stream = (2, self._sampling_clients, 0)
        if model_path is not None:
            checkpoint = read_checkpoint(model_path, with_optimizer=False)
            name = checkpoint.base_model
            if checkpoint.lora is not None:
                model = self._runtime.base_model(name)
                if model.config != checkpoint.config:
                    raise CheckpointError(
                        f"checkpoint {model_path!r}: its model config does not match base "
                        f"model {name!r} as loaded from {model.source}"
                    )
            else:
                model = self._toy_or_named(name, checkpoint.config)
            params = sampler_params(model, checkpoint.params, checkpoint.lora)
        elif base_model is not None:
            name = base_model
            model = self._runtime.base_model(base_model)
            if model.params is not None:
                params = model.params
            else:
                params = model_lib.init_params(jax.random.key(self.seed), model.config)
        else:
            raise ValueError("Either model_path or base_model must be provided")
        config = model.config
        self._sampling_clients += 1
        return ClientFuture(
            LocalSamplingClient(
                runtime=self._runtime,
                base_model=name,
                config=config,
                params=params,
                stream=stream,
                model=model,
            )
        )

    async def create_sampling_client_async(
        self,
        model_path: str | None = None,
        base_model: str | None = None,
        retry_config: Any = None,
        record_stability_info: bool = False,
    ) -> LocalSamplingClient:
        return await self.create_sampling_client(model_path, base_model).result_async()
