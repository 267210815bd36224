"""Training configuration: one frozen msgspec record, loadable from TOML/JSON, CLI overrides.

Conventions:
- `TrainConfig` holds every option of the loop (`shell.training.train`); `FIELD_HELP` documents
  each one (the CLI's `--help` prints it). Unknown keys are refused and values are type-checked
  by msgspec. A field's own constraint lives in its type (`PositiveInt`,
  `Annotated[float, msgspec.Meta(ge=0, lt=1)]`, `Literal[...]`), enforced when decoding and on
  direct construction alike; `__post_init__` adds the checks that span fields. Either raises
  a one-line `ConfigError` naming the field and the value.
- Precedence: defaults < config file (`.toml` or `.json`) < command-line overrides.
- The Tinker API key is **not** a config field: the SDK reads `TINKER_API_KEY` from the
  environment, so the key never appears in a config file, a config dump (`config.json` in the
  log directory) or a checkpoint record.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin, get_type_hints

import msgspec
import msgspec.inspect as mi

from rlpure.advantages import AggregationMode, Estimator
from rlpure.corrections import KLEstimator, MismatchLevel, MismatchMode
from rlpure.losses import LOSSES, PolicyLossName, check_loss_config
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
    "DynamicSamplingConfig",
    "LossName",
    "MismatchCorrectionConfig",
    "OverlongConfig",
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

# Field types with their constraint. Floats are finite: `config.json` records the config as JSON,
# which has no inf or NaN (they would read back as null and make every resume look changed),
# and Tinker's requests are JSON too. msgspec takes finite bounds only, so `le=_FLOAT_MAX`
# refuses inf; NaN fails every bound.
_FLOAT_MAX = sys.float_info.max
PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
FiniteFloat = Annotated[float, msgspec.Meta(ge=-_FLOAT_MAX, le=_FLOAT_MAX)]
PositiveFloat = Annotated[float, msgspec.Meta(gt=0, le=_FLOAT_MAX)]
NonNegativeFloat = Annotated[float, msgspec.Meta(ge=0, le=_FLOAT_MAX)]
NonEmptyStr = Annotated[str, msgspec.Meta(min_length=1)]


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

    groups_per_batch: PositiveInt
    num_minibatches: PositiveInt


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

    max_steps_off_policy: NonNegativeInt
    groups_per_batch: PositiveInt
    loss_fn: LossName = "stable_reinforce"


class MismatchCorrectionConfig(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True
):
    """Training–inference mismatch correction (`rlpure.corrections.importance_weights`).

    Each step, one extra `forward` of the policy before its update gives the trainer's
    logprobs of the step's datums; the importance weights between them and the sampler's
    scale the advantages, and the datums are sent with the trainer's logprobs as their
    `logprobs` (so the loss's own ratio is 1 at those weights and is not counted twice;
    `shell.training._corrections`), TIS with `truncate`, MIS with `mask`. Not with
    `stable_reinforce`. The default level and cap are TRL's (`sequence`, 3); its `*_mask`
    modes only zero ratios above the cap, while `mask` here zeroes those outside
    `[1/cap, cap]` (verl's window). Masked tokens stay in the loss aggregation's
    denominators (verl removes them).

    Attributes:
        level: `token`, `sequence` (the product of the row's ratios) or `geometric` (its
            per-token geometric mean).
        mode: `truncate` (`min(ratio, cap)`) or `mask` (zero tokens, or rows, whose ratio lies
            outside `[1/cap, cap]`).
        cap: the threshold, >= 1 and finite.
    """

    level: MismatchLevel = "sequence"
    mode: MismatchMode = "mask"
    cap: Annotated[float, msgspec.Meta(ge=1, le=_FLOAT_MAX)] = 3.0


class OverlongConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """DAPO's soft overlong punishment (`rlpure.corrections.overlong_penalty`), added to each
    trajectory's reward (its length: its sampled tokens) before advantages are computed.

    Attributes:
        max_length: responses longer than this get -1.
        buffer: the ramp's width: 0 up to `max_length - buffer` tokens, linear down to -1 at
            `max_length` (<= `max_length`).
    """

    max_length: PositiveInt
    buffer: PositiveInt


class DynamicSamplingConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """DAPO's dynamic sampling, in the sync mode (`shell.training._sync`).

    The step's batch rolls out; while fewer than `groups_per_batch` of the groups sampled so
    far have a non-constant reward, round `k` rolls out the dataset's batch `(step + k) mod
    num_batches` (new prompts, as DAPO and verl's recipe draw them; deterministic, so a resume
    samples the same), at most `max_sampling_rounds` rounds in all; the step then trains on
    the first `groups_per_batch` non-constant groups in sampling order (all it found when the
    rounds ran out; the first group when it found none, as `remove_constant_reward_groups`).

    Attributes:
        groups_per_batch: non-constant groups per step (at most the dataset's batch size).
        max_sampling_rounds: rollout rounds per step, the first included.
    """

    groups_per_batch: PositiveInt
    max_sampling_rounds: PositiveInt


class TrainConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Every option of the GRPO loop; see `FIELD_HELP` for each field's meaning.

    A field's own constraint is its type (`PositiveInt`, `Literal[...]`, ...); `__post_init__`
    refuses the same values on direct construction and checks the options that depend on
    others.
    """

    log_dir: NonEmptyStr = "runs/rlpure"
    backend: Backend = "local"
    base_model: str = "rlpure/tiny"
    lora_rank: PositiveInt = 32
    seed: Annotated[int, msgspec.Meta(ge=0, le=MAX_SEED)] = 0
    max_steps: NonNegativeInt | None = None
    num_epochs: PositiveInt = 1
    load_checkpoint_path: NonEmptyStr | None = None
    learning_rate: PositiveFloat = 4e-5
    adam_beta1: Annotated[float, msgspec.Meta(ge=0, lt=1)] = 0.9
    adam_beta2: Annotated[float, msgspec.Meta(ge=0, lt=1)] = 0.95
    adam_eps: PositiveFloat = 1e-8
    weight_decay: NonNegativeFloat = 0.0
    grad_clip_norm: NonNegativeFloat = 0.0
    loss_fn: LossName = "importance_sampling"
    loss_fn_config: dict[str, FiniteFloat] | None = None
    num_substeps: PositiveInt = 1
    max_tokens: PositiveInt = 256
    temperature: NonNegativeFloat = 1.0
    eval_temperature: NonNegativeFloat = 1.0
    advantage_estimator: Estimator = "group_centered"
    loss_aggregation: AggregationMode = "token_sum"
    aggregation_length: PositiveFloat | None = None
    remove_constant_reward_groups: bool = False
    kl_penalty_coef: NonNegativeFloat = 0.0
    kl_discount: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.0
    kl_reference_model: str | None = None
    kl_reference_checkpoint: str | None = None
    kl_reference_initial_policy: bool = False
    compute_post_kl: bool = False
    kl_penalty_estimator: KLEstimator = "k1"
    mismatch_correction: MismatchCorrectionConfig | None = None
    overlong: OverlongConfig | None = None
    dynamic_sampling: DynamicSamplingConfig | None = None
    termination: TerminationConfig | None = None
    rollout_strategy: StrategyName = "fail_fast"
    max_retries: NonNegativeInt = 3
    rollout_timeout: PositiveFloat | None = None
    min_viable_group: PositiveInt | None = None
    max_concurrent_groups: PositiveInt | None = None
    eval_every: NonNegativeInt = 0
    save_every: NonNegativeInt = 0
    ttl_seconds: PositiveInt | None = 604800
    rolling_save_every: NonNegativeInt = 0
    rolling_ttl_seconds: PositiveInt = 7200
    num_groups_to_log: NonNegativeInt = 1
    rollout_json_export: bool = True
    progress: bool = True
    enable_trace: bool = False
    span_chart_every: NonNegativeInt = 0
    stream_minibatch_config: StreamMinibatchConfig | None = None
    async_config: AsyncConfig | None = None
    price_table: NonEmptyStr | None = None
    wandb_project: NonEmptyStr | None = None
    wandb_name: str | None = None
    tensorboard_dir: NonEmptyStr | None = None

    def __post_init__(self) -> None:
        # msgspec checks the types' constraints only when decoding (`build_config`); this
        # refuses the same values when a caller builds the record itself.
        _check_fields(self)
        self._check_local_backend()
        self._check_modes()
        self._check_kl_reference()
        self._check_dependent_options()
        self._check_dapo_options()
        if self.termination is not None:
            try:  # its fields are validated by the policy it describes
                self.termination.policy()
            except (ValueError, TypeError) as err:
                raise ConfigError(f"TrainConfig.termination: {err}") from None

    def _need(self, ok: bool, field: str, rule: str) -> None:
        if not ok:
            raise ConfigError(f"TrainConfig.{field}: {rule}, got {getattr(self, field)!r}")

    def _check_local_backend(self) -> None:
        """What the local backend cannot run, refused before any compilation."""
        if self.backend != "local":
            return
        # The local model's context length is known from its config. (A name outside
        # MODEL_CONFIGS may be a `LocalServiceClient`'s own `model_configs` entry; the local
        # service refuses an unknown one when it makes the training client.)
        model = MODEL_CONFIGS.get(self.base_model)
        self._need(
            model is None or self.max_tokens < model.max_seq_len,
            "max_tokens",
            f"must be < the context length of local model {self.base_model!r} "
            f"({model.max_seq_len if model else 0} tokens, prompt included)",
        )
        self._need(
            self.loss_fn in LOCAL_LOSSES,
            "loss_fn",
            "is a Tinker loss the local backend does not implement (local losses: "
            + ", ".join(sorted(LOCAL_LOSSES))
            + "); use backend 'tinker' or another loss",
        )
        loss = self.training_loss_fn()
        if loss in LOSSES:  # (async's stable_reinforce is refused by `_check_modes`)
            try:  # what the local losses will refuse once the first batch trains
                check_loss_config(loss, self.loss_fn_config)
            except ValueError as err:
                raise ConfigError(f"TrainConfig.loss_fn_config: {err}") from None

    def _check_dependent_options(self) -> None:
        """Options that only make sense together with another option's value."""
        self._need(
            (self.loss_aggregation == "constant_length") == (self.aggregation_length is not None),
            "aggregation_length",
            "is required for loss_aggregation 'constant_length' and only for it",
        )
        self._need(
            self.rollout_strategy == "min_viable" or self.min_viable_group is None,
            "min_viable_group",
            "only applies to rollout_strategy 'min_viable'",
        )
        self._need(
            self.wandb_name is None or self.wandb_project is not None,
            "wandb_name",
            "names a W&B run, so it needs wandb_project",
        )

    def _check_dapo_options(self) -> None:
        """The corrections' options that depend on others (issue 30)."""
        self._need(
            self.kl_penalty_estimator == "k1" or self.kl_penalty_coef > 0,
            "kl_penalty_estimator",
            "only applies with kl_penalty_coef > 0",
        )
        self._need(
            self.mismatch_correction is None or self.training_loss_fn() != "stable_reinforce",
            "mismatch_correction",
            "is not combined with loss_fn 'stable_reinforce' (it reads the sampler's own "
            "record server-side); choose another loss_fn",
        )
        overlong = self.overlong
        if overlong is not None and overlong.buffer > overlong.max_length:
            raise ConfigError(
                f"TrainConfig.overlong.buffer: must be <= overlong.max_length "
                f"({overlong.max_length}), got {overlong.buffer}"
            )
        if self.dynamic_sampling is not None and (
            self.async_config is not None or self.stream_minibatch_config is not None
        ):
            mode = "async_config" if self.async_config is not None else "stream_minibatch_config"
            raise ConfigError(
                f"TrainConfig.dynamic_sampling: runs in the sync mode only, got {mode} as well; "
                "unset one of them"
            )

    def _check_modes(self) -> None:
        """The streaming and async options (the cookbook's `AsyncConfig._check`, its runtime
        divisibility asserts and its loss checks in `main`), refused here as `ConfigError`s."""
        stream, run_async = self.stream_minibatch_config, self.async_config
        if stream is not None:
            where = "TrainConfig.stream_minibatch_config"
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


# --- single-field constraints, read back from the field types ----------------------------------


@functools.cache
def _struct_info(cls: type[msgspec.Struct]) -> mi.StructType:
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    return info


def _check_fields(record: msgspec.Struct) -> None:
    """Refuses what msgspec refuses when decoding, for a record built directly: raises
    `ConfigError` naming the first field of `record` (nested records included) whose value
    breaks its type's constraint."""
    _check_value(_struct_info(type(record)), record, type(record).__name__)


def _check_value(info: mi.Type, value: Any, where: str) -> None:
    """Raises `ConfigError` (`where: rule, got value`) if `value` breaks the constraint of its
    type `info`: bounds (`gt`, `ge`, `lt`, `le`), a string's `min_length`, a `Literal`'s
    values. Records (given as records or mappings) and dicts are checked field by field and
    item by item; a value of another type is left to msgspec's type checks."""
    info, nullable = _unwrap_optional(info)
    if value is None and nullable:
        return
    if isinstance(info, mi.StructType) and isinstance(value, Mapping | msgspec.Struct):
        values = value if isinstance(value, Mapping) else msgspec.structs.asdict(value)
        for field in info.fields:
            if field.name in values:
                _check_value(field.type, values[field.name], f"{where}.{field.name}")
    elif isinstance(info, mi.DictType) and isinstance(value, Mapping):
        for key, item in value.items():
            if _breaks(info.value_type, item):
                raise ConfigError(f"{where}: [{key!r}] {_rule(info.value_type)}, got {item!r}")
    elif _breaks(info, value):
        raise ConfigError(
            f"{where}: {_rule(info)}{' (or null)' if nullable else ''}, got {value!r}"
        )


def _unwrap_optional(info: mi.Type) -> tuple[mi.Type, bool]:
    """`(T, True)` for `T | None`, else `(info, False)`."""
    if isinstance(info, mi.UnionType) and info.includes_none:
        rest = [t for t in info.types if not isinstance(t, mi.NoneType)]
        if len(rest) == 1:
            return rest[0], True
    return info, False


def _breaks(info: mi.Type, value: Any) -> bool:
    if isinstance(info, mi.LiteralType):
        return value not in info.values
    if isinstance(info, mi.StrType):
        return isinstance(value, str) and len(value) < (info.min_length or 0)
    if not isinstance(info, mi.IntType | mi.FloatType):
        return False
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    # written so that NaN fails every bound, as in msgspec
    return not (
        (info.ge is None or value >= info.ge)
        and (info.gt is None or value > info.gt)
        and (info.le is None or value <= info.le)
        and (info.lt is None or value < info.lt)
    )


def _rule(info: mi.Type) -> str:
    """What the constraint of `info` asks of a value, in words (`must lie in [0, 1)`)."""
    if isinstance(info, mi.LiteralType):
        return "must be one of " + ", ".join(repr(v) for v in info.values)
    if isinstance(info, mi.StrType):
        return "must be non-empty" if info.min_length == 1 else f"must be {info.min_length}+ long"
    assert isinstance(info, mi.IntType | mi.FloatType)
    low = (">=", "[", info.ge) if info.ge is not None else (">", "(", info.gt)
    high = ("<=", "]", info.le) if info.le is not None else ("<", ")", info.lt)
    if high[2] == _FLOAT_MAX:
        if low[2] is None or low[2] == -_FLOAT_MAX:
            return "must be finite"
        return f"must be finite and {low[0]} {_number(low[2])}"
    if low[2] is not None and high[2] is not None:
        return f"must lie in {low[1]}{_number(low[2])}, {_number(high[2])}{high[1]}"
    op, _, bound = low if low[2] is not None else high
    return f"must be {op} {_number(bound)}"


def _number(bound: float | None) -> str:
    return f"{bound:g}" if isinstance(bound, float) else str(bound)


def _decode_error(err: msgspec.ValidationError, data: Mapping[str, Any]) -> str:
    """msgspec's decoding error on `data` as a one-liner naming the field: the message direct
    construction gives when the field's constraint refused its value, else msgspec's words."""
    text, _, path = str(err).partition(" - at `$")
    info: mi.Type = _struct_info(TrainConfig)
    value: Any = data
    where = "TrainConfig"
    for name in re.findall(r"\.(\w+)", path.partition("[")[0]):
        info, _ = _unwrap_optional(info)
        types = {f.name: f.type for f in info.fields} if isinstance(info, mi.StructType) else {}
        if name not in types or not isinstance(value, Mapping | msgspec.Struct):
            break
        value = value.get(name) if isinstance(value, Mapping) else getattr(value, name)
        info, where = types[name], f"{where}.{name}"
    if where == "TrainConfig":  # e.g. an unknown field
        return f"TrainConfig: {err}"
    _check_value(info, _parsed(info, value), where)
    return f"{where} = {value!r}: {text}"


def _parsed(info: mi.Type, value: Any) -> Any:
    """`value` as `build_config`'s lax decoding reads it: a number given as text (CLI flags)
    becomes the number."""
    kind = {mi.IntType: int, mi.FloatType: float}.get(type(_unwrap_optional(info)[0]))
    if kind is None or not isinstance(value, str):
        return value
    try:
        return kind(value)
    except ValueError:
        return value


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
    "kl_penalty_estimator": "Estimator of the per-token KL in the KL penalty: k1 (log-ratio, "
    "the cookbook's), k2 (half its square) or k3 ((r - 1) - log r, non-negative); Schulman's "
    "estimators (rlpure.corrections.kl_estimate). Needs kl_penalty_coef > 0. The penalty "
    "is reward shaping (a stop-gradient reward): only k1 then gives an unbiased gradient of "
    "the KL; k2 and k3 as rewards give biased gradients (they suit estimates and losses).",
    "mismatch_correction": "Training-inference mismatch correction, a table {level, mode, "
    "cap} (default sequence, mask, 3.0): one extra forward of the policy before each update "
    "gives the trainer's logprobs; importance weights exp(trainer - sampler) at level "
    "token|sequence|geometric, truncated at cap (truncate, TIS) or zeroed outside [1/cap, cap] "
    "(mask, MIS: verl's window; TRL's masks zero ratios above cap only) scale the advantages, "
    "and the datums carry the trainer's logprobs, so the loss's own ratio is 1 at those "
    "weights. Masked tokens stay in the aggregation's denominators (verl drops them). Not "
    "with stable_reinforce. Metrics: mismatch/rollout_is_*.",
    "overlong": "DAPO's soft overlong punishment, a table {max_length, buffer}: a trajectory "
    "of n sampled tokens gets reward 0 up to max_length - buffer, linear to -1 at max_length, "
    "-1 beyond, added before advantages (training data only; env/* metrics are unshaped).",
    "dynamic_sampling": "DAPO's dynamic sampling (sync mode), a table {groups_per_batch, "
    "max_sampling_rounds}: while fewer than groups_per_batch sampled groups have a "
    "non-constant reward, round k of step s rolls out the dataset's batch (s + k) mod "
    "num_batches (new prompts, as DAPO), at most max_sampling_rounds rounds; the step trains "
    "on the first groups_per_batch mixed groups (env/* metrics read every group sampled). "
    "Metrics: dynamic_sampling/rounds, /groups_sampled, /groups_kept.",
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
    "rollout_json_export": "Write each step's iteration_NNNNNN/train_rollout_summaries.jsonl "
    "(and the test set's eval_<name>_rollout_summaries.jsonl): every trajectory's lengths, "
    "rewards and metrics.",
    "progress": "Show the progress bar and the per-step line.",
    "enable_trace": "Write a Perfetto / chrome://tracing trace of the run's phase spans to "
    "trace_events.jsonl in the log dir (a resumed run appends to it); "
    "`python -m shell.cookbook.utils.trace trace_events.jsonl trace.json` makes it a JSON array.",
    "span_chart_every": "Every N steps, a Gantt chart of the step's phase spans in "
    "iteration_NNNNNN/timing_gantt.html (0: never).",
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
        if isinstance(err.__cause__, ConfigError):  # from `TrainConfig.__post_init__`
            raise err.__cause__ from None
        error = err
    raise ConfigError(_decode_error(error, merged))  # out of `except`: a one-line error


def config_to_dict(config: TrainConfig) -> dict[str, Any]:
    """The config as plain JSON-able data (what `config.json` in the log directory holds)."""
    data: dict[str, Any] = msgspec.to_builtins(config)
    return data


def field_choices(field: str) -> tuple[str, ...] | None:
    """The allowed values of a `Literal` field of `TrainConfig` (the CLI's `choices=`)."""
    annotation = get_type_hints(TrainConfig).get(field)
    return get_args(annotation) if get_origin(annotation) is Literal else None


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
