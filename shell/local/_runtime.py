"""What a local service shares with the clients it makes: seed, model configs, memory budgets,
checkpoint paths, the training runs it opened, the sample-request counter.

Conventions:
- `LocalServiceClient` builds one `LocalRuntime` and hands it to every training and sampling
  client it creates (directly or through a training client), so the clients never reach into
  the service itself. The runtime imports no client module: the dependency points one way.
- `seed` is the run's seed: the base model is `init_params(key(seed))` and unseeded sampling
  streams start with it.
- Budgets: a sampling call serves at most `max_batch_rows` rows and
  `max_batch_tokens // (prompt bucket + new-token bucket)` rows; a training call at most
  `max_train_tokens // length bucket` datums; both also keep the float32 attention scores of
  one layer under `_ATTENTION_ELEMENTS`, and a training call keeps the activations its
  backward pass holds (`activation_floats_per_token`) under `_ACTIVATION_FLOATS` (4 GiB): a
  SmolLM2 token holds ~2.4 MB of them, so the issue's GRPO batch (128 datums × 128 tokens) in
  one call needed ~40 GB and was killed on a 24 GB machine; the toy models never reach this
  bound. Row counts are powers of two (at least 1), so chunking reuses compiled shapes.
- Checkpoints live under `checkpoint_dir / model_id / kind / name`; without a `checkpoint_dir`
  a fresh temporary directory (`rlpure-local-*`) is created on first use and removed when the
  interpreter exits (`atexit`; a killed process leaves it). A given `checkpoint_dir` is never
  removed.
- `training_runs` records each training run (training client) the service opened, by id:
  base model, rank, the `user_metadata` it was created with, when. The REST client reads it;
  `new_training_run_id()` names runs `local-{seed}-{index}`, skipping ids in use by this service
  or present as folders under the checkpoint directory, so a resumed run sharing a
  `checkpoint_dir` with an earlier process never writes into that process's run folder (on
  Tinker, too, a training client restored from a state is a new training run).
- `base_model(name)` resolves a `base_model` name once per service
  (`shell.local._models.resolve_base_model`: the service's toy configs first, then local
  paths, the packaged SmolLM2, the offline Hugging Face cache) and keeps the result, a
  `LoadedModel`: config, tokenizer and, for a pretrained model, its weights, read once and
  shared by every training and sampling client of the service (they never copy or mutate it).
  A pretrained checkpoint's weights are also shared across the services of one process
  (`_shared_weights`: read once while the file is unchanged), so a second
  `LocalServiceClient()` on SmolLM2 skips the ~10 s read.
- `next_sample_request_index()` counts the `sample` requests of every sampling client of the
  service (it names the returned sequences, `local-{request}-{sample}`).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
from tinker import types

from rlpure import model as model_lib
from shell.local._checkpoints import checkpoint_name
from shell.local._models import resolve_base_model

__all__ = ["LoadedModel", "LocalRuntime", "TrainingRunRecord"]

if TYPE_CHECKING:  # transformers is imported only where a pretrained tokenizer is built
    from transformers import PreTrainedTokenizerFast

    Tokenizer = model_lib.ByteTokenizer | PreTrainedTokenizerFast
    """What `get_tokenizer()` returns: the toy models' byte tokenizer or a pretrained one."""

_ATTENTION_ELEMENTS = 1 << 25  # float32 attention scores per layer per call (128 MiB)
_ACTIVATION_FLOATS = 1 << 30  # float32 activations a training call keeps for its backward (4 GiB)


def activation_floats_per_token(config: model_lib.ModelConfig, width: int) -> int:
    """Float32 values the backward pass keeps per token at padded length `width` (an upper
    estimate read off the VJP residuals of `rlpure.model.target_logprobs_fn`): per layer six
    `[F]` vectors for the MLP, about ten `[E]`-sized ones (norms, q/k/v/o, residuals) and the
    attention weights and scores `2 · H · width`; then the logits and their softmax `2 · V`.
    The MLP keeps three `[F]` vectors since its SwiGLU VJP is written by hand (autodiff kept
    six); six are still counted, which keeps a SmolLM2 call at 8 rows of 128 tokens and its
    peak memory where they were: 16 rows measured no faster (`benchmarks/bench_local_model.py`).
    """
    per_layer = 6 * config.d_ff + 10 * config.d_model + 2 * config.n_heads * width
    return config.n_layers * per_layer + 2 * config.vocab_size


