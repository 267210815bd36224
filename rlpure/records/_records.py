"""Immutable records for what flows through RL: observations, actions, transitions, groups.

Conventions:
- Token sequences are stored as read-only numpy arrays (`int32` token ids, `float32` logprobs),
  not Python lists: the sampler already returns arrays, and packing arrays into a padded batch
  is a handful of `memcpy`s where a list of ints costs one Python object per token
  (see `benchmarks/bench_assembly.py` for the measured difference).
- Records are `msgspec.Struct(frozen=True, kw_only=True)`; sequence fields are tuples. Arrays
  are copied on construction and marked read-only, so a record never changes after it is built.
- Field names follow tinker-cookbook's `rl/types.py` so cookbook-style code ports by renaming
  imports. `Trajectory.transitions`, `TrajectoryGroup.trajectories_G` and friends are tuples.
- Validation happens in `__post_init__`, which msgspec also runs when decoding. These records are
  host-side only (they never travel through `jit`), so the STYLE rule against validating in
  `__post_init__` (JAX rebuilding records) does not apply; the padded batch record, which does
  travel through `jit`, is checked with `check_*` functions instead.
- Errors name the record and the field: `TokensWithLogprobs.logprobs: length 3 != tokens length 4`.
- What cookbook env code hands a record is converted at construction, so the stored form is
  always the frozen one: an observation field (`Transition.ob`, `StepResult.next_observation`,
  `Trajectory.final_ob`) takes an rlpure `ModelInput`, a `tinker.ModelInput` (duck-typed: an
  object with `to_ints()`, text chunks only; this module does not import tinker) or a
  list / tuple / 1-D array of token ids (`as_model_input`); `Transition.ac` takes an rlpure
  `TokensWithLogprobs` or the cookbook's (duck-typed: `tokens`, `maybe_logprobs`, optional
  `stop_reason` / `sequence_id`); stop conditions take lists. Metric and log values may be
  bools, stored as `1.0` / `0.0` (cookbook envs write `{"format": is_valid}`; the cookbook
  averages metrics as numbers, so the float is what it would have logged).

Serialisation: `encode_msgpack` / `decode_msgpack` and `encode_json` / `decode_json` round-trip
any record (or tuple of records) exactly. msgpack stores arrays as raw little-endian bytes;
JSON stores them as lists (float32 values survive the float64 text form exactly).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, cast

import msgspec
import numpy as np
from msgspec.structs import force_setattr
from numpy.typing import ArrayLike

__all__ = [
    "PARSE_ERROR_MASKED_METRIC_KEY",
    "STOP_METRIC_PREFIX",
    "InitialObservationOverflow",
    "Logs",
    "Metrics",
    "ModelInput",
    "RolloutError",
    "StepResult",
    "StopCondition",
    "StopReason",
    "TokenIds",
    "TokensWithLogprobs",
    "Trajectory",
    "TrajectoryGroup",
    "Transition",
    "as_model_input",
    "as_tokens_with_logprobs",
    "decode_json",
    "decode_msgpack",
    "encode_json",
    "encode_msgpack",
]

PARSE_ERROR_MASKED_METRIC_KEY = "parse_error_masked"
"""Transition metric that, when >= 1, excludes the transition's action tokens from training."""

Metrics = dict[str, float | int]
"""Numbers averaged into the training logs, by name (bools are stored as `1.0` / `0.0`)."""
Logs = dict[str, str | int | float]
"""Free-form diagnostics by name, not aggregated."""
StopCondition = tuple[str | int, ...]
"""Stop strings or stop token ids (all of one kind), as the sampler's `stop` parameter."""

STOP_METRIC_PREFIX = "stop/"
"""Metric-key prefix of the one-hot stop-reason metrics (`stop/<reason>`), as the cookbook's."""


class StopReason(enum.StrEnum):
    """Why a trajectory ended (the cookbook's `rl.types.StopReason`, same values).

    An env that knows why its episode ended records `metrics["stop/<reason>"] = 1.0` on the
    final transition; the rollout mirrors it onto `Trajectory.stop_reason`.
    """

    COMPLETED = "completed"
    """The agent finished on its own (e.g. answered without tool calls)."""
    TOOL_STOPPED = "tool_stopped"
    """A tool signalled that the episode should stop."""
    MAX_TURNS = "max_turns"
    """The turn cap was reached."""
    MAX_TOKENS = "max_tokens"
    """The token budget ran out (mid-turn truncation, between turns, or an oversized prompt)."""
    MAX_SAMPLED_TOKENS = "max_sampled_tokens"
    """The cumulative sampled-token (action-only) budget ran out."""
    MAX_TOOL_CALLS = "max_tool_calls"
    """The trajectory's tool-call budget ran out."""
    CONTEXT_OVERFLOW = "context_overflow"
    """The rendered conversation exceeded the trajectory token budget."""
    PARSE_ERROR = "parse_error"
    """The model output (or its tool calls) failed to parse."""
    ROLLOUT_TIMEOUT = "rollout_timeout"
    """The rollout exceeded its wall-clock budget."""


