"""The token records: `ModelInput` (what the model reads), `TokensWithLogprobs` (what it sampled).

Conventions: token ids are read-only `int32` `TokenIds`, logprobs read-only finite `float32`
`<= 0` of the same length; both records compare by value (`np.array_equal`) and are unhashable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import msgspec
import numpy as np
from msgspec.structs import force_setattr
from numpy.typing import ArrayLike

from rlpure.records._fields import _check_str, _frozen_array


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