_SHARED_WEIGHTS: dict[tuple[str, int, int, model_lib.ModelConfig], model_lib.Params] = {}
_SHARED_WEIGHTS_MAX = 2  # checkpoints kept (SmolLM2's float32 weights are ~540 MB)


def _shared_weights(
    path: Path, config: model_lib.ModelConfig, load: Callable[[], model_lib.Params]
) -> model_lib.Params:
    """The weights of the checkpoint at `path`, read once per process while it is unchanged.

    Keyed by the resolved path, its size and modification time (of the file, or of the
    directory's newest entry) and the config, so every service of a process (each test, each
    `LocalServiceClient()` of a script) shares one read of SmolLM2 (~10 s to dequantise)
    instead of reading it again; the arrays are immutable and no client mutates them. The
    last `_SHARED_WEIGHTS_MAX` checkpoints are kept.
    """
    resolved = path.resolve()
    entries = [resolved, *resolved.iterdir()] if resolved.is_dir() else [resolved]
    stats = [entry.stat() for entry in entries]
    key = (
        str(resolved),
        sum(stat.st_size for stat in stats),
        max(stat.st_mtime_ns for stat in stats),
        config,
    )
    params = _SHARED_WEIGHTS.pop(key, None)
    if params is None:
        params = load()
    _SHARED_WEIGHTS[key] = params  # most recently used last
    while len(_SHARED_WEIGHTS) > _SHARED_WEIGHTS_MAX:
        del _SHARED_WEIGHTS[next(iter(_SHARED_WEIGHTS))]
    return params


def _floor_power_of_two(n: int) -> int:
    """The largest power of two `<= max(1, n)`."""
    return 1 << (max(1, n).bit_length() - 1)


class TrainingRunRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A training run (training client) a service opened."""

    base_model: str
    lora_rank: int
    user_metadata: dict[str, str]
    created_at: float
    """Seconds since the epoch."""


class LoadedModel(msgspec.Struct, frozen=True, kw_only=True, eq=False):
    """A resolved `base_model` as the service keeps it (one per name, shared by every client).

    Attributes:
        name: the `base_model` name.
        config: the model's shape.
        params: the pretrained weights (read once), or None for a toy model (the service
            initialises those from a seed, and trains them in full).
        tokenizer: `ByteTokenizer` for a toy model, else the checkpoint's
            `PreTrainedTokenizerFast`.
        eos_token_ids: the ids that end a sample when `SamplingParams.stop` is None.
        source: where the weights come from (for messages).
    """

    name: str
    config: model_lib.ModelConfig
    params: model_lib.Params | None
    tokenizer: Tokenizer
    eos_token_ids: tuple[int, ...]
    source: str

    @property
    def pretrained(self) -> bool:
        """Whether this is a pretrained model (trained with LoRA) rather than a toy one."""
        return self.params is not None


def _eos_ids(tokenizer: Any) -> tuple[int, ...]:
    """The tokenizer's end-of-sequence id (a chat model's end-of-turn token is usually it)."""
    eos = getattr(tokenizer, "eos_token_id", None)
    return (int(eos),) if isinstance(eos, int) else ()


class LocalRuntime:
    """The service state its clients read or advance (validated by the service, not here).

    Args:
        seed: the run's seed (int >= 0).
        model_configs: the named model configs (`base_model` name → `ModelConfig`).
        max_batch_rows: most sample rows per jitted sampling call (>= 1).
        max_batch_tokens: most `rows × (prompt bucket + new-token bucket)` per sampling call.
        max_train_tokens: most `datums × length bucket` per jitted training call.
        checkpoint_dir: where checkpoints are written (`None`: a temporary directory, removed
            at exit).
    """

    def __init__(
        self,
        *,
        seed: int,
        model_configs: Mapping[str, model_lib.ModelConfig],
        max_batch_rows: int,
        max_batch_tokens: int,
        max_train_tokens: int,
        checkpoint_dir: Path | None,
    ) -> None:
        self.seed = seed
        self.model_configs = model_configs
        self.training_runs: dict[str, TrainingRunRecord] = {}
        self.max_batch_rows = max_batch_rows
        self.max_batch_tokens = max_batch_tokens
        self.max_train_tokens = max_train_tokens
        self._checkpoint_dir = checkpoint_dir
        self._sample_requests = 0
        self._base_models: dict[str, LoadedModel] = {}

    def base_model(self, name: str) -> LoadedModel:
        """The resolved `base_model` `name`, loaded on first use and kept (see module doc).

        Raises:
            ConfigError: an unknown name (listing what is available) or a bad checkpoint.
        """
        loaded = self._base_models.get(name)
        if loaded is None:
            resolved = resolve_base_model(name, toy_configs=self.model_configs)
            config = resolved.model_config()
            tokenizer = resolved.load_tokenizer()
            params = None
            if resolved.kind != "toy":
                assert resolved.path is not None
                params = _shared_weights(
                    resolved.path, config, lambda: resolved.load_params(config)
                )
            loaded = LoadedModel(
                name=name,
                config=config,
                params=params,
                tokenizer=tokenizer,
                eos_token_ids=(model_lib.EOS_ID,)
                if resolved.kind == "toy"
                else _eos_ids(tokenizer),
                source=resolved.source,
            )
            self._base_models[name] = loaded
        return loaded

    def sampling_rows(
        self, config: model_lib.ModelConfig, prompt_width: int, new_width: int
    ) -> int:
        """Rows per sampling call: within `max_batch_rows`, `max_batch_tokens` and the
        attention budget (prefill scores `rows × H × T × (T + M)` floats), a power of two."""
        width = prompt_width + new_width
        attention_per_row = config.n_heads * prompt_width * width
        return _floor_power_of_two(
            min(
                self.max_batch_rows,
                self.max_batch_tokens // width,
                _ATTENTION_ELEMENTS // attention_per_row,
            )
        )

    def training_rows(self, config: model_lib.ModelConfig, width: int) -> int:
        """Most datums per training call at padded length `width`: within `max_train_tokens`,
        the attention budget (`rows × H × T²` floats of attention weights per layer) and the
        activation budget (`rows × width × activation_floats_per_token`), a power of two (at
        least 1)."""
        attention_per_row = config.n_heads * width * width
        activations_per_row = width * activation_floats_per_token(config, width)
        return _floor_power_of_two(
            min(
                self.max_train_tokens // width,
                _ATTENTION_ELEMENTS // attention_per_row,
                _ACTIVATION_FLOATS // activations_per_row,
            )
        )

    @property
    def checkpoint_root(self) -> Path | None:
        """The checkpoint directory (`None` while a temporary one has not been created)."""
        return self._checkpoint_dir

    def server_capabilities(self) -> types.GetServerCapabilitiesResponse:
        """The model configs, all trainable and sampleable."""
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

    def new_training_run_id(
        self, *, base_model: str, lora_rank: int, user_metadata: Mapping[str, str] | None
    ) -> str:
        """Registers a new training run and returns its id (`local-{seed}-{index}`, unused)."""
        index = 0
        while True:
            run_id = f"local-{self.seed}-{index}"
            taken = run_id in self.training_runs or (
                self._checkpoint_dir is not None and (self._checkpoint_dir / run_id).exists()
            )
            if not taken:
                break
            index += 1
        self.training_runs[run_id] = TrainingRunRecord(
            base_model=base_model,
            lora_rank=lora_rank,
            user_metadata=dict(user_metadata or {}),
            created_at=time.time(),
        )
        return run_id

    def next_sample_request_index(self) -> int:
        """The index of a new `sample` request among all of this service's requests."""
        index = self._sample_requests
        self._sample_requests += 1
        return index

    def checkpoint_path(self, model_id: str, kind: str, name: str, *, overwrite: bool) -> Path:
        """The absolute directory of checkpoint `name` of `kind` for `model_id`.

        Raises:
            FileExistsError: the checkpoint exists and `overwrite` is False.
            ValueError: `name` is not a usable checkpoint name (see `checkpoint_name`).
        """
        if self._checkpoint_dir is None:
            self._checkpoint_dir = Path(tempfile.mkdtemp(prefix="rlpure-local-"))
            # at exit, not when this runtime is collected: a saved path may outlive the service
            atexit.register(shutil.rmtree, self._checkpoint_dir, ignore_errors=True)
        # absolute, not resolved: a symlinked `local_states` keeps its paths inside the log dir
        directory = Path(
            os.path.abspath(self._checkpoint_dir / model_id / kind / checkpoint_name(name))
        )
        if directory.exists() and not overwrite:
            raise FileExistsError(f"checkpoint {str(directory)!r} exists (pass overwrite=True)")
        return directory