_INT32_MAX = np.iinfo(np.int32).max


class TokenIds(np.ndarray):
    """A read-only int32 token-id array that is truthy when non-empty, as a `list[int]` is.

    Token fields of the records (`ModelInput.tokens`, `TokensWithLogprobs.tokens`) are this
    view of a plain numpy array. The one thing it changes is `bool(tokens)`: numpy refuses it
    for more than one element ("truth value of an array is ambiguous"), while cookbook code
    written for `list[int]` tests it (`if response and response[-1] == eos: ...` in the
    cookbook's renderers, handed `transition.ac.tokens`). Everything else — indexing, slicing
    (which keeps the view), `len`, `tolist`, element-wise `==` — is numpy's.
    """

    def __bool__(self) -> bool:
        if self.ndim == 1:
            return len(self) > 0
        return bool(self.item())  # a 0-d array: its one value


def _frozen_array(values: Any, dtype: type, record: str, field: str) -> np.ndarray:
    """Copies `values` into a read-only 1-D array of `dtype`, refusing lossy conversions."""
    if isinstance(values, np.ndarray) and values.dtype == dtype and values.ndim == 1:
        out = values.copy()
    else:
        try:
            arr = np.asarray(values)
        except (TypeError, ValueError) as err:
            raise TypeError(f"{record}.{field}: cannot read as an array: {err}") from None
        if arr.ndim != 1:
            raise ValueError(f"{record}.{field}: expected a 1-D sequence, got shape {arr.shape}")
        if arr.size == 0:
            arr = arr.astype(dtype)
        if dtype is np.int32:
            if arr.dtype.kind == "b" or arr.dtype.kind not in "iu":
                raise TypeError(
                    f"{record}.{field}: token ids must be integers, got dtype {arr.dtype}"
                )
            if arr.size and int(arr.max()) > _INT32_MAX:
                raise ValueError(f"{record}.{field}: token id {int(arr.max())} exceeds int32")
            if arr.size and int(arr.min()) < 0:  # checked before the cast, which could wrap
                bad = int(np.argmax(arr < 0))
                raise ValueError(
                    f"{record}.{field}: negative token id {int(arr[bad])} at position {bad}"
                )
        elif arr.dtype.kind not in "fiu" or arr.dtype.kind == "b":
            raise TypeError(f"{record}.{field}: expected real numbers, got dtype {arr.dtype}")
        out = arr.astype(dtype, copy=True)
    if dtype is np.int32 and out.size and int(out.min()) < 0:
        bad = int(np.argmax(out < 0))
        raise ValueError(f"{record}.{field}: negative token id {int(out[bad])} at position {bad}")
    if dtype is np.float32 and not np.all(np.isfinite(out)):
        bad = int(np.argmax(~np.isfinite(out)))
        raise ValueError(f"{record}.{field}: non-finite value {out[bad]} at position {bad}")
    if dtype is np.float32 and field == "logprobs" and out.size and float(out.max()) > 0.0:
        bad = int(np.argmax(out > 0))
        raise ValueError(
            f"{record}.{field}: log-probability {out[bad]} > 0 at position {bad} (must be <= 0)"
        )
    if dtype is np.int32:
        out = out.view(TokenIds)
    out.flags.writeable = False
    return out


