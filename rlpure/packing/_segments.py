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

from typing import Literal

import msgspec
import numpy as np

from rlpure.records import PARSE_ERROR_MASKED_METRIC_KEY, Trajectory, Transition

__all__ = [
    "DatumProvenance",
    "Piece",
    "ProvenanceSpan",
    "Segment",
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


Piece = tuple[int, np.ndarray, np.ndarray | None, float, float]
"""A run of a datum's full (unshifted) sequence: `(offset, tokens, logprobs | None, advantage,
mask)`. Observation pieces have logprobs None and advantage and mask 0.0."""

Segment = tuple[int, tuple[Piece, ...], DatumProvenance | None]
"""One datum: `(full_length, pieces, provenance)`; the pieces tile `[0, full_length)` in order."""


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
        return _single_turn_segments(transitions[0], advantage, where)
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
        n_ob, n_ac = ob.shape[0] - start, ac.tokens.shape[0]
        sequence_id = ac.sequence_id
        if sequence_id is None and (n_ob or n_ac):
            spans = None  # a datum has provenance only if every action in it has an id
        if spans is not None and sequence_id is not None:
            spans.extend(_turn_spans(sequence_id, full_length, n_ob, n_ac))
        if n_ob:
            pieces.append((full_length, ob[start:] if start else ob, None, 0.0, 0.0))
            full_length += n_ob
        if n_ac:
            pieces.append(_action_piece(transition, full_length, advantage))
            full_length += n_ac
        prev_ob, prev_ac = ob, ac.tokens
    if full_length:
        segments.append(_close_segment(full_length, pieces, spans, where))
    return segments


def _single_turn_segments(
    transition: Transition, advantage: float, where: str | tuple[int, int]
) -> list[Segment]:
    """`trajectory_segments` of a one-transition trajectory: at most one datum, ob then ac."""
    ob, ac = transition.ob.tokens, transition.ac
    if ac.logprobs is None:
        raise _missing_logprobs(where, 0)
    n_ob, n_ac = ob.shape[0], ac.tokens.shape[0]
    if n_ob and n_ac:
        pieces: list[Piece] = [(0, ob, None, 0.0, 0.0), _action_piece(transition, n_ob, advantage)]
    elif n_ob:
        pieces = [(0, ob, None, 0.0, 0.0)]
    elif n_ac:
        pieces = [_action_piece(transition, 0, advantage)]
    else:
        return []
    sequence_id = ac.sequence_id
    spans = None if sequence_id is None else _turn_spans(sequence_id, 0, n_ob, n_ac)
    return [_close_segment(n_ob + n_ac, pieces, spans, where)]


def _action_piece(transition: Transition, offset: int, advantage: float) -> Piece:
    """The piece of a transition's action tokens: trained, or masked on a parse error."""
    ac = transition.ac
    if float(transition.metrics.get(PARSE_ERROR_MASKED_METRIC_KEY, 0.0)) >= 1.0:
        return (offset, ac.tokens, ac.logprobs, 0.0, 0.0)
    return (offset, ac.tokens, ac.logprobs, advantage, 1.0)


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
        raise ValueError(
            f"{_name(where)}: a datum would hold {full_length} token; at least 2 are needed to form "
            "an input/target pair"
        )
    return (full_length, tuple(pieces), _datum_provenance(spans))


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
