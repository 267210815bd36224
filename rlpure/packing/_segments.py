"""A trajectory → its datum segments: the cookbook's `trajectory_to_data` rules, copy-free.

Conventions:
- A trajectory's turns merge into one datum while each observation extends (has as prefix) the
  sequence so far, i.e. the previous observation plus the previous action; a non-prefix
  observation closes the datum and starts a new one.
- A *segment* describes one datum's full, unshifted sequence `s` as *pieces*: runs of tokens at
  an offset of `s`, each an observation (logprob, advantage and mask 0) or an action (its
  sampled logprobs; the trajectory's advantage and mask 1, or 0 and 0 when the transition's
  metrics carry `parse_error_masked >= 1`). Pieces hold the records' own read-only arrays (or
  slices of them): nothing is copied until `rlpure.packing.assemble_batch` writes the batch.
- Provenance: when every action of a datum has a sampler `sequence_id`, the datum carries spans
  tiling its shifted input and targets (tinker's `Prompt`/`SampledProvenanceSpan`), as
  cookbook 0.6.1 attaches them; otherwise None.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import msgspec
import numpy as np

from rlpure.records import PARSE_ERROR_MASKED_METRIC_KEY, Trajectory, Transition

__all__ = [
    "DatumProvenance",
    "Piece",
    "ProvenanceSpan",
    "Segment",
    "single_turn_segment",
    "trajectory_segments",
]


class ProvenanceSpan(msgspec.Struct, frozen=True, kw_only=True):
    """Where a run of a datum's tokens came from (tinker's `Prompt`/`SampledProvenanceSpan`).

    Attributes:
        kind: "prompt" (positions `[offset, offset + length)` of the prompt of the sampling
            request that produced `sequence_id`) or "sampled" (positions of that sequence's
            sampled tokens).
        sequence_id: the sampler's id of the sequence (`TokensWithLogprobs.sequence_id`).
        offset: first covered position.
        length: number of covered tokens.
    """

    kind: Literal["prompt", "sampled"]
    sequence_id: str
    offset: int
    length: int


DatumProvenance = tuple[tuple[ProvenanceSpan, ...], tuple[ProvenanceSpan, ...]]
"""Spans tiling a datum's `model_input` and its targets, in that order."""


class Piece(NamedTuple):
    """A run of a datum's full (unshifted) sequence, written as is into the batch.

    Observation pieces have `logprobs` None and `advantage` and `mask` 0.0.

    Attributes:
        offset: position of the run's first token in the full sequence.
        tokens: int32 `[n]` the run's tokens (a record's read-only array or a slice of it).
        logprobs: float32 `[n]` their sampling logprobs (an action's), or None (an observation).
        advantage: the advantage of every token of the run.
        mask: 1.0 when the run trains, else 0.0.
    """

    offset: int
    tokens: np.ndarray
    logprobs: np.ndarray | None
    advantage: float
    mask: float


class Segment(NamedTuple):
    """One datum, as the pieces that tile its full sequence `[0, full_length)` in order.

    Attributes:
        full_length: length of the full (unshifted) sequence, at least 2.
        pieces: the runs, in order.
        provenance: the spans tiling the datum's input and targets, or None.
    """

    full_length: int
    pieces: tuple[Piece, ...]
    provenance: DatumProvenance | None


# Pieces and segments are built once per turn of every trajectory in a batch (thousands per
# step), so they are made with `tuple.__new__`, skipping the Python-level `__new__` that
# NamedTuple generates: that call tripled `trajectory_segments`' time on a GRPO batch.
_new = tuple.__new__


def _extends(ob: np.ndarray, prev_ob: np.ndarray, prev_ac: np.ndarray) -> bool:
    """Whether `ob` starts with `prev_ob + prev_ac` (the sequence accumulated so far)."""
    n_ob, n_ac = prev_ob.shape[0], prev_ac.shape[0]
    if ob.shape[0] < n_ob + n_ac:
        return False
    return (
        ob[:n_ob].tobytes() == prev_ob.tobytes()
        and ob[n_ob : n_ob + n_ac].tobytes() == prev_ac.tobytes()
    )


def trajectory_segments(
    traj: Trajectory, advantage: float, *, where: str | tuple[int, int] = "trajectory"
) -> list[Segment]:
    """Splits a trajectory into datum segments, with the cookbook's `trajectory_to_data` rules.

    Turns merge into one datum while each observation extends (has as prefix) the sequence so
    far, i.e. the previous observation plus the previous action; a non-prefix observation closes
    the datum and starts a new one. Observation tokens get logprob 0, advantage 0, mask 0. Action
    tokens get their sampled logprobs, `advantage` and mask 1 -- or advantage 0 and mask 0 when the
    transition's metrics carry `parse_error_masked >= 1`. An empty trajectory yields no segment.

    Args:
        traj: the trajectory.
        advantage: the trajectory's scalar advantage (float32-representable).
        where: how error messages name this trajectory: a string, or `(p, g)` for
            `groups_P[p].trajectories_G[g]` (formatted only if an error is raised).

    Returns:
        A list of `Segment`s, one per datum, in order.

    Raises:
        ValueError: when an action has no logprobs, or a datum would hold fewer than 2 tokens
            (nothing to predict; the cookbook refuses the same case).
    """
    transitions = traj.transitions
    if len(transitions) == 1:  # the common single-turn case: no prefix bookkeeping
        segment = single_turn_segment(transitions[0], advantage, where)
        return [] if segment is None else [segment]
    segments: list[Segment] = []
    pieces: list[Piece] = []
    spans: list[ProvenanceSpan] | None = []
    full_length = 0
    prev_ob = prev_ac = None
    for k, transition in enumerate(transitions):
        ob = transition.ob.tokens
        ac = transition.ac
        if ac.logprobs is None:
            raise _missing_logprobs(where, k)
        start = 0
        if prev_ob is not None and prev_ac is not None and full_length:
            if _extends(ob, prev_ob, prev_ac):
                start = full_length
            else:
                segments.append(_close_segment(full_length, pieces, spans, where))
                pieces, spans, full_length = [], [], 0
        n_ob, n_ac = len(ob) - start, len(ac.tokens)
        sequence_id = ac.sequence_id
        if sequence_id is None and (n_ob or n_ac):
            spans = None  # a datum has provenance only if every action in it has an id
        if spans is not None and sequence_id is not None:
            spans.extend(_turn_spans(sequence_id, full_length, n_ob, n_ac))
        if n_ob:
            pieces.append(_new(Piece, (full_length, ob[start:] if start else ob, None, 0.0, 0.0)))
            full_length += n_ob
        if n_ac:
            pieces.append(_action_piece(transition, full_length, advantage))
            full_length += n_ac
        prev_ob, prev_ac = ob, ac.tokens
    if full_length:
        segments.append(_close_segment(full_length, pieces, spans, where))
    return segments


