"""Slow, obviously-correct references of the cookbook's RL data processing, in plain Python.

These follow tinker-cookbook's `rl/data_processing.py` (`compute_advantages`,
`trajectory_to_data`, `assemble_training_data`) step by step, on Python lists, with an explicit
accumulator, so that the vectorised functions can be checked against them (differential tests)
and timed against them (`benchmarks/bench_assembly.py`). Nothing here is fast on purpose.

Conventions: a reference datum is a dict of lists, already shifted like a `tinker.Datum`:
`model_input` = full sequence minus its last token; `target_tokens`, `logprobs`, `advantages`,
`mask` = the full-sequence lists minus their first element; plus `group_idx` and `traj_idx`, and
`provenance`: None or `(input_runs, target_runs)` of `(kind, sequence_id, offset, length)`,
computed token by token (every token labelled, then consecutive labels merged) rather than
run by run as the vectorised code does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rlpure.records import PARSE_ERROR_MASKED_METRIC_KEY, Trajectory, TrajectoryGroup

__all__ = [
    "reference_assemble_training_data",
    "reference_group_centered_advantages",
    "reference_trajectory_to_data",
]


def reference_group_centered_advantages(groups_P: Sequence[TrajectoryGroup]) -> list[list[float]]:
    """A = R − mean(R) per group in float32, as `torch.tensor(rewards).mean()` computes it.

    The total reward is summed in Python floats (float64) left to right, then rounded to float32;
    the mean is the float32 sum (left to right; exact whenever the rewards are small integers)
    divided by the group size.
    """
    out = []
    for group in groups_P:
        rewards_G = [np.float32(r) for r in group.get_total_rewards()]
        total = np.float32(0.0)
        for r in rewards_G:
            total = np.float32(total + r)
        mean = np.float32(total / np.float32(len(rewards_G))) if rewards_G else np.float32(0.0)
        out.append([float(np.float32(r - mean)) for r in rewards_G])
    return out


def _runs(per_token: list[tuple[str, str, int]]) -> tuple[tuple[str, str, int, int], ...]:
    """Merges per-token (kind, sequence_id, position) into (kind, sequence_id, offset, length)."""
    runs: list[list[Any]] = []
    for kind, sequence_id, position in per_token:
        last = runs[-1] if runs else None
        if last and (last[0], last[1]) == (kind, sequence_id) and last[2] + last[3] == position:
            last[3] += 1
        else:
            runs.append([kind, sequence_id, position, 1])
    return tuple((k, q, o, n) for k, q, o, n in runs)


def _as_list(values: Any) -> list[Any]:
    """Lists pass through (cookbook-style records hold lists); arrays become lists."""
    return values if isinstance(values, list) else values.tolist()


def reference_trajectory_to_data(traj: Trajectory, advantage: float) -> list[dict[str, Any]]:
    """The cookbook's `trajectory_to_data`, on lists: one dict per datum (see module docstring).

    `traj` may be an `rlpure` trajectory or any object of the same shape whose token and
    logprob fields are Python lists (as the cookbook's records hold them).
    """
    data: list[dict[str, Any]] = []
    full_sequence: list[int] = []
    sampled_logprobs: list[float] = []
    advantages: list[float] = []
    mask: list[float] = []
    # (kind, sequence_id, offset, length) runs, one per token, while every action has an id.
    spans: list[tuple[str, str, int]] | None = []

    def make_datum() -> dict[str, Any]:
        if len(full_sequence) < 2:
            raise ValueError("need at least 2 tokens for input/target split")
        datum = {
            "model_input": full_sequence[:-1],
            "target_tokens": full_sequence[1:],
            "logprobs": sampled_logprobs[1:],
            "advantages": advantages[1:],
            "mask": mask[1:],
            "provenance": None,
        }
        if spans:
            per_token = spans
            targets = per_token[1:]
            if any(kind == "sampled" for kind, _, _ in targets):
                datum["provenance"] = (
                    _runs(per_token[:-1]),
                    _runs(targets),
                )
        return datum

    for transition in traj.transitions:
        ob = _as_list(transition.ob.tokens)
        ac_tokens = _as_list(transition.ac.tokens)
        if transition.ac.logprobs is None:
            raise ValueError("logprobs are required")
        ac_logprobs = _as_list(transition.ac.logprobs)
        if not full_sequence:
            delta_ob = ob
        elif len(full_sequence) <= len(ob) and ob[: len(full_sequence)] == full_sequence:
            delta_ob = ob[len(full_sequence) :]
        else:
            data.append(make_datum())
            full_sequence, sampled_logprobs, advantages, mask, spans = [], [], [], [], []
            delta_ob = ob
        sequence_id = transition.ac.sequence_id
        if sequence_id is None and (delta_ob or ac_tokens):
            spans = None
        if spans is not None and sequence_id is not None:
            prompt_start = len(full_sequence)
            spans.extend(("prompt", sequence_id, prompt_start + i) for i in range(len(delta_ob)))
            spans.extend(("sampled", sequence_id, i) for i in range(len(ac_tokens)))
        masked = float(transition.metrics.get(PARSE_ERROR_MASKED_METRIC_KEY, 0.0)) >= 1.0
        full_sequence.extend(delta_ob)
        full_sequence.extend(ac_tokens)
        sampled_logprobs.extend([0.0] * len(delta_ob) + ac_logprobs)
        advantages.extend([0.0] * len(delta_ob) + [0.0 if masked else advantage] * len(ac_tokens))
        mask.extend([0.0] * len(delta_ob) + [0.0 if masked else 1.0] * len(ac_tokens))
    if full_sequence:
        data.append(make_datum())
    return data


def reference_assemble_training_data(
    groups_P: Sequence[TrajectoryGroup], advantages_P: Sequence[Sequence[float]]
) -> list[dict[str, Any]]:
    """The cookbook's `assemble_training_data`: datums in group, trajectory, segment order."""
    out = []
    for p, (group, advantages_G) in enumerate(zip(groups_P, advantages_P, strict=True)):
        for g, (traj, adv) in enumerate(zip(group.trajectories_G, advantages_G, strict=True)):
            for datum in reference_trajectory_to_data(traj, float(adv)):
                out.append({**datum, "group_idx": p, "traj_idx": g})
    return out
