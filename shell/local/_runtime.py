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
  bound. Row counts are powers of two (at least 1), so chunking reuses compiled shapes. The
  grouped prefix route (`training_positions`) counts the same budgets per position and fills
  them (a chunk's row counts are bucketed by its planner), so its chunks may hold up to ~2×
  the positions of a power-of-two row count at the same width, within the same 4 GiB and
  128 MiB bounds (on SmolLM2: 1,536 positions a chunk against 1,024–1,280).
- Checkpoints live under `checkpoint_dir / model_id / kind / name`. The service passes its
  checkpoint directory (by default `shell.data_dir.default_checkpoint_dir()`, shared by every
  process of the user; created on first use, never removed) or `None` for a temporary one: a
  fresh `rlpure-local-*` directory created on first use and removed when the interpreter exits
  (`atexit`; a killed process leaves it).
- A training run owns the folder `checkpoint_dir / run_id`. `new_training_run_id()` claims it
  atomically (`mkdir` without `exist_ok`: of several processes sharing the directory exactly one
  gets a name) and writes the run's `TrainingRunRecord` there as `run.json` (base model, rank,
  whether it trains LoRA adapters, the `user_metadata` it was created with, when; replaced
  atomically, so a reader sees a whole record or none), so a run with no checkpoint yet is known
  to a later process. Runs the service names itself are `local-{seed}-{index}`: the first claim
  starts after the highest index on disk (one directory listing) and each later one after the
  last index claimed, moving on at each folder another process took first, so a claim costs
  O(runs) at worst and ids are never reused, even once a run's folder is deleted (on Tinker,
  too, a training client restored from a state is a new training run). A host may name a run
  itself (`run_id=`: a plain folder name not yet claimed). `training_runs` keeps the records of
  the runs this service opened; `training_run(run_id)` answers from it, then from `run.json`.
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
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
from tinker import types

from rlpure import model as model_lib
from shell.errors import ConfigError
from shell.local._checkpoints import checkpoint_name
from shell.local._models import resolve_base_model

__all__ = ["LoadedModel", "LocalRuntime", "TrainingRunRecord", "read_run_record"]

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
    peak memory where they were: 16 rows measured no faster (`benchmarks/bench_local_model.py`)
    (the grouped prefix route fills this budget per position instead: `training_positions`).
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
    """A training run (training client) a service opened, as its `run.json` holds it."""

    base_model: str
    lora_rank: int
    """The `rank` the run was created with (a toy model records it without using it)."""
    is_lora: bool
    """Whether the run trains LoRA adapters (a pretrained model) rather than every weight."""
    user_metadata: dict[str, str]
    created_at: float
    """Seconds since the epoch."""


_RUN_FILE = "run.json"
_RUN_DECODER = msgspec.json.Decoder(TrainingRunRecord)
_RUN_ID = re.compile(r"local-(\d+)-(\d+)")


def read_run_record(folder: Path) -> TrainingRunRecord | None:
    """The `run.json` of the run folder `folder`, or None where it is missing or unreadable
    (a folder being claimed has none yet; a damaged one reads as absent)."""
    try:
        return _RUN_DECODER.decode((folder / _RUN_FILE).read_bytes())
    except (OSError, msgspec.DecodeError):
        return None


def _write_run_record(folder: Path, record: TrainingRunRecord) -> None:
    """Writes `folder/run.json` atomically (a temporary sibling, then `os.replace`)."""
    staging = folder / f".{_RUN_FILE}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        staging.write_bytes(msgspec.json.encode(record))
        os.replace(staging, folder / _RUN_FILE)
    finally:
        staging.unlink(missing_ok=True)


