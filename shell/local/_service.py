"""The local backend's service client: model configs, client factories and the shared runtime.

Conventions:
- The service owns what its clients share, as one `LocalRuntime` (`shell.local._runtime`) handed
  to every client: the run's `seed` (the base model is `init_params(key(seed))`; unseeded
  sampling derives from it), the checkpoint directory (a fresh temporary directory on first use,
  removed at exit, unless `checkpoint_dir` is given), the sample-request counter and the memory budgets that
  bound one jitted call. The service itself keeps the named model configs and the counters that
  name training clients (`local-{seed}-{index}`) and number sampling clients.
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
from types import MappingProxyType
from typing import Any

import jax
import optax
from tinker import types

from rlpure import model as model_lib
from shell.errors import CheckpointError, ConfigError
from shell.local._checkpoints import read_checkpoint
from shell.local._futures import ClientFuture
from shell.local._runtime import LocalRuntime
from shell.local._sampling import LocalSamplingClient
from shell.local._training import LocalTrainingClient

__all__ = ["LocalServiceClient"]


def _check_adam_optimizer(optimizer: object, where: str) -> None:
    """Refuses any optimizer but Adam (`None` means the SDK's default, AdamW)."""
    if optimizer is not None and not isinstance(optimizer, types.AdamOptimizerConfig):
        raise NotImplementedError(
            f"{where}: the local backend supports the Adam optimizer only "
            f"(None or tinker.types.AdamOptimizerConfig), got {optimizer!r}"
        )


class LocalServiceClient:
    """Entry point, the SDK's `ServiceClient`, backed by local JAX models.

    Args:
        seed: the run's seed: model init and unseeded sampling derive from it.
        checkpoint_dir: where checkpoints are written (default: a new temporary directory,
            removed when the interpreter exits; a given directory is never removed).
        max_batch_rows: most sample rows served by one jitted sampling call.
        max_batch_tokens: most `rows × (prompt bucket + new-token bucket)` per sampling call
            (bounds the KV cache and prefill memory for long prompts).
        model_configs: extra named model configs (`base_model` name → `ModelConfig`), added to
            (or overriding) `rlpure.model.MODEL_CONFIGS` for this service.
        max_train_tokens: most `datums × length bucket` per jitted training call; larger
            `forward_backward` batches run in chunks (gradients add up, metrics merge by
            suffix), so long sequences do not exhaust memory.

    Examples:
        >>> service = LocalServiceClient(seed=0)
        >>> trainer = service.create_lora_training_client(base_model="rlpure/tiny").result()
        >>> trainer.get_tokenizer().decode([104, 105])
        'hi'
    """

    def __init__(
        self,
        seed: int = 0,
        *,
        checkpoint_dir: str | os.PathLike[str] | None = None,
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
        self.model_configs: Mapping[str, model_lib.ModelConfig] = MappingProxyType(
            {**model_lib.MODEL_CONFIGS, **(model_configs or {})}
        )
        self._runtime = LocalRuntime(
            seed=seed,
            max_batch_rows=max_batch_rows,
            max_batch_tokens=max_batch_tokens,
            max_train_tokens=max_train_tokens,
            checkpoint_dir=Path(checkpoint_dir) if checkpoint_dir is not None else None,
        )
        self._training_clients = 0
        self._sampling_clients = 0

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

    def __enter__(self) -> LocalServiceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to release (kept for the SDK's interface)."""

    # -- internals --

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
    ) -> LocalTrainingClient:
        if config is None:
            config = self.model_configs.get(base_model)
            if config is None:
                raise ConfigError(
                    f"unknown local model {base_model!r}; known models: "
                    f"{sorted(self.model_configs)}"
                )
        index = self._training_clients
        self._training_clients += 1
        if params is None:
            params = model_lib.init_params(
                jax.random.key(self.seed if seed is None else seed), config
            )
        if opt_state is None:
            opt_state = model_lib.init_optimizer_state(params)
        return LocalTrainingClient(
            runtime=self._runtime,
            open_sampling_client=self.create_sampling_client,
            base_model=base_model,
            config=config,
            params=params,
            opt_state=opt_state,
            model_id=f"local-{self.seed}-{index}",
            lora_rank=rank,
            optim_steps=optim_steps,
        )

    # -- SDK surface --

    def get_server_capabilities(self) -> types.GetServerCapabilitiesResponse:
        """The local model configs, all trainable and sampleable."""
        return types.GetServerCapabilitiesResponse(
            supported_models=[
                types.SupportedModel(
                    model_name=name,
                    max_context_length=config.max_seq_len,
                    trainable=True,
                    sampleable=True,
                )
                for name, config in sorted(self.model_configs.items())
            ]
        )

    async def get_server_capabilities_async(self) -> types.GetServerCapabilitiesResponse:
        return self.get_server_capabilities()

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
    ) -> ClientFuture[LocalTrainingClient]:
        """A training client on a freshly initialised local model (full fine-tuning: `rank`
        and the `train_*` flags are accepted and ignored).

        Raises:
            ConfigError: unknown `base_model` (the message lists the known names).
            NotImplementedError: `optimizer` is neither `None` nor `AdamOptimizerConfig`.
        """
        _check_adam_optimizer(optimizer, "create_lora_training_client.optimizer")
        return ClientFuture(
            self._new_training_client(base_model, params=None, opt_state=None, seed=seed, rank=rank)
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
    ) -> LocalTrainingClient:
        return await self.create_lora_training_client(
            base_model, rank, seed, train_mlp, train_attn, train_unembed, user_metadata, optimizer
        ).result_async()

    def _from_state(
        self, path: str, *, base_model: str | None, with_optimizer: bool
    ) -> ClientFuture[LocalTrainingClient]:
        checkpoint = read_checkpoint(path, with_optimizer=with_optimizer)
        name = base_model if base_model is not None else checkpoint.base_model
        if base_model is not None and self.model_configs.get(base_model) != checkpoint.config:
            raise CheckpointError(
                f"checkpoint {path!r}: its model config does not match base model {name!r}"
            )
        client = self._new_training_client(
            name,
            params=checkpoint.params,
            opt_state=checkpoint.opt_state,
            seed=None,
            rank=0,
            config=checkpoint.config,
            optim_steps=checkpoint.optim_steps,
        )
        return ClientFuture(client)

    def create_training_client_from_state(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
        optimizer: types.OptimizerConfig | None = None,
    ) -> ClientFuture[LocalTrainingClient]:
        """A training client with the checkpoint's weights and a fresh optimizer.

        Raises:
            CheckpointError: an unusable checkpoint, or one whose config differs from
                `base_model`'s.
            NotImplementedError: `optimizer` is neither `None` nor `AdamOptimizerConfig`
                (as `create_lora_training_client`).
        """
        _check_adam_optimizer(optimizer, "create_training_client_from_state.optimizer")
        return self._from_state(path, base_model=base_model, with_optimizer=False)

    async def create_training_client_from_state_async(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
        optimizer: types.OptimizerConfig | None = None,
    ) -> LocalTrainingClient:
        return await self.create_training_client_from_state(
            path, base_model, user_metadata, weights_access_token, optimizer
        ).result_async()

    def create_training_client_from_state_with_optimizer(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
    ) -> ClientFuture[LocalTrainingClient]:
        """A training client with the checkpoint's weights and Adam state (the SDK's signature
        has no `optimizer`: the checkpoint's optimizer is restored)."""
        return self._from_state(path, base_model=base_model, with_optimizer=True)

    async def create_training_client_from_state_with_optimizer_async(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
    ) -> LocalTrainingClient:
        return await self.create_training_client_from_state_with_optimizer(
            path, base_model, user_metadata, weights_access_token
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
        stream = (2, self._sampling_clients, 0)
        if model_path is not None:
            checkpoint = read_checkpoint(model_path, with_optimizer=False)
            name, config, params = checkpoint.base_model, checkpoint.config, checkpoint.params
        elif base_model is not None:
            if base_model not in self.model_configs:
                raise ConfigError(
                    f"unknown local model {base_model!r}; known models: "
                    f"{sorted(self.model_configs)}"
                )
            config = self.model_configs[base_model]
            name, params = base_model, model_lib.init_params(jax.random.key(self.seed), config)
        else:
            raise ValueError("Either model_path or base_model must be provided")
        self._sampling_clients += 1
        return ClientFuture(
            LocalSamplingClient(
                runtime=self._runtime,
                base_model=name,
                config=config,
                params=params,
                stream=stream,
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
