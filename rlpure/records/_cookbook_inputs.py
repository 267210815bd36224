"""What cookbook env code hands a record, converted to the stored (frozen) form.

Conventions:
- An observation (`Transition.ob`, `StepResult.next_observation`, `Trajectory.final_ob`) takes
  an rlpure `ModelInput`, a `tinker.ModelInput` (duck-typed: `to_ints()`, text chunks only;
  rlpure never imports tinker) or a list / tuple / 1-D array of token ids (`as_model_input`).
- An action (`Transition.ac`) takes an rlpure `TokensWithLogprobs` or the cookbook's
  (duck-typed: `tokens`, `maybe_logprobs`, optional `stop_reason` / `sequence_id`).
- The cookbook's keyword `TokensWithLogprobs(maybe_logprobs=...)` is translated by that
  record's metaclass (`rlpure.records._tokens`), which must exist before the class does.
- The cookbook-facing records carry the dataclass field table (`_dataclass_compatible`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

import msgspec
import numpy as np

from rlpure.records._fields import _frozen_array
from rlpure.records._tokens import ModelInput, TokensWithLogprobs


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