def _is_token_id(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and bool(value >= 0)


def _finite_float(value: Any, record: str, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{record}.{field}: expected a real number, got {type(value).__name__}")
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"{record}.{field}: non-finite value {out}")
    return out


def _tuple_of(values: Any, kind: type, record: str, field: str) -> tuple[Any, ...]:
    """`values` as a tuple, each item checked to be a `kind` (which may be abstract: `Mapping`)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{record}.{field}: expected a sequence of {kind.__name__}")
    out = tuple(values)
    for i, item in enumerate(out):
        if not isinstance(item, kind):
            raise TypeError(
                f"{record}.{field}[{i}]: expected {kind.__name__}, got {type(item).__name__}"
            )
    return out


def _plain_mapping(
    values: Any, record: str, field: str, kinds: tuple[type, ...], *, finite: bool
) -> dict[str, Any]:
    """A copy of a str-keyed mapping whose values are `kinds` (numpy scalars unwrapped).

    Bools (Python or numpy) become `1.0` / `0.0`, as the cookbook's averaging reads them.

    Its value type is whatever `kinds` admits (a runtime tuple), hence `Any`; the two callers
    below give the precise types.
    """
    if not isinstance(values, Mapping):
        raise TypeError(f"{record}.{field}: expected a mapping, got {type(values).__name__}")
    out = {}
    for key, value in values.items():
        if not isinstance(key, str):
            raise TypeError(f"{record}.{field}: key {key!r} is not a string")
        if isinstance(value, (bool, np.bool_)):
            value = 1.0 if value else 0.0  # documented in the module docstring
        elif isinstance(value, (np.integer, np.floating)):
            value = value.item()
        if not isinstance(value, kinds):
            names = [k.__name__ for k in kinds]
            expected = ", ".join(names[:-1]) + " or " + names[-1]
            raise TypeError(
                f"{record}.{field}[{key!r}]: expected {expected}, got {type(value).__name__}"
            )
        if finite and not math.isfinite(cast(float, value)):
            raise ValueError(f"{record}.{field}[{key!r}]: non-finite value {value}")
        out[key] = value
    return out


def _plain_metrics(values: Any, record: str, field: str) -> Metrics:
    return _plain_mapping(values, record, field, (int, float), finite=True)


def _plain_logs(values: Any, record: str, field: str) -> Logs:
    return _plain_mapping(values, record, field, (str, int, float), finite=False)


def _check_bool(value: Any, record: str, field: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{record}.{field}: expected bool, got {type(value).__name__}")
    return bool(value)


def _check_str(value: Any, record: str, field: str, *, optional: bool = False) -> None:
    if not (isinstance(value, str) or (optional and value is None)):
        expected = "str or None" if optional else "str"
        raise TypeError(f"{record}.{field}: expected {expected}, got {type(value).__name__}")


class ModelInput(msgspec.Struct, frozen=True, kw_only=True, eq=False):
    """A token sequence fed to the model (tinker's `ModelInput`, text chunks only).

    Attributes:
        tokens: int32 `[T]` token ids, read-only.
    """

    tokens: np.ndarray

    if TYPE_CHECKING:  # what construction accepts (`__post_init__` converts and validates)

        def __init__(self, *, tokens: ArrayLike) -> None: ...

    def __post_init__(self) -> None:
        force_setattr(self, "tokens", _frozen_array(self.tokens, np.int32, "ModelInput", "tokens"))

    @classmethod
    def from_ints(cls, tokens: Sequence[int] | np.ndarray) -> ModelInput:
        """Builds a model input from token ids.

        Examples:
            >>> ModelInput.from_ints([1, 2, 3]).length
            3
        """
        return cls(tokens=np.asarray(tokens))

    @classmethod
    def empty(cls) -> ModelInput:
        return cls(tokens=np.zeros(0, np.int32))

    @property
    def length(self) -> int:
        return int(self.tokens.shape[0])

    def to_ints(self) -> list[int]:
        ints: list[int] = self.tokens.tolist()  # an int32 array's `tolist` gives Python ints
        return ints

    def append(self, tokens: Sequence[int] | np.ndarray) -> ModelInput:
        """Returns a new model input with `tokens` appended."""
        extra = _frozen_array(tokens, np.int32, "ModelInput", "tokens")
        return ModelInput(tokens=np.concatenate([self.tokens, extra]))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ModelInput) and np.array_equal(self.tokens, other.tokens)

    __hash__ = None  # type: ignore[assignment]


_UNSET: Any = object()


class _TokensWithLogprobsMeta(type(msgspec.Struct)):  # type: ignore[misc]
    """Lets `TokensWithLogprobs(...)` take the cookbook's keyword `maybe_logprobs=`.

    msgspec generates a record's `__init__` from its fields, so the cookbook's name for the
    `logprobs` field is translated here, before that `__init__` runs. Decoding does not call
    the class and is unaffected.
    """

    def __call__(cls, *args: Any, maybe_logprobs: Any = _UNSET, **kwargs: Any) -> Any:
        if maybe_logprobs is not _UNSET:
            if "logprobs" in kwargs:
                raise TypeError(
                    "TokensWithLogprobs: give logprobs or maybe_logprobs (its cookbook name), "
                    "not both"
                )
            kwargs["logprobs"] = maybe_logprobs
        return super().__call__(*args, **kwargs)


class TokensWithLogprobs(
    msgspec.Struct, frozen=True, kw_only=True, eq=False, metaclass=_TokensWithLogprobsMeta
):
    """A sampled action: its tokens, their sampling logprobs and why sampling stopped.

    Built with `logprobs=` or, as the cookbook's `completers.TokensWithLogprobs`,
    `maybe_logprobs=`; `maybe_logprobs` also reads the field.

    Attributes:
        tokens: int32 `[T]` sampled token ids.
        logprobs: float32 `[T]` sampling logprob of each token (finite), or None when the
            sampler did not return them (then `trajectory_to_data` refuses the action).
        stop_reason: tinker's stop reason, `"stop"` (stop sequence / EOS) or `"length"`.
        sequence_id: optional sampler-side identifier of the sequence.
        prompt_cache_hit_tokens: prompt tokens the sampler billed as prefix-cache hits
            (the cookbook's field; >= 0).
    """

    tokens: np.ndarray
    logprobs: np.ndarray | None = None
    stop_reason: Literal["stop", "length"] = "stop"
    sequence_id: str | None = None
    prompt_cache_hit_tokens: int = 0

    if TYPE_CHECKING:

        def __init__(
            self,
            *,
            tokens: ArrayLike,
            logprobs: ArrayLike | None = None,
            maybe_logprobs: ArrayLike | None = None,
            stop_reason: Literal["stop", "length"] = "stop",
            sequence_id: str | None = None,
            prompt_cache_hit_tokens: int = 0,
        ) -> None: ...

    def __post_init__(self) -> None:
        tokens = _frozen_array(self.tokens, np.int32, "TokensWithLogprobs", "tokens")
        force_setattr(self, "tokens", tokens)
        if self.logprobs is not None:
            logprobs = _frozen_array(self.logprobs, np.float32, "TokensWithLogprobs", "logprobs")
            if logprobs.shape != tokens.shape:
                raise ValueError(
                    f"TokensWithLogprobs.logprobs: length {logprobs.shape[0]} != "
                    f"tokens length {tokens.shape[0]}"
                )
            force_setattr(self, "logprobs", logprobs)
        _check_str(self.sequence_id, "TokensWithLogprobs", "sequence_id", optional=True)
        if self.sequence_id == "":
            raise ValueError("TokensWithLogprobs.sequence_id: must be non-empty when given")
        if self.stop_reason not in ("stop", "length"):
            raise ValueError(
                f"TokensWithLogprobs.stop_reason: expected 'stop' or 'length', "
                f"got {self.stop_reason!r}"
            )
        hits = self.prompt_cache_hit_tokens
        if isinstance(hits, bool) or not isinstance(hits, (int, np.integer)):
            raise TypeError(
                "TokensWithLogprobs.prompt_cache_hit_tokens: expected int, "
                f"got {type(hits).__name__}"
            )
        if hits < 0:
            raise ValueError(f"TokensWithLogprobs.prompt_cache_hit_tokens: {hits} < 0")
        force_setattr(self, "prompt_cache_hit_tokens", int(hits))

    @property
    def maybe_logprobs(self) -> np.ndarray | None:
        """The cookbook's name for `logprobs`."""
        return self.logprobs

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, TokensWithLogprobs)
            and np.array_equal(self.tokens, other.tokens)
            and (
                (self.logprobs is None and other.logprobs is None)
                or (
                    self.logprobs is not None
                    and other.logprobs is not None
                    and np.array_equal(self.logprobs, other.logprobs)
                )
            )
            and self.stop_reason == other.stop_reason
            and self.sequence_id == other.sequence_id
            and self.prompt_cache_hit_tokens == other.prompt_cache_hit_tokens
        )

    __hash__ = None  # type: ignore[assignment]


class _TokenIdsLike(Protocol):
    """What `tinker.ModelInput` offers that `as_model_input` reads."""

    def to_ints(self) -> list[int]: ...


class _CookbookTokensWithLogprobs(Protocol):
    """What `tinker_cookbook.completers.TokensWithLogprobs` offers that conversion reads."""

    @property
    def tokens(self) -> Sequence[int]: ...

    @property
    def maybe_logprobs(self) -> Sequence[float] | None: ...


ModelInputLike = ModelInput | _TokenIdsLike | Sequence[int] | np.ndarray
"""What an observation field accepts (converted by `as_model_input`)."""

TokensWithLogprobsLike = TokensWithLogprobs | _CookbookTokensWithLogprobs
"""What `Transition.ac` accepts (converted by `as_tokens_with_logprobs`)."""

_SEQUENCE_KINDS = (list, tuple, np.ndarray)


def as_model_input(value: Any, *, record: str = "ModelInput", field: str = "tokens") -> ModelInput:
    """`value` as an rlpure `ModelInput`, converting what cookbook code passes for one.

    Accepts an rlpure `ModelInput` (returned as is), a `tinker.ModelInput` or any object whose
    `to_ints()` gives the token ids (text chunks only), or a list / tuple / 1-D array of token
    ids. `record` and `field` name the destination in error messages.

    Raises:
        ValueError: for a tinker `ModelInput` holding non-text (image) chunks, or ids that are
            negative or exceed int32.
        TypeError: for anything else (a string, a number, non-integer ids).

    Examples:
        >>> as_model_input([1, 2]).to_ints()
        [1, 2]
    """
    if isinstance(value, ModelInput):
        return value
    where = f"{record}.{field}"
    if isinstance(value, _SEQUENCE_KINDS):
        return ModelInput(tokens=_frozen_array(value, np.int32, record, field))
    to_ints = getattr(value, "to_ints", None)
    if callable(to_ints) and not isinstance(value, (str, bytes)):
        kinds = [str(getattr(chunk, "type", type(chunk).__name__)) for chunk in _chunks(value)]
        other = sorted({kind for kind in kinds if kind != "encoded_text"})
        if other:
            raise ValueError(
                f"{where}: a {type(value).__name__} with {', '.join(other)} chunks cannot be "
                "stored; rlpure records hold text token ids only"
            )
        try:
            ids = to_ints()
        except (TypeError, ValueError) as err:  # e.g. tinker's own refusal of non-text chunks
            first_line = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ValueError(
                f"{where}: {type(value).__name__}.to_ints() failed: {first_line}"
            ) from None
        return ModelInput(tokens=_frozen_array(ids, np.int32, record, field))
    raise TypeError(
        f"{where}: expected a ModelInput (rlpure or tinker) or a sequence of token ids, "
        f"got {type(value).__name__}"
    )


def _chunks(value: Any) -> list[Any]:
    chunks = getattr(value, "chunks", None)
    return list(chunks) if isinstance(chunks, Sequence) else []


def as_tokens_with_logprobs(
    value: Any, *, record: str = "TokensWithLogprobs", field: str = "value"
) -> TokensWithLogprobs:
    """`value` as an rlpure `TokensWithLogprobs`, converting the cookbook's completer record.

    Accepts an rlpure `TokensWithLogprobs` (returned as is) or any object with `tokens` and
    `maybe_logprobs` (`tinker_cookbook.completers.TokensWithLogprobs`), whose optional
    `stop_reason` (default `"stop"`), `sequence_id` (default None) and
    `prompt_cache_hit_tokens` (default 0) are kept.

    Raises:
        TypeError: for an object of neither kind; TypeError / ValueError naming `record.field`
            for invalid tokens or logprobs.
    """
    if isinstance(value, TokensWithLogprobs):
        return value
    if not (hasattr(value, "tokens") and hasattr(value, "maybe_logprobs")):
        raise TypeError(
            f"{record}.{field}: expected TokensWithLogprobs (rlpure or cookbook: tokens and "
            f"maybe_logprobs), got {type(value).__name__}"
        )
    try:
        return TokensWithLogprobs(
            tokens=value.tokens,
            logprobs=value.maybe_logprobs,
            stop_reason=getattr(value, "stop_reason", "stop"),
            sequence_id=getattr(value, "sequence_id", None),
            prompt_cache_hit_tokens=getattr(value, "prompt_cache_hit_tokens", 0),
        )
    except (TypeError, ValueError) as err:
        raise type(err)(f"{record}.{field}: {err}") from None


class InitialObservationOverflow(msgspec.Struct, frozen=True, kw_only=True):
    """Returned by `Env.initial_observation` instead of a pair when the prompt is already too long.

    The cookbook's sentinel: the rollout ends at once, gracefully (no sampling call), with one
    synthetic transition (empty observation and action, `episode_done=True`) carrying
    `reward`, `metrics` and `logs`; `Trajectory.stop_reason` is mirrored from the
    `stop/<reason>` metric (`StopReason.MAX_TOKENS` for a prompt overflow). Returning it rather
    than raising keeps one oversized prompt from failing its whole group under `FailFast`.

    Attributes:
        reward: reward of the synthetic final transition (finite).
        metrics: its metrics; should hold a one-hot `stop/<reason>` key.
        logs: diagnostics (e.g. the overflow's description).
    """

    reward: float
    metrics: Metrics = msgspec.field(default_factory=dict)
    logs: Logs = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        record = "InitialObservationOverflow"
        force_setattr(self, "reward", _finite_float(self.reward, record, "reward"))
        force_setattr(self, "metrics", _plain_metrics(self.metrics, record, "metrics"))
        force_setattr(self, "logs", _plain_logs(self.logs, record, "logs"))


class Transition(msgspec.Struct, frozen=True, kw_only=True):
    """One observation → action → reward step of an episode.

    Attributes:
        ob: what the policy saw before acting.
        ac: what it sampled.
        reward: immediate reward for this step (finite).
        episode_done: whether this step ended the episode.
        metrics: numbers averaged into the training logs (e.g. `format`, `correct`,
            `parse_error_masked`).
        logs: free-form diagnostics, not aggregated.
    """

    ob: ModelInput
    ac: TokensWithLogprobs
    reward: float
    episode_done: bool
    metrics: Metrics = msgspec.field(default_factory=dict)
    logs: Logs = msgspec.field(default_factory=dict)

    if TYPE_CHECKING:

        def __init__(
            self,
            *,
            ob: ModelInputLike,
            ac: TokensWithLogprobsLike,
            reward: float,
            episode_done: bool,
            metrics: Mapping[str, float | int | bool] = ...,
            logs: Mapping[str, str | int | float | bool] = ...,
        ) -> None: ...

    def __post_init__(self) -> None:
        force_setattr(self, "ob", as_model_input(self.ob, record="Transition", field="ob"))
        force_setattr(self, "ac", as_tokens_with_logprobs(self.ac, record="Transition", field="ac"))
        force_setattr(self, "reward", _finite_float(self.reward, "Transition", "reward"))
        force_setattr(
            self, "episode_done", _check_bool(self.episode_done, "Transition", "episode_done")
        )
        force_setattr(self, "metrics", _plain_metrics(self.metrics, "Transition", "metrics"))
        force_setattr(self, "logs", _plain_logs(self.logs, "Transition", "logs"))


class Trajectory(msgspec.Struct, frozen=True, kw_only=True):
    """A whole episode: its transitions, the observation after the last one, and why it ended."""

    transitions: tuple[Transition, ...]
    final_ob: ModelInput = msgspec.field(default_factory=ModelInput.empty)
    stop_reason: str | None = None

    if TYPE_CHECKING:

        def __init__(
            self,
            *,
            transitions: Sequence[Transition],
            final_ob: ModelInputLike = ...,
            stop_reason: str | None = None,
        ) -> None: ...

    def __post_init__(self) -> None:
        force_setattr(
            self,
            "transitions",
            _tuple_of(self.transitions, Transition, "Trajectory", "transitions"),
        )
        force_setattr(
            self, "final_ob", as_model_input(self.final_ob, record="Trajectory", field="final_ob")
        )
        _check_str(self.stop_reason, "Trajectory", "stop_reason", optional=True)
        if self.stop_reason is not None:  # a `StopReason` member is stored as its plain value
            force_setattr(self, "stop_reason", str(self.stop_reason))

    def total_step_reward(self) -> float:
        """Sum of the per-step rewards, left to right in float64 (as the cookbook sums)."""
        transitions = self.transitions
        if len(transitions) == 1:  # the common case; `sum` starts from int 0 too (-0.0 -> 0.0)
            return 0 + transitions[0].reward
        return sum(t.reward for t in transitions)


class RolloutError(msgspec.Struct, frozen=True, kw_only=True):
    """A rollout failure captured as data (exception class name and message)."""

    error_type: str
    error_message: str

    def __post_init__(self) -> None:
        _check_str(self.error_type, "RolloutError", "error_type")
        _check_str(self.error_message, "RolloutError", "error_message")


class TrajectoryGroup(msgspec.Struct, frozen=True, kw_only=True):
    """The trajectories of one group (same problem), with group-level rewards and metrics.

    Attributes:
        trajectories_G: one trajectory per env of the group.
        final_rewards_G: group-level reward of each trajectory (from `compute_group_rewards`).
        metrics_G: group-level metrics of each trajectory.
        rollout_errors: failures captured under tolerant rollout strategies.
    """

    trajectories_G: tuple[Trajectory, ...]
    final_rewards_G: tuple[float, ...]
    metrics_G: tuple[Metrics, ...]
    rollout_errors: tuple[RolloutError, ...] = ()

    if TYPE_CHECKING:

        def __init__(
            self,
            *,
            trajectories_G: Sequence[Trajectory],
            final_rewards_G: Sequence[float] | ArrayLike,
            metrics_G: Sequence[Mapping[str, float | int]],
            rollout_errors: Sequence[RolloutError] = (),
        ) -> None: ...

    def __post_init__(self) -> None:
        trajs = _tuple_of(self.trajectories_G, Trajectory, "TrajectoryGroup", "trajectories_G")
        if hasattr(self.final_rewards_G, "__array__") and not isinstance(
            self.final_rewards_G, Sequence
        ):
            final_rewards = np.asarray(self.final_rewards_G).tolist()  # numpy / jax arrays
        else:
            final_rewards = self.final_rewards_G
        rewards = tuple(
            _finite_float(r, "TrajectoryGroup", f"final_rewards_G[{i}]")
            for i, r in enumerate(
                _tuple_of(final_rewards, object, "TrajectoryGroup", "final_rewards_G")
            )
        )
        metrics = tuple(
            _plain_metrics(m, "TrajectoryGroup", f"metrics_G[{i}]")
            for i, m in enumerate(
                _tuple_of(self.metrics_G, Mapping, "TrajectoryGroup", "metrics_G")
            )
        )
        if not len(trajs) == len(rewards) == len(metrics):
            raise ValueError(
                f"TrajectoryGroup: trajectories_G has {len(trajs)} items, final_rewards_G "
                f"{len(rewards)}, metrics_G {len(metrics)}; they must be equal"
            )
        errors = _tuple_of(self.rollout_errors, RolloutError, "TrajectoryGroup", "rollout_errors")
        force_setattr(self, "trajectories_G", trajs)
        force_setattr(self, "final_rewards_G", rewards)
        force_setattr(self, "metrics_G", metrics)
        force_setattr(self, "rollout_errors", errors)

    def get_total_rewards(self) -> list[float]:
        """Sum of step rewards plus the final group reward, per trajectory (cookbook semantics)."""
        return [
            traj.total_step_reward() + final
            for traj, final in zip(self.trajectories_G, self.final_rewards_G, strict=True)
        ]


class StepResult(msgspec.Struct, frozen=True, kw_only=True):
    """What `Env.step` returns."""

    reward: float
    episode_done: bool
    next_observation: ModelInput
    next_stop_condition: StopCondition = ()
    metrics: Metrics = msgspec.field(default_factory=dict)
    logs: Logs = msgspec.field(default_factory=dict)

    if TYPE_CHECKING:

        def __init__(
            self,
            *,
            reward: float,
            episode_done: bool,
            next_observation: ModelInputLike,
            next_stop_condition: Sequence[str | int] = (),
            metrics: Mapping[str, float | int | bool] = ...,
            logs: Mapping[str, str | int | float | bool] = ...,
        ) -> None: ...

    def __post_init__(self) -> None:
        force_setattr(self, "reward", _finite_float(self.reward, "StepResult", "reward"))
        force_setattr(
            self, "episode_done", _check_bool(self.episode_done, "StepResult", "episode_done")
        )
        force_setattr(
            self,
            "next_observation",
            as_model_input(self.next_observation, record="StepResult", field="next_observation"),
        )
        if isinstance(self.next_stop_condition, (str, bytes)) or not isinstance(
            self.next_stop_condition, (Sequence, np.ndarray)
        ):
            raise TypeError(
                "StepResult.next_stop_condition: expected a list or tuple of stop strings or "
                f"token ids, got {type(self.next_stop_condition).__name__}"
            )
        stop = tuple(self.next_stop_condition)
        if not (all(isinstance(s, str) for s in stop) or all(_is_token_id(s) for s in stop)):
            raise TypeError(
                "StepResult.next_stop_condition: expected all strings or all non-negative "
                f"token ids, got {stop!r}"
            )
        force_setattr(
            self,
            "next_stop_condition",
            tuple(int(s) if not isinstance(s, str) else s for s in stop),
        )
        force_setattr(self, "metrics", _plain_metrics(self.metrics, "StepResult", "metrics"))
        force_setattr(self, "logs", _plain_logs(self.logs, "StepResult", "logs"))


# --- dataclass protocol ----------------------------------------------------------------------


def _dataclass_compatible(cls: type[msgspec.Struct]) -> None:
    """Gives a record the dataclass field table, so `dataclasses.replace`, `fields` and `asdict`
    work on it as on the cookbook's `@dataclass` records (cookbook code calls
    `dataclasses.replace(step_result, metrics=...)`). `replace` builds a new record through the
    constructor, so every check of `__post_init__` still runs."""
    table = {}
    for name in cls.__struct_fields__:
        entry: Any = dataclasses.field()
        entry.name, entry.type = name, cls.__annotations__.get(name, Any)
        entry._field_type = dataclasses._FIELD  # type: ignore[attr-defined]  # a plain field
        table[name] = entry
    cls.__dataclass_fields__ = table  # type: ignore[attr-defined]


for _cookbook_dataclass in (
    InitialObservationOverflow,
    StepResult,
    Transition,
    Trajectory,
    RolloutError,
    TrajectoryGroup,
    TokensWithLogprobs,
):
    _dataclass_compatible(_cookbook_dataclass)


# --- serialisation ---------------------------------------------------------------------------


def _msgpack_enc_hook(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return {"dtype": obj.dtype.str, "data": obj.tobytes()}
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def _json_enc_hook(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


_ALLOWED_WIRE_DTYPES = {"<i4", "<f4", "<i8", "<f8"}


def _dec_hook(kind: type, obj: Any) -> Any:
    if kind is np.ndarray:
        if isinstance(obj, dict):
            dtype = obj.get("dtype")
            data = obj.get("data")
            if dtype not in _ALLOWED_WIRE_DTYPES or not isinstance(data, (bytes, memoryview)):
                raise ValueError(f"array: unsupported wire form (dtype={dtype!r})")
            if len(data) % np.dtype(dtype).itemsize:
                raise ValueError(f"array: {len(data)} bytes is not a whole number of {dtype}")
            return np.frombuffer(data, dtype=dtype)
        if isinstance(obj, list):
            try:
                return np.asarray(obj)  # the record's __post_init__ checks the dtype and casts
            except (TypeError, ValueError) as err:
                raise ValueError(f"array: {err}") from None
        raise ValueError(f"array: expected a list or an encoded array, got {type(obj).__name__}")
    raise NotImplementedError(f"cannot decode {kind}")


_MSGPACK_ENCODER = msgspec.msgpack.Encoder(enc_hook=_msgpack_enc_hook)
_JSON_ENCODER = msgspec.json.Encoder(enc_hook=_json_enc_hook)

T = TypeVar("T")


def encode_msgpack(obj: Any) -> bytes:
    """Encodes a record (or a tuple/list of records) to msgpack bytes."""
    return _MSGPACK_ENCODER.encode(obj)


# Decoders are stateless and costly to build, so they are built once per target type (msgspec's
# advice); the cache holds nothing that depends on the data decoded.
@functools.lru_cache(maxsize=64)
def _msgpack_decoder(kind: Any) -> msgspec.msgpack.Decoder[Any]:
    return msgspec.msgpack.Decoder(kind, dec_hook=_dec_hook)


@functools.lru_cache(maxsize=64)
def _json_decoder(kind: Any) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(kind, dec_hook=_dec_hook)


# What msgspec raises, instead of a `ValidationError`, on untrusted input where `kind` leaves the
# structure open (`Any`, `list`, `dict` fields): nesting deeper than the interpreter's recursion
# limit, and strings that are not UTF-8. Both are faults of the data, reported as such.
_UNVALIDATED_ERRORS = (RecursionError, UnicodeDecodeError)


def _validation_error(err: RecursionError | UnicodeDecodeError) -> msgspec.ValidationError:
    if isinstance(err, RecursionError):
        return msgspec.ValidationError("input is nested too deeply")
    return msgspec.ValidationError(f"invalid UTF-8 in a string: {err.reason} at byte {err.start}")


def decode_msgpack(data: bytes, kind: type[T]) -> T:
    """Decodes msgpack `data` as `kind` (e.g. `tuple[TrajectoryGroup, ...]`), validating fully.

    Raises:
        msgspec.ValidationError: naming the path (`$.trajectories_G[0]...`) and the problem;
            also for input nested too deeply or holding strings that are not UTF-8.
    """
    try:
        decoded: T = _msgpack_decoder(cast(Hashable, kind)).decode(data)  # a decoder for `kind`
    except _UNVALIDATED_ERRORS as err:
        raise _validation_error(err) from None
    return decoded


def encode_json(obj: Any) -> bytes:
    """Encodes a record (or a tuple/list of records) to JSON bytes."""
    return _JSON_ENCODER.encode(obj)


def decode_json(data: bytes | str, kind: type[T]) -> T:
    """Decodes JSON `data` as `kind`, validating fully (see `decode_msgpack`)."""
    try:
        decoded: T = _json_decoder(cast(Hashable, kind)).decode(data)  # a decoder for `kind`
    except _UNVALIDATED_ERRORS as err:
        raise _validation_error(err) from None
    return decoded
