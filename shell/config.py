"""Training configuration: one frozen msgspec record, loadable from TOML/JSON, CLI overrides.

Conventions:
- `TrainConfig` holds every option of the loop (`shell.training.train`); `FIELD_HELP` documents
  each one (the CLI's `--help` prints it). Unknown keys are refused, values are type-checked by
  msgspec, and range checks raise `ConfigError` naming the field.
- Precedence: defaults < config file (`.toml` or `.json`) < command-line overrides.
- The Tinker API key is **not** a config field: the SDK reads `TINKER_API_KEY` from the
  environment, so the key never appears in a config file, a config dump (`config.json` in the
  log directory) or a checkpoint record.
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args

import msgspec

from rlpure.advantages import AggregationMode, Estimator
from rlpure.losses import PolicyLossName
from rlpure.model import MODEL_CONFIGS
from shell.errors import ConfigError
from shell.rollouts import (
    DEFAULT_LIMIT_STOP_REASONS,
    FailFast,
    MinViableGroup,
    RetryOnFailure,
    RolloutStrategy,
    TerminationRewardPolicy,
    default_rollout_config_for_model,
)

__all__ = [
    "FIELD_HELP",
    "LOCAL_LOSSES",
    "MAX_SEED",
    "AsyncConfig",
    "LossName",
    "StreamMinibatchConfig",
    "TerminationConfig",
    "TrainConfig",
    "build_config",
    "check_log_dir",
    "config_to_dict",
    "field_choices",
    "load_config_file",
]

Backend = Literal["local", "tinker", "fake"]

MAX_SEED = 2**63 - 1
"""The largest `seed`: `jax.random.key` takes it as a signed 64-bit integer (a larger one ends
in an `OverflowError` deep inside JAX)."""
StrategyName = Literal["fail_fast", "retry", "min_viable"]
LossName = Literal[PolicyLossName, "stable_reinforce"]
"""The loop's loss names: rlpure's policy losses plus Tinker's `stable_reinforce` (the
cookbook's async default), which trains on the sampler's provenance spans."""
LOCAL_LOSSES: frozenset[str] = frozenset(get_args(PolicyLossName))
"""The losses the local backend computes (`rlpure.losses`); others are refused at config time."""


class TerminationConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`shell.rollouts.TerminationRewardPolicy` as a config record (TOML/JSON-able, recorded in
    `config.json`): the same fields, defaults and validation (`policy()` builds the policy,
    `from_policy` reads one back).

    Attributes:
        zero_reward_on_limit: clamp the total reward of a limit-stopped trajectory to
            `min(total, 0.0)` after grading.
        limit_stop_reasons: the stop reasons that count as limit stops.
        skip_grading_on_timeout: skip grading (rewards 0.0) when every trajectory of a group
            stopped on `rollout_timeout` (with the clamp on).
        grader_timeout_seconds: wall clock of one grading call (None: unbounded).
        pass_all_messages_to_grader: env-level graders see the full history.

    Examples:
        >>> TerminationConfig(zero_reward_on_limit=True).policy().zero_reward_on_limit
        True
    """

    zero_reward_on_limit: bool = False
    limit_stop_reasons: tuple[str, ...] = tuple(DEFAULT_LIMIT_STOP_REASONS)
    skip_grading_on_timeout: bool = False
    grader_timeout_seconds: float | None = None
    pass_all_messages_to_grader: bool = False

    def policy(self) -> TerminationRewardPolicy:
        """The `TerminationRewardPolicy` these fields describe.

        Raises:
            ValueError: a field the policy's validation refuses.
        """
        return TerminationRewardPolicy(**msgspec.structs.asdict(self))

    @classmethod
    def from_policy(cls, policy: TerminationRewardPolicy) -> TerminationConfig:
        """The config record of `policy` (e.g. a cookbook `Config.termination`)."""
        return cls(
            zero_reward_on_limit=policy.zero_reward_on_limit,
            limit_stop_reasons=tuple(policy.limit_stop_reasons),
            skip_grading_on_timeout=policy.skip_grading_on_timeout,
            grader_timeout_seconds=policy.grader_timeout_seconds,
            pass_all_messages_to_grader=policy.pass_all_messages_to_grader,
        )


class StreamMinibatchConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Sync training with streaming minibatches (the cookbook's `StreamMinibatchConfig`).

    Each step's `groups_per_batch` groups are split into `num_substeps` optimizer substeps of
    `num_minibatches` minibatches each; a minibatch goes to `forward_backward` as soon as its
    groups have rolled out, and each substep ends with one `optim_step`
    (`shell.training._stream`).

    Attributes:
        groups_per_batch: groups per training step (must equal the dataset's batch size, and
            `groups_per_batch / num_substeps` must be a multiple of `num_minibatches`).
        num_minibatches: `forward_backward` calls per optimizer substep.
    """

    groups_per_batch: int
    num_minibatches: int


class AsyncConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Async, off-policy training (the cookbook's `AsyncConfig`; `shell.training._async`).

    Rollouts keep going while the model trains: at most
    `groups_per_batch * (max_steps_off_policy + 1)` groups are started and not yet trained;
    each step trains the `groups_per_batch` completed groups sampled from the oldest weights,
    and no group is discarded for staleness.

    Attributes:
        max_steps_off_policy: how many steps sampling may run ahead of training (>= 0; 0 is
            on-policy).
        groups_per_batch: groups per training step (>= 1, at most the dataset's batch size).
        loss_fn: the loss async runs train with, in place of `TrainConfig.loss_fn` (the
            cookbook's default `stable_reinforce`, Tinker only; on the local backend choose
            e.g. `ppo`).
    """

    max_steps_off_policy: int
    groups_per_batch: int
    loss_fn: LossName = "stable_reinforce"


class TrainConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Every option of the GRPO loop; see `FIELD_HELP` for each field's meaning."""

    log_dir: str = "runs/rlpure"
    backend: Backend = "local"
    base_model: str = "rlpure/tiny"
    lora_rank: int = 32
    seed: int = 0
    max_steps: int | None = None
    num_epochs: int = 1
    load_checkpoint_path: str | None = None
    learning_rate: float = 4e-5
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0
    loss_fn: LossName = "importance_sampling"
    loss_fn_config: dict[str, float] | None = None
    num_substeps: int = 1
    max_tokens: int = 256
    temperature: float = 1.0
    eval_temperature: float = 1.0
    advantage_estimator: Estimator = "group_centered"
    loss_aggregation: AggregationMode = "token_sum"
    aggregation_length: float | None = None
    remove_constant_reward_groups: bool = False
    kl_penalty_coef: float = 0.0
    kl_discount: float = 0.0
    kl_reference_model: str | None = None
    kl_reference_checkpoint: str | None = None
    kl_reference_initial_policy: bool = False
    compute_post_kl: bool = False
    termination: TerminationConfig | None = None
    rollout_strategy: StrategyName = "fail_fast"
    max_retries: int = 3
    rollout_timeout: float | None = None
    min_viable_group: int | None = None
    max_concurrent_groups: int | None = None
    eval_every: int = 0
    save_every: int = 0
    ttl_seconds: int | None = 604800
    rolling_save_every: int = 0
    rolling_ttl_seconds: int = 7200
    num_groups_to_log: int = 1
    progress: bool = True
    stream_minibatch_config: StreamMinibatchConfig | None = None
    async_config: AsyncConfig | None = None
    price_table: str | None = None
    wandb_project: str | None = None
    wandb_name: str | None = None
    tensorboard_dir: str | None = None

    def __post_init__(self) -> None:
        def need(ok: bool, field: str, rule: str) -> None:
            if not ok:
                raise ConfigError(f"TrainConfig.{field}: {rule}, got {getattr(self, field)!r}")

        finite = math.isfinite
        need(bool(self.log_dir), "log_dir", "must be a non-empty path")
        need(self.lora_rank >= 1, "lora_rank", "must be >= 1")
        need(0 <= self.seed <= MAX_SEED, "seed", "must lie in [0, 2**63 - 1]")
        need(self.max_steps is None or self.max_steps >= 0, "max_steps", "must be >= 0 or null")
        need(self.num_epochs >= 1, "num_epochs", "must be >= 1")
        need(
            self.load_checkpoint_path is None or bool(self.load_checkpoint_path),
            "load_checkpoint_path",
            "must be a non-empty path or null",
        )
        need(finite(self.learning_rate) and self.learning_rate > 0, "learning_rate", "must be > 0")
        need(0 <= self.adam_beta1 < 1, "adam_beta1", "must lie in [0, 1)")
        need(0 <= self.adam_beta2 < 1, "adam_beta2", "must lie in [0, 1)")
        need(finite(self.adam_eps) and self.adam_eps > 0, "adam_eps", "must be > 0")
        need(finite(self.weight_decay) and self.weight_decay >= 0, "weight_decay", "must be >= 0")
        need(
            finite(self.grad_clip_norm) and self.grad_clip_norm >= 0,
            "grad_clip_norm",
            "must be >= 0 (0 disables clipping)",
        )
        need(self.num_substeps >= 1, "num_substeps", "must be >= 1")
        need(self.max_tokens >= 1, "max_tokens", "must be >= 1")
        if self.backend == "local":
            # Refused here, before any compilation: the local model's context length is known
            # from its config. (A name outside MODEL_CONFIGS may be a `LocalServiceClient`'s
            # own `model_configs` entry; the local service refuses an unknown one when it makes the
            # training client.)
            model = MODEL_CONFIGS.get(self.base_model)
            need(
                model is None or self.max_tokens < model.max_seq_len,
                "max_tokens",
                f"must be < the context length of local model {self.base_model!r} "
                f"({model.max_seq_len if model else 0} tokens, prompt included)",
            )
        need(finite(self.temperature) and self.temperature >= 0, "temperature", "must be >= 0")
        need(
            finite(self.eval_temperature) and self.eval_temperature >= 0,
            "eval_temperature",
            "must be >= 0 (0: greedy)",
        )
        need(
            self.backend != "local" or self.loss_fn in LOCAL_LOSSES,
            "loss_fn",
            "is a Tinker loss the local backend does not implement (local losses: "
            + ", ".join(sorted(LOCAL_LOSSES))
            + "); use backend 'tinker' or another loss",
        )
        self._check_modes()
        need(
            (self.loss_aggregation == "constant_length") == (self.aggregation_length is not None),
            "aggregation_length",
            "is required for loss_aggregation 'constant_length' and only for it",
        )
        need(
            self.aggregation_length is None
            or (finite(self.aggregation_length) and self.aggregation_length > 0),
            "aggregation_length",
            "must be finite and > 0",
        )
        # config.json records the config as JSON, which has no inf or NaN (they would read back
        # as null and make every resume look changed); Tinker's requests are JSON too.
        for key, value in (self.loss_fn_config or {}).items():
            need(finite(value), "loss_fn_config", f"[{key!r}] must be finite")
        need(
            finite(self.kl_penalty_coef) and self.kl_penalty_coef >= 0,
            "kl_penalty_coef",
            "must be >= 0",
        )
        need(0 <= self.kl_discount <= 1, "kl_discount", "must lie in [0, 1]")
        self._check_kl_reference()
        if self.termination is not None:
            try:
                self.termination.policy()
            except (ValueError, TypeError) as err:
                raise ConfigError(f"TrainConfig.termination: {err}") from None
        need(self.max_retries >= 0, "max_retries", "must be >= 0")
        need(
            self.rollout_timeout is None
            or (finite(self.rollout_timeout) and self.rollout_timeout > 0),
            "rollout_timeout",
            "must be finite and > 0, or null (no timeout)",
        )
        need(
            self.min_viable_group is None or self.min_viable_group >= 1,
            "min_viable_group",
            "must be >= 1 or null",
        )
        need(
            self.rollout_strategy == "min_viable" or self.min_viable_group is None,
            "min_viable_group",
            "only applies to rollout_strategy 'min_viable'",
        )
        need(
            self.max_concurrent_groups is None or self.max_concurrent_groups >= 1,
            "max_concurrent_groups",
            "must be >= 1 or null",
        )
        need(self.eval_every >= 0, "eval_every", "must be >= 0 (0 disables evaluation)")
        need(self.save_every >= 0, "save_every", "must be >= 0 (0: only a final checkpoint)")
        need(
            self.ttl_seconds is None or self.ttl_seconds > 0,
            "ttl_seconds",
            "must be > 0 or null (kept indefinitely)",
        )
        need(self.rolling_save_every >= 0, "rolling_save_every", "must be >= 0 (0: none)")
        need(self.rolling_ttl_seconds > 0, "rolling_ttl_seconds", "must be > 0")
        need(self.num_groups_to_log >= 0, "num_groups_to_log", "must be >= 0")
        need(
            self.price_table is None or bool(self.price_table),
            "price_table",
            "must be a non-empty path or null",
        )
        need(
            self.wandb_project is None or bool(self.wandb_project),
            "wandb_project",
            "must be a non-empty W&B project name or null (no W&B logging)",
        )
        need(
            self.wandb_name is None or self.wandb_project is not None,
            "wandb_name",
            "names a W&B run, so it needs wandb_project",
        )
        need(
            self.tensorboard_dir is None or bool(self.tensorboard_dir),
            "tensorboard_dir",
            "must be a non-empty path or null (no TensorBoard logging)",
        )

    def _check_modes(self) -> None:
        """The streaming and async options (the cookbook's `AsyncConfig._check`, its runtime
        divisibility asserts and its loss checks in `main`), refused here as `ConfigError`s."""
        stream, run_async = self.stream_minibatch_config, self.async_config
        if stream is not None:
            where = "TrainConfig.stream_minibatch_config"
            if stream.groups_per_batch < 1 or stream.num_minibatches < 1:
                raise ConfigError(
                    f"{where}: groups_per_batch and num_minibatches must be >= 1, got "
                    f"{stream.groups_per_batch} and {stream.num_minibatches}"
                )
            if stream.groups_per_batch % self.num_substeps:
                raise ConfigError(
                    f"{where}.groups_per_batch: {stream.groups_per_batch} is not divisible by "
                    f"num_substeps {self.num_substeps}"
                )
            per_substep = stream.groups_per_batch // self.num_substeps
            if per_substep % stream.num_minibatches:
                raise ConfigError(
                    f"{where}.num_minibatches: {stream.num_minibatches} minibatches do not "
                    f"divide the {per_substep} groups of a substep (groups_per_batch "
                    f"{stream.groups_per_batch} / num_substeps {self.num_substeps})"
                )
        if run_async is None:
            return
        where = "TrainConfig.async_config"
        if stream is not None:
            raise ConfigError(
                f"{where}: async training with streaming minibatches (both async_config and "
                "stream_minibatch_config set) is not supported; set one of them"
            )
        if run_async.max_steps_off_policy < 0:
            raise ConfigError(
                f"{where}.max_steps_off_policy: must be >= 0, got {run_async.max_steps_off_policy}"
            )
        if run_async.groups_per_batch < 1:
            raise ConfigError(
                f"{where}.groups_per_batch: must be >= 1, got {run_async.groups_per_batch}"
            )
        if self.loss_fn not in ("importance_sampling", run_async.loss_fn):
            # the cookbook's check in `main`: async runs train with AsyncConfig.loss_fn
            raise ConfigError(
                f"TrainConfig.loss_fn: {self.loss_fn!r} conflicts with async_config.loss_fn "
                f"{run_async.loss_fn!r}; async runs train with async_config.loss_fn, so set "
                "the loss there"
            )
        if self.backend == "local" and run_async.loss_fn not in LOCAL_LOSSES:
            raise ConfigError(
                f"{where}.loss_fn: {run_async.loss_fn!r} is a Tinker loss the local backend does "
                "not implement (local losses: " + ", ".join(sorted(LOCAL_LOSSES)) + "); set "
                "async_config.loss_fn to one of them (ppo is stable on off-policy data) or use "
                "backend 'tinker'"
            )

    def training_loss_fn(self) -> LossName:
        """The loss this run trains with: `async_config.loss_fn` for async runs, else `loss_fn`
        (the cookbook's `Config.training_loss_fn`)."""
        return self.async_config.loss_fn if self.async_config is not None else self.loss_fn

    def _check_kl_reference(self) -> None:
        named = self.kl_reference_model is not None or self.kl_reference_checkpoint is not None
        if self.kl_reference_initial_policy and named:
            raise ConfigError(
                "TrainConfig.kl_reference_initial_policy: true excludes kl_reference_model and "
                "kl_reference_checkpoint (one KL reference), got "
                f"{self.kl_reference_model!r} and {self.kl_reference_checkpoint!r}"
            )
        if self.kl_penalty_coef > 0 and not (named or self.kl_reference_initial_policy):
            # the cookbook: "kl_reference_config must be specified when kl_penalty_coef > 0"
            raise ConfigError(
                f"TrainConfig.kl_penalty_coef: {self.kl_penalty_coef!r} > 0 needs a KL "
                "reference: set kl_reference_model (and optionally kl_reference_checkpoint, the "
                "cookbook's KLReferenceConfig), or kl_reference_initial_policy = true"
            )
        if (
            self.training_loss_fn() == "stable_reinforce"
            and self.kl_penalty_coef > 0
            and self.kl_discount > 0
        ):
            # the cookbook's check: discounting spreads the penalty onto prompt tokens, and
            # stable_reinforce accepts nonzero advantages on sampled tokens only
            raise ConfigError(
                f"TrainConfig.kl_discount: {self.kl_discount!r} > 0 is not supported with "
                "loss_fn 'stable_reinforce' and a KL penalty; set kl_discount = 0 or choose "
                "another loss_fn"
            )

    def effective_termination(self) -> TerminationRewardPolicy | None:
        """The termination policy the run trains with (the cookbook's
        `Config.effective_termination`): `termination` when set, else the model's default
        (`shell.rollouts.default_rollout_config_for_model`: the agentic grade-then-clamp for
        `thinkingmachines/Inkling` models, none for others). To force no clamp on such a
        model, set `termination = {zero_reward_on_limit = false}`."""
        if self.termination is not None:
            return self.termination.policy()
        return default_rollout_config_for_model(self.base_model).termination

    def strategy(self) -> RolloutStrategy:
        """The rollout strategy these options describe."""
        if self.rollout_strategy == "fail_fast":
            return FailFast(per_rollout_timeout=self.rollout_timeout)
        if self.rollout_strategy == "retry":
            return RetryOnFailure(
                max_retries=self.max_retries, per_rollout_timeout=self.rollout_timeout
            )
        return MinViableGroup(
            min_successful=self.min_viable_group,
            max_retries=self.max_retries,
            per_rollout_timeout=self.rollout_timeout,
        )


FIELD_HELP: Mapping[str, str] = {
    "log_dir": "Directory for metrics.jsonl, samples.jsonl, checkpoints.jsonl, config.json, "
    "the recipe's recipe_options.json and the reward curve. Re-running with the same directory "
    "resumes from its last checkpoint; it is refused if an option that shapes training changed.",
    "backend": "Where the model runs: 'local' (offline JAX model on the CPU), 'tinker' (the "
    "Tinker service; reads TINKER_API_KEY from the environment) or 'fake' (scripted test "
    "doubles, no model).",
    "base_model": "Model to fine-tune: a Tinker model name (e.g. Qwen/Qwen3.5-9B-Base) or a "
    "local config name (rlpure/tiny, rlpure/small).",
    "lora_rank": "LoRA rank of the training client (the local backend trains all weights).",
    "seed": "Seed of the loop's PRNG (per-step sampling seeds) and of the local backend.",
    "max_steps": "Cap on training steps: the run trains min(num_epochs * len(dataset), "
    "max_steps) steps (a larger max_steps alone stops early, with a warning; raise num_epochs "
    "to train longer).",
    "num_epochs": "Passes over the training dataset: step i trains on batch i % len(dataset); "
    "steps, checkpoints and resume count globally across epochs.",
    "load_checkpoint_path": "Start a fresh run from the weights saved at this state path "
    "(create_training_client_from_state: weights only, a fresh optimizer). Ignored when the "
    "log dir has a checkpoint to resume (its weights and optimizer state win).",
    "learning_rate": "Adam learning rate.",
    "adam_beta1": "Adam beta1.",
    "adam_beta2": "Adam beta2.",
    "adam_eps": "Adam epsilon.",
    "weight_decay": "AdamW decoupled weight decay (0 disables it).",
    "grad_clip_norm": "Clip gradients to this global norm before the Adam update (0: off).",
    "loss_fn": "Tinker policy loss: importance_sampling, ppo, cispo, dro, gspo or "
    "stable_reinforce (Tinker only: it needs the sampler's provenance on every datum, and the "
    "local backend does not implement it).",
    "loss_fn_config": "Loss options passed to forward_backward, e.g. {clip_low_threshold = "
    "0.8} (TOML/JSON; on the command line as JSON).",
    "num_substeps": "Split each batch into this many forward_backward + optim_step pairs.",
    "max_tokens": "Maximum number of tokens sampled per action.",
    "temperature": "Sampling temperature for training rollouts (see eval_temperature). "
    "Sampled logprobs are those of the tempered distribution (on Tinker and the local "
    "backend), while training computes the untempered ones: with a temperature other than 1 "
    "the importance ratio of an on-policy sample is not 1.",
    "eval_temperature": "Sampling temperature of the test-set evaluation (1.0, the "
    "cookbook's RLTestSetEvaluator; 0 samples greedily).",
    "advantage_estimator": "group_centered (reward minus group mean, the cookbook's), "
    "group_normalized (GRPO: divided by the group std), batch_normalized, or leave_one_out.",
    "loss_aggregation": "How per-token losses are weighed: token_sum (Tinker's), "
    "sequence_token_mean, batch_token_mean, or constant_length (Dr. GRPO).",
    "aggregation_length": "The constant of loss_aggregation=constant_length.",
    "remove_constant_reward_groups": "Drop groups whose trajectories all got the same reward "
    "(they carry no signal under group centring); when every group is constant the first is "
    "kept and trained on, as in the cookbook.",
    "kl_penalty_coef": "Coefficient of the KL-to-reference advantage shaping (0 disables it).",
    "kl_discount": "Discount of the KL penalty along each sequence (0: per-token penalty).",
    "kl_reference_model": "Base model of the KL reference (the cookbook's "
    "KLReferenceConfig.base_model). kl_penalty_coef > 0 needs a reference: this and/or "
    "kl_reference_checkpoint, or kl_reference_initial_policy.",
    "kl_reference_checkpoint": "Sampler weights of the KL reference (the cookbook's "
    "KLReferenceConfig.load_checkpoint_path), e.g. a tinker:// sampler path.",
    "kl_reference_initial_policy": "Use the policy's weights at the start of the run as the KL "
    "reference (saved once, reused after a resume); excludes kl_reference_model/checkpoint.",
    "termination": "Stop-reason-keyed reward semantics of training rollouts (the cookbook's "
    "TerminationRewardPolicy), a table: zero_reward_on_limit, limit_stop_reasons, "
    "skip_grading_on_timeout, grader_timeout_seconds, pass_all_messages_to_grader. Default: "
    "the model's (grade-then-clamp for thinkingmachines/Inkling models, none otherwise).",
    "compute_post_kl": "Also log kl_pre_post_v1/v2: the KL between the sampling logprobs "
    "and the updated policy's on the step's data (one extra scoring call per datum).",
    "rollout_strategy": "Failure handling per group: fail_fast (any rollout error stops the "
    "run), retry (retry failed rollouts in fresh envs; all-or-nothing per group) or min_viable "
    "(accept a group once ceil(0.75*G) rollouts succeed). Failed groups are skipped and counted "
    "under the tolerant strategies.",
    "max_retries": "Retry budget per group (retry and min_viable strategies).",
    "rollout_timeout": "Seconds before a single rollout is cancelled: counted as failed (and "
    "retried) under retry/min_viable; under fail_fast its TimeoutError stops the run, so a "
    "hung env cannot hang it (the cookbook's FailFast has no timeout).",
    "min_viable_group": "Floor of the min_viable strategy (default: ceil(0.75*G)).",
    "max_concurrent_groups": "At most this many groups roll out at once (default: all).",
    "eval_every": "Run the evaluators (the test set's, and train(evaluator_builders=...)) "
    "every N steps and after the last (0: never).",
    "save_every": "Save a checkpoint every N steps (0: only at the end): the training state "
    "and the sampler weights.",
    "ttl_seconds": "Seconds the backend keeps each periodic checkpoint (null: indefinitely; "
    "the final one is always kept). Tinker expires them; the local backend keeps everything.",
    "rolling_save_every": "Save a rolling checkpoint (training state only, for resuming) every "
    "N steps where no periodic one falls (0: none); each deletes the previous one.",
    "rolling_ttl_seconds": "Seconds the backend keeps a rolling checkpoint, a safety net if "
    "its deletion fails (Tinker only).",
    "num_groups_to_log": "Groups per step whose decoded rollouts go to samples.jsonl.",
    "progress": "Show the progress bar and the per-step line.",
    "stream_minibatch_config": "Streaming minibatches (the cookbook's StreamMinibatchConfig), "
    "a table {groups_per_batch, num_minibatches}: each minibatch of a step's groups goes to "
    "forward_backward as soon as its groups have rolled out, one optim_step per substep. "
    "groups_per_batch must equal the dataset's batch size and groups_per_batch / "
    "num_substeps must be a multiple of num_minibatches.",
    "async_config": "Async off-policy training (the cookbook's AsyncConfig), a table "
    "{max_steps_off_policy, groups_per_batch, loss_fn}: rollouts continue while the model "
    "trains, at most groups_per_batch * (max_steps_off_policy + 1) groups in flight, each step "
    "trains the groups sampled from the oldest weights first (none discarded for staleness). "
    "loss_fn (default stable_reinforce, Tinker only) replaces TrainConfig.loss_fn.",
    "price_table": "TOML/JSON file of USD per million tokens by model (prefill, "
    "cached_prefill, sample, train; or Tinker's models.json list): adds cost/step_usd and "
    "cost/cumulative_usd to metrics.jsonl. The run's base_model must be listed.",
    "wandb_project": "Weights & Biases project to log metrics.jsonl's rows and the config to "
    "(needs the wandb extra: pip install 'rlpure[wandb]'; WANDB_MODE=offline logs locally).",
    "wandb_name": "Display name of the W&B run (needs wandb_project).",
    "tensorboard_dir": "Also write metrics.jsonl's numeric values as TensorBoard scalars to "
    "this directory (needs the tensorboard extra: pip install 'rlpure[tensorboard]').",
}

assert set(FIELD_HELP) == set(TrainConfig.__struct_fields__), "document every TrainConfig field"


def load_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Reads a `.toml` or `.json` config file into a dict (validated by `build_config`).

    Raises:
        ConfigError: unknown extension, unreadable file or malformed content.
    """
    path = Path(path)
    try:
        if path.suffix == ".toml":
            data: Any = tomllib.loads(path.read_text(encoding="utf-8"))
        elif path.suffix == ".json":
            data = json.loads(path.read_text(encoding="utf-8"))
        else:
            raise ConfigError(f"config file {path}: expected a .toml or .json file")
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file {path}: not UTF-8 text ({err.reason})") from None
    except (OSError, tomllib.TOMLDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"config file {path}: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a table/object at the top level")
    return data


def build_config(*layers: Mapping[str, Any]) -> TrainConfig:
    """Merges option layers (later wins) over the defaults and validates them.

    Raises:
        ConfigError: an unknown key, a value of the wrong type, or a value out of range.
    """
    merged: dict[str, Any] = {}
    for layer in layers:
        merged.update(dict(layer.items()))
    try:
        return msgspec.convert(merged, TrainConfig, strict=False)
    except msgspec.ValidationError as err:
        raise ConfigError(f"TrainConfig: {err}") from None


def config_to_dict(config: TrainConfig) -> dict[str, Any]:
    """The config as plain JSON-able data (what `config.json` in the log directory holds)."""
    data: dict[str, Any] = msgspec.to_builtins(config)
    return data


def field_choices(field: str) -> tuple[str, ...] | None:
    """The allowed values of a `Literal` field (used by the CLI for `choices=`)."""
    annotation = {
        "backend": Backend,
        "loss_fn": LossName,
        "eval_temperature": "Sampling temperature of the test-set evaluation (1.0, the "
        "cookbook's RLTestSetEvaluator; 0 samples greedily).",
        "advantage_estimator": Estimator,
        "loss_aggregation": AggregationMode,
        "rollout_strategy": StrategyName,
    }.get(field)
    return None if annotation is None else get_args(annotation)


def check_log_dir(path: str | os.PathLike[str], *, option: str = "--log-dir") -> None:
    """Makes sure `path` is a writable directory before anything runs (creating it if absent,
    as the run would).

    Raises:
        ConfigError: naming `option` and the path: a file, or a place this process cannot
            create or write.
    """
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise ConfigError(f"{option} {target}: exists and is not a directory")
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"{option} {target}: cannot create it: {err.strerror}") from None
    if not os.access(target, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {target}: not writable by this user")