def single_turn_segment(
    transition: Transition, advantage: float, where: str | tuple[int, int]
) -> Segment | None:
    """The one segment of a one-transition trajectory (ob then ac), None when it is empty.

    `trajectory_segments` of such a trajectory, without the list: `assemble_batch` calls it
    directly for single-turn trajectories, the common case.
    """
    ob, ac = transition.ob.tokens, transition.ac
    if ac.logprobs is None:
        raise _missing_logprobs(where, 0)
    n_ob, n_ac = len(ob), len(ac.tokens)
    full_length = n_ob + n_ac
    pieces: tuple[Piece, ...]
    if n_ob and n_ac:
        pieces = (_new(Piece, (0, ob, None, 0.0, 0.0)), _action_piece(transition, n_ob, advantage))
    elif n_ob:
        pieces = (_new(Piece, (0, ob, None, 0.0, 0.0)),)
    elif n_ac:
        pieces = (_action_piece(transition, 0, advantage),)
    else:
        return None
    if full_length < 2:
        raise _too_short(where, full_length)
    sequence_id = ac.sequence_id
    provenance = (
        None if sequence_id is None else _datum_provenance(_turn_spans(sequence_id, 0, n_ob, n_ac))
    )
    return _new(Segment, (full_length, pieces, provenance))


def _action_piece(transition: Transition, offset: int, advantage: float) -> Piece:
    """The piece of a transition's action tokens: trained, or masked on a parse error."""
    ac = transition.ac
    if float(transition.metrics.get(PARSE_ERROR_MASKED_METRIC_KEY, 0.0)) >= 1.0:
        return _new(Piece, (offset, ac.tokens, ac.logprobs, 0.0, 0.0))
    return _new(Piece, (offset, ac.tokens, ac.logprobs, advantage, 1.0))


def _turn_spans(sequence_id: str, offset: int, n_ob: int, n_ac: int) -> list[ProvenanceSpan]:
    """Provenance of one turn: its new observation tokens end the request's prompt (which
    started at position `offset` of the datum); then the sampled tokens."""
    spans = []
    if n_ob:
        spans.append(
            ProvenanceSpan(kind="prompt", sequence_id=sequence_id, offset=offset, length=n_ob)
        )
    if n_ac:
        spans.append(ProvenanceSpan(kind="sampled", sequence_id=sequence_id, offset=0, length=n_ac))
    return spans


def _missing_logprobs(where: str | tuple[int, int], k: int) -> ValueError:
    return ValueError(
        f"{_name(where)}.transitions[{k}].ac.logprobs: is None; sampling logprobs are "
        "required to build training data"
    )


def _name(where: str | tuple[int, int]) -> str:
    return where if isinstance(where, str) else f"groups_P[{where[0]}].trajectories_G[{where[1]}]"


def _close_segment(
    full_length: int,
    pieces: list[Piece],
    spans: list[ProvenanceSpan] | None,
    where: str | tuple[int, int],
) -> Segment:
    if full_length < 2:
        raise _too_short(where, full_length)
    return _new(Segment, (full_length, tuple(pieces), _datum_provenance(spans)))


def _too_short(where: str | tuple[int, int], full_length: int) -> ValueError:
    return ValueError(
        f"{_name(where)}: a datum would hold {full_length} token; at least 2 are needed to form "
        "an input/target pair"
    )


def _datum_provenance(spans: list[ProvenanceSpan] | None) -> DatumProvenance | None:
    """The spans of the shifted input (last position dropped) and targets (first dropped).

    None, as in the cookbook, unless every action of the datum had a sequence id and at least
    one sampled token is a target.
    """
    if not spans:
        return None
    first, last = spans[0], spans[-1]
    targets = (
        spans[1:]
        if first.length == 1
        else [
            msgspec.structs.replace(first, offset=first.offset + 1, length=first.length - 1),
            *spans[1:],
        ]
    )
    if not any(span.kind == "sampled" for span in targets):
        return None
    inputs = (
        spans[:-1]
        if last.length == 1
        else [
            *spans[:-1],
            msgspec.structs.replace(last, length=last.length - 1),
        ]
    )
    return tuple(inputs), tuple(targets)