def _highest_run_index(root: Path, seed: int) -> int:
    """The highest `index` of the `local-{seed}-{index}` folders under `root` (-1: none)."""
    highest = -1
    try:
        entries = os.scandir(root)
    except FileNotFoundError:
        return highest
    with entries:
        for entry in entries:
            match = _RUN_ID.fullmatch(entry.name)
            if match is not None and match[1] == str(seed):
                highest = max(highest, int(match[2]))
    return highest


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
        checkpoint_dir: where checkpoints and training runs are written (created on first
            use, never removed; `None`: a temporary directory, removed at exit).
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
        self.session_id = f"local-{uuid.uuid4().hex[:16]}"
        """Names the service's session: a `LossHandle` works only with clients of its session."""
        self.model_configs = model_configs
        self.training_runs: dict[str, TrainingRunRecord] = {}
        self.max_batch_rows = max_batch_rows
        self.max_batch_tokens = max_batch_tokens
        self.max_train_tokens = max_train_tokens
        self._checkpoint_dir = checkpoint_dir
        self._next_index: int | None = None  # of the next `local-{seed}-{index}` to try
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

    def training_positions(self, config: model_lib.ModelConfig, keys: int) -> int:
        """Most positions per training call when each query reads at most `keys` keys (the
        grouped prefix route, whose rows have two widths): `training_rows`' three budgets
        counted per position and filled, not rounded down to a power of two of rows (at least
        1); the planner keeps each chunk's padded positions within it. The suffix rows'
        gathered prefix keys and values are not counted (transient, recomputed under
        `jax.checkpoint`)."""
        return max(
            1,
            min(
                self.max_train_tokens,
                _ATTENTION_ELEMENTS // (config.n_heads * keys),
                _ACTIVATION_FLOATS // activation_floats_per_token(config, keys),
            ),
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

    def _root(self) -> Path:
        """The checkpoint directory, created if missing (a temporary one on first use)."""
        if self._checkpoint_dir is None:
            self._checkpoint_dir = Path(tempfile.mkdtemp(prefix="rlpure-local-"))
            # at exit, not when this runtime is collected: a saved path may outlive the service
            atexit.register(shutil.rmtree, self._checkpoint_dir, ignore_errors=True)
        else:
            self._checkpoint_dir.mkdir(parents=True, exist_ok=True)
        return self._checkpoint_dir

    def _claim_own_run_id(self, root: Path) -> str:
        """Claims the next free `local-{seed}-{index}` folder under `root` (see module doc)."""
        if self._next_index is None:
            self._next_index = _highest_run_index(root, self.seed) + 1
        while True:
            run_id = f"local-{self.seed}-{self._next_index}"
            self._next_index += 1
            try:
                (root / run_id).mkdir()
            except FileExistsError:
                continue  # another process (or a host-named run) took it first
            return run_id

    def new_training_run_id(
        self,
        *,
        base_model: str,
        lora_rank: int,
        is_lora: bool,
        user_metadata: Mapping[str, str] | None,
        run_id: str | None = None,
    ) -> str:
        """Claims a new training run's folder, writes its `run.json` and returns its id.

        Args:
            base_model: the run's base model name.
            lora_rank: the `rank` it was created with.
            is_lora: whether it trains LoRA adapters.
            user_metadata: the metadata of the factory that opened it.
            run_id: the id a host gives the run (a plain folder name); None: the service names
                it `local-{seed}-{index}`.

        Raises:
            ConfigError: `run_id` is not a plain folder name, or a run of that id exists under
                the checkpoint directory.
        """
        root = self._root()
        if run_id is None:
            run_id = self._claim_own_run_id(root)
        else:
            try:
                checkpoint_name(run_id)
            except ValueError as err:
                raise ConfigError(f"training_run_id: {err}") from err
            try:
                (root / run_id).mkdir()
            except FileExistsError as err:
                raise ConfigError(
                    f"training_run_id: a training run {run_id!r} already exists under {root}"
                ) from err
        record = TrainingRunRecord(
            base_model=base_model,
            lora_rank=lora_rank,
            is_lora=is_lora,
            user_metadata=dict(user_metadata or {}),
            created_at=time.time(),
        )
        _write_run_record(root / run_id, record)
        self.training_runs[run_id] = record
        return run_id

    def training_run(self, run_id: str) -> TrainingRunRecord | None:
        """The record of training run `run_id`: this service's, else its `run.json` (None if
        neither: an unknown run, an earlier rlpure's, or one whose folder is being claimed)."""
        record = self.training_runs.get(run_id)
        if record is not None or self._checkpoint_dir is None:
            return record
        try:
            checkpoint_name(run_id)
        except ValueError:
            return None
        return read_run_record(self._checkpoint_dir / run_id)

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
        # absolute, not resolved: a symlinked `local_states` keeps its paths inside the log dir
        directory = Path(os.path.abspath(self._root() / model_id / kind / checkpoint_name(name)))
        if directory.exists() and not overwrite:
            raise FileExistsError(f"checkpoint {str(directory)!r} exists (pass overwrite=True)")
        return directory
