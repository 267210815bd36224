"""Hypothesis strategies that build valid `rlpure.records` objects, for property tests.

Use them to property-test your own reward, advantage and datum code::

    from hypothesis import given
    from rlpure.testing import batches

    @given(batches(reward_kind="binary"))
    def test_my_advantages(groups_P): ...

Conventions and guarantees (all strategies, unless a docstring says otherwise):
- Tokens are int32 ids in `[0, vocab_size)`; logprobs are finite float32 values in
  `[min_logprob, 0]`, about a fifth exactly 0.0, the rest normal (no subnormals); every action
  carries logprobs (`TokensWithLogprobs.logprobs` is never None), as the cookbook's
  `trajectory_to_data` requires. Lengths, rewards, metrics and the turn structure are drawn by
  hypothesis (and shrink); token ids and logprob values come from a numpy generator seeded by a
  drawn integer (two draws per array instead of one per element: ~10x faster generation).
- Sizes are small by default (≤ 12 new tokens per observation or action, ≤ 4 turns, ≤ 4
  trajectories per group, ≤ 6 groups); every bound is a keyword argument.
- Rewards: `reward_kind="binary"` draws every step reward and every final group reward from
  {0.0, 1.0}, so a trajectory's total reward is a small integer and every float32 sum of totals
  is exact. `reward_kind="float"` draws float32-representable normal values in
  `[-reward_bound, reward_bound]` (0.0 included), whose sums round.
- Multi-turn trajectories (`trajectories`) follow one of three observation patterns, see
  `PrefixMode`. Half the breaks are near misses (the sequence so far with one token changed,
  anywhere, or cut short), the hard case for a prefix check. A "break" (a non-extending
  observation) is a *true* break: the new observation
  never has the tokens so far as a prefix, so the cookbook starts a new datum there.
- The datum guarantee: with the default `min_ob_tokens=2`, every datum the cookbook's
  `trajectory_to_data` builds from a generated trajectory has at least 2 tokens (the cookbook
  raises on shorter ones). Why: a datum starts at the first turn or at a break, and its first
  observation is then taken whole (≥ 2 tokens); later turns only add tokens. Passing
  `min_ob_tokens` < 2 lifts the guarantee (a 1-token observation with an empty action makes a
  1-token datum; an empty first observation is merged with what follows).
- The last transition of a trajectory has `episode_done=True`, all others False.
- With `masked_turns=True` some transitions carry the metric `parse_error_masked` = 1.0 (masked)
  or 0.0 (explicitly not masked); with `masked_turns=False` the metric never appears.

This module imports `hypothesis`; it is a test utility and is not imported by the rest of
`rlpure`. Nothing here has side effects beyond drawing from hypothesis. Each public function
builds its sub-strategies once, when called, so drawing stays cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from hypothesis import strategies as st

from rlpure.records import (
    PARSE_ERROR_MASKED_METRIC_KEY,
    Metrics,
    ModelInput,
    RolloutError,
    TokensWithLogprobs,
    Trajectory,
    TrajectoryGroup,
    Transition,
)

__all__ = [
    "DEFAULT_MAX_GROUPS",
    "DEFAULT_MAX_GROUP_SIZE",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_MAX_TURNS",
    "DEFAULT_VOCAB_SIZE",
    "PrefixMode",
    "RewardKind",
    "batches",
    "model_inputs",
    "ragged_rewards",
    "rewards",
    "token_ids",
    "tokens_with_logprobs",
    "trajectories",
    "trajectory_groups",
    "transitions",
]

PrefixMode = Literal["always", "never", "mixed"]
"""How each observation after the first relates to the sequence so far.

- `"always"`: extends it (previous observation + previous action + 0..`max_ob_tokens` new
  tokens), so the cookbook merges the whole trajectory into ONE datum.
- `"never"`: a fresh sequence that does not extend it, so every transition is its own datum.
- `"mixed"`: each turn independently extends or breaks.
"""

RewardKind = Literal["binary", "float"]
"""`"binary"`: rewards in {0.0, 1.0}. `"float"`: float32-representable values, see `rewards`."""

DEFAULT_VOCAB_SIZE = 1000
"""Token ids are drawn from `[0, DEFAULT_VOCAB_SIZE)` unless `vocab_size` says otherwise."""
DEFAULT_MAX_TOKENS = 12
"""Most new tokens per observation or action."""
DEFAULT_MAX_TURNS = 4
"""Most transitions per trajectory."""
DEFAULT_MAX_GROUP_SIZE = 4
"""Most trajectories per group."""
DEFAULT_MAX_GROUPS = 6
"""Most groups per batch."""
_DEFAULT_MIN_LOGPROB = -20.0
_DEFAULT_REWARD_BOUND = 100.0
_SEEDS = st.integers(0, 2**32 - 1)
_STOP_REASONS: st.SearchStrategy[Literal["stop", "length"]] = st.sampled_from(("stop", "length"))
_SEQUENCE_IDS = st.sampled_from((None, None, "seq-0", "ß-é-1"))
_FORMAT_METRIC = st.sampled_from((None, 0, 1))
_MASK_METRIC = st.sampled_from((None, None, 0.0, 1.0, 0.5, 2.0))
_BINARY = st.sampled_from((0.0, 1.0))


def _check_sizes(name: str, min_size: int, max_size: int) -> None:
    if min_size < 0 or max_size < min_size:
        raise ValueError(f"{name}: need 0 <= min <= max, got min {min_size}, max {max_size}")


def rewards(
    *, reward_kind: RewardKind = "binary", reward_bound: float = _DEFAULT_REWARD_BOUND
) -> st.SearchStrategy[float]:
    """One reward: {0.0, 1.0} for "binary"; a normal float32-representable value for "float".

    "float" rewards lie in `[-reward_bound, reward_bound]` and include 0.0 and integers; they are
    float32 values so that the float64 → float32 cast of a single reward is exact, while sums of
    several of them generally round (which is what the float tests are for).
    """
    if reward_kind == "binary":
        return _BINARY
    if reward_kind == "float":
        return st.floats(
            min_value=-reward_bound,
            max_value=reward_bound,
            allow_nan=False,
            allow_infinity=False,
            allow_subnormal=False,
            width=32,
        ).map(float)
    raise ValueError(f"rewards: reward_kind must be 'binary' or 'float', got {reward_kind!r}")


@dataclass(frozen=True)
class _Spec:
    """Resolved options of the trajectory-level strategies, with sub-strategies built once."""

    vocab_size: int
    min_logprob: float
    ob_size: st.SearchStrategy[int]
    new_ob_size: st.SearchStrategy[int]
    ac_size: st.SearchStrategy[int]
    turns: st.SearchStrategy[int]
    prefix: PrefixMode
    masked_turns: bool
    reward: st.SearchStrategy[float]


def _spec(
    *,
    min_turns: int = 1,
    max_turns: int = DEFAULT_MAX_TURNS,
    prefix: PrefixMode = "mixed",
    masked_turns: bool = True,
    min_ob_tokens: int = 2,
    max_ob_tokens: int = DEFAULT_MAX_TOKENS,
    min_ac_tokens: int = 0,
    max_ac_tokens: int = DEFAULT_MAX_TOKENS,
    reward_kind: RewardKind = "binary",
    reward_bound: float = _DEFAULT_REWARD_BOUND,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    min_logprob: float = _DEFAULT_MIN_LOGPROB,
) -> _Spec:
    if min_turns < 1:
        raise ValueError(f"trajectories: min_turns must be >= 1, got {min_turns}")
    _check_sizes("trajectories: turns", min_turns, max_turns)
    _check_sizes("trajectories: observation tokens", min_ob_tokens, max_ob_tokens)
    _check_sizes("trajectories: action tokens", min_ac_tokens, max_ac_tokens)
    if prefix not in ("always", "never", "mixed"):
        raise ValueError(f"trajectories: prefix must be always/never/mixed, got {prefix!r}")
    if vocab_size < 2:
        raise ValueError(f"trajectories: vocab_size must be >= 2, got {vocab_size}")
    if not (min_logprob < 0 and np.isfinite(min_logprob)):
        raise ValueError(f"trajectories: min_logprob must be finite and < 0, got {min_logprob}")
    return _Spec(
        vocab_size=vocab_size,
        min_logprob=min_logprob,
        ob_size=st.integers(min_ob_tokens, max_ob_tokens),
        new_ob_size=st.integers(0, max_ob_tokens),
        ac_size=st.integers(min_ac_tokens, max_ac_tokens),
        turns=st.integers(min_turns, max_turns),
        prefix=prefix,
        masked_turns=masked_turns,
        reward=rewards(reward_kind=reward_kind, reward_bound=reward_bound),
    )


def _draw_tokens(draw: st.DrawFn, size: st.SearchStrategy[int], vocab_size: int) -> np.ndarray:
    num = draw(size)
    rng = np.random.default_rng(draw(_SEEDS))
    return rng.integers(0, vocab_size, size=num, dtype=np.int32)


def _draw_action(draw: st.DrawFn, spec: _Spec) -> TokensWithLogprobs:
    tokens_T = _draw_tokens(draw, spec.ac_size, spec.vocab_size)
    rng = np.random.default_rng(draw(_SEEDS))
    logprobs_T = (-rng.uniform(0.0, -spec.min_logprob, size=tokens_T.size)).astype(np.float32)
    logprobs_T[rng.random(tokens_T.size) < 0.2] = 0.0  # certain tokens (logprob 0) occur too
    logprobs_T[np.abs(logprobs_T) < np.finfo(np.float32).tiny] = 0.0  # no subnormals
    return TokensWithLogprobs(
        tokens=tokens_T,
        logprobs=logprobs_T,
        stop_reason=draw(_STOP_REASONS),
        sequence_id=draw(_SEQUENCE_IDS),
    )


def _draw_metrics(draw: st.DrawFn, spec: _Spec) -> Metrics:
    metrics: Metrics = {}
    fmt = draw(_FORMAT_METRIC)
    if fmt is not None:
        metrics["format"] = fmt
    if spec.masked_turns:
        flag = draw(_MASK_METRIC)
        if flag is not None:
            metrics[PARSE_ERROR_MASKED_METRIC_KEY] = flag
    return metrics


def _draw_transition(
    draw: st.DrawFn, spec: _Spec, ob_T: np.ndarray, episode_done: bool
) -> Transition:
    return Transition(
        ob=ModelInput(tokens=ob_T),
        ac=_draw_action(draw, spec),
        reward=draw(spec.reward),
        episode_done=episode_done,
        metrics=_draw_metrics(draw, spec),
    )


def _is_prefix(prefix_T: np.ndarray, seq_T: np.ndarray) -> bool:
    n = prefix_T.shape[0]
    return n <= seq_T.shape[0] and bool(np.array_equal(seq_T[:n], prefix_T))


def _draw_near_miss(draw: st.DrawFn, spec: _Spec, sequence_T: np.ndarray) -> np.ndarray:
    """A break that almost extends `sequence_T`: the hard case for a prefix check.

    Either the sequence so far with ONE token changed (at any position, the last action token
    included) followed by new tokens, or the sequence cut short (e.g. the previous observation
    without its action). Never a true extension.
    """
    if draw(st.booleans()):
        ob_T = np.concatenate([sequence_T, _draw_tokens(draw, spec.new_ob_size, spec.vocab_size)])
        last = sequence_T.shape[0] - 1
        # The ends are where off-by-one prefix checks fail: pick them often.
        i = draw(st.one_of(st.just(0), st.just(last), st.integers(0, last)))
        ob_T[i] = (int(ob_T[i]) + 1) % spec.vocab_size
        return ob_T
    if sequence_T.shape[0] < 3:
        ob_T = sequence_T.copy()
        ob_T[-1] = (int(ob_T[-1]) + 1) % spec.vocab_size
        return ob_T
    # At least 2 tokens, so the datum this break opens keeps the >= 2 token guarantee.
    return sequence_T[: draw(st.integers(2, sequence_T.shape[0] - 1))].copy()


def _draw_trajectory(draw: st.DrawFn, spec: _Spec) -> Trajectory:
    num_turns = draw(spec.turns)
    steps: list[Transition] = []
    sequence_T = np.zeros(0, np.int32)  # the cookbook's accumulated sequence of the open datum
    for turn in range(num_turns):
        if turn == 0 or spec.prefix == "never":
            extend = False
        elif spec.prefix == "always":
            extend = True
        else:
            extend = draw(st.booleans())
        if extend:
            ob_T = np.concatenate(
                [sequence_T, _draw_tokens(draw, spec.new_ob_size, spec.vocab_size)]
            )
        elif turn > 0 and sequence_T.size >= 2 and draw(st.booleans()):
            ob_T = _draw_near_miss(draw, spec, sequence_T)
        else:
            ob_T = _draw_tokens(draw, spec.ob_size, spec.vocab_size)
            if turn > 0 and sequence_T.size and _is_prefix(sequence_T, ob_T):
                ob_T[0] = (int(sequence_T[0]) + 1) % spec.vocab_size  # force a true break
        step = _draw_transition(draw, spec, ob_T, episode_done=turn == num_turns - 1)
        steps.append(step)
        # Extending: ob_T already starts with the old sequence. Breaking: a new datum opens.
        sequence_T = np.concatenate([ob_T, step.ac.tokens])
    final_ob = ModelInput(tokens=sequence_T) if draw(st.booleans()) else ModelInput.empty()
    return Trajectory(transitions=tuple(steps), final_ob=final_ob)


def _draw_group(
    draw: st.DrawFn, spec: _Spec, size: st.SearchStrategy[int], with_rollout_errors: bool
) -> TrajectoryGroup:
    num = draw(size)
    trajs_G = tuple(_draw_trajectory(draw, spec) for _ in range(num))
    final_rewards_G = tuple(draw(spec.reward) for _ in range(num))
    metrics_G: tuple[Metrics, ...] = tuple({"correct": draw(_BINARY)} for _ in range(num))
    errors: tuple[RolloutError, ...] = ()
    if with_rollout_errors and draw(st.booleans()):
        errors = (RolloutError(error_type="TimeoutError", error_message="sampler timed out"),)
    return TrajectoryGroup(
        trajectories_G=trajs_G,
        final_rewards_G=final_rewards_G,
        metrics_G=metrics_G,
        rollout_errors=errors,
    )


# --- public strategies -------------------------------------------------------------------------


def token_ids(
    *,
    min_size: int = 0,
    max_size: int = DEFAULT_MAX_TOKENS,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
) -> st.SearchStrategy[np.ndarray]:
    """Fresh (writable) int32 `[T]` arrays of `min_size..max_size` token ids in `[0, vocab_size)`."""
    _check_sizes("token_ids", min_size, max_size)
    if vocab_size < 2:
        raise ValueError(f"token_ids: vocab_size must be >= 2, got {vocab_size}")
    size = st.integers(min_size, max_size)

    @st.composite
    def strategy(draw: st.DrawFn) -> np.ndarray:
        return _draw_tokens(draw, size, vocab_size)

    return strategy()


def model_inputs(
    *,
    min_size: int = 0,
    max_size: int = DEFAULT_MAX_TOKENS,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
) -> st.SearchStrategy[ModelInput]:
    """`ModelInput`s of `min_size..max_size` tokens (ids in `[0, vocab_size)`)."""
    return token_ids(min_size=min_size, max_size=max_size, vocab_size=vocab_size).map(
        lambda tokens_T: ModelInput(tokens=tokens_T)
    )


def tokens_with_logprobs(
    min_size: int = 0,
    max_size: int = DEFAULT_MAX_TOKENS,
    *,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    min_logprob: float = _DEFAULT_MIN_LOGPROB,
) -> st.SearchStrategy[TokensWithLogprobs]:
    """Sampled actions: int32 tokens with finite float32 logprobs in `[min_logprob, 0]`.

    `stop_reason` is "stop" or "length"; `sequence_id` is None or a short string. Logprobs are
    always present, about a fifth exactly 0.0, the rest normal float32 numbers (no subnormals,
    no NaN/inf).

    Args:
        min_size: fewest tokens (0 gives empty actions).
        max_size: most tokens.
        vocab_size: ids are drawn from `[0, vocab_size)`.
        min_logprob: lower bound of the logprobs (negative, finite).
    """
    spec = _spec(
        min_ac_tokens=min_size,
        max_ac_tokens=max_size,
        vocab_size=vocab_size,
        min_logprob=min_logprob,
    )

    @st.composite
    def strategy(draw: st.DrawFn) -> TokensWithLogprobs:
        return _draw_action(draw, spec)

    return strategy()


def transitions(
    *,
    ob: ModelInput | None = None,
    episode_done: bool | None = None,
    **options: Any,
) -> st.SearchStrategy[Transition]:
    """Single `Transition`s: observation, action (possibly empty), reward, metrics.

    Args:
        ob: the observation to use; drawn (`min_ob_tokens..max_ob_tokens` tokens) when None.
        episode_done: a fixed value, or drawn when None.
        **options: as for `trajectories` (`min_ob_tokens`, `max_ob_tokens`, `min_ac_tokens`,
            `max_ac_tokens`, `masked_turns`, `reward_kind`, `reward_bound`, `vocab_size`,
            `min_logprob`).
    """
    spec = _spec(**options)

    @st.composite
    def strategy(draw: st.DrawFn) -> Transition:
        ob_T = _draw_tokens(draw, spec.ob_size, spec.vocab_size) if ob is None else ob.tokens.copy()
        done = draw(st.booleans()) if episode_done is None else episode_done
        return _draw_transition(draw, spec, ob_T, episode_done=done)

    return strategy()


def trajectories(
    *,
    min_turns: int = 1,
    max_turns: int = DEFAULT_MAX_TURNS,
    prefix: PrefixMode = "mixed",
    masked_turns: bool = True,
    min_ob_tokens: int = 2,
    max_ob_tokens: int = DEFAULT_MAX_TOKENS,
    min_ac_tokens: int = 0,
    max_ac_tokens: int = DEFAULT_MAX_TOKENS,
    reward_kind: RewardKind = "binary",
    reward_bound: float = _DEFAULT_REWARD_BOUND,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    min_logprob: float = _DEFAULT_MIN_LOGPROB,
) -> st.SearchStrategy[Trajectory]:
    """Multi-turn `Trajectory`s with and without the prefix property.

    Turn 1 draws an observation of `min_ob_tokens..max_ob_tokens` tokens. Each later turn's
    observation either extends the sequence so far (previous observation + previous action +
    `0..max_ob_tokens` new tokens) or is a fresh `min_ob_tokens..max_ob_tokens`-token sequence that
    does not extend it (its first token is changed if the draw happened to extend it), as chosen
    by `prefix` (see `PrefixMode`). Actions may be empty (`min_ac_tokens=0`). The last transition
    has `episode_done=True`, the others False. `final_ob` is empty or the final sequence (last
    observation + last action). `stop_reason` is None.

    Guarantees (see the module docstring): every cookbook datum has ≥ 2 tokens when
    `min_ob_tokens >= 2`; with `min_ob_tokens >= 1`, `prefix="always"` gives exactly one datum
    per trajectory and `prefix="never"` exactly one per transition.

    Args:
        min_turns: fewest transitions (≥ 1).
        max_turns: most transitions.
        prefix: "always", "never" or "mixed".
        masked_turns: whether transitions may carry `parse_error_masked` = 1.0 (or 0.0).
        min_ob_tokens: fewest tokens of a first or fresh observation.
        max_ob_tokens: most tokens of a first or fresh observation, and most new tokens an
            extending observation adds.
        min_ac_tokens: fewest action tokens.
        max_ac_tokens: most action tokens.
        reward_kind: "binary" (0/1) or "float" step rewards, see `rewards`.
        reward_bound: magnitude bound of "float" rewards.
        vocab_size: ids are drawn from `[0, vocab_size)`.
        min_logprob: lower bound of the sampled logprobs.
    """
    spec = _spec(
        min_turns=min_turns,
        max_turns=max_turns,
        prefix=prefix,
        masked_turns=masked_turns,
        min_ob_tokens=min_ob_tokens,
        max_ob_tokens=max_ob_tokens,
        min_ac_tokens=min_ac_tokens,
        max_ac_tokens=max_ac_tokens,
        reward_kind=reward_kind,
        reward_bound=reward_bound,
        vocab_size=vocab_size,
        min_logprob=min_logprob,
    )

    @st.composite
    def strategy(draw: st.DrawFn) -> Trajectory:
        return _draw_trajectory(draw, spec)

    return strategy()


def trajectory_groups(
    *,
    min_group_size: int = 1,
    max_group_size: int = DEFAULT_MAX_GROUP_SIZE,
    with_rollout_errors: bool = False,
    **trajectory_options: Any,
) -> st.SearchStrategy[TrajectoryGroup]:
    """`TrajectoryGroup`s of `min_group_size..max_group_size` trajectories (group of one included).

    `final_rewards_G` are drawn like step rewards (`reward_kind`), so with "binary" every total
    `get_total_rewards()[g]` (sum of step rewards + final reward) is a small integer and group
    sums are exact in float32. `metrics_G` holds a 0/1 `correct` metric per trajectory.
    Constant-reward groups occur naturally.

    Args:
        min_group_size: fewest trajectories (0 allowed: an empty group).
        max_group_size: most trajectories.
        with_rollout_errors: sometimes attach a `RolloutError` (it carries no maths).
        **trajectory_options: as for `trajectories` (`max_turns`, `prefix`, `masked_turns`,
            `reward_kind`, ...).
    """
    _check_sizes("trajectory_groups: group size", min_group_size, max_group_size)
    spec = _spec(**trajectory_options)
    size = st.integers(min_group_size, max_group_size)

    @st.composite
    def strategy(draw: st.DrawFn) -> TrajectoryGroup:
        return _draw_group(draw, spec, size, with_rollout_errors)

    return strategy()


def batches(
    *,
    min_groups: int = 1,
    max_groups: int = DEFAULT_MAX_GROUPS,
    **group_options: Any,
) -> st.SearchStrategy[tuple[TrajectoryGroup, ...]]:
    """Batches `groups_P`: a tuple of `min_groups..max_groups` groups with ragged sizes.

    Args:
        min_groups: fewest groups (0 allowed: an empty batch).
        max_groups: most groups.
        **group_options: as for `trajectory_groups` (`min_group_size`, `max_group_size`,
            `with_rollout_errors`) and `trajectories` (`reward_kind`, `max_turns`, `prefix`,
            `masked_turns`, ...).

    Examples:
        >>> from hypothesis import given, settings
        >>> @settings(max_examples=5)
        ... @given(batches(reward_kind="binary", prefix="always"))
        ... def check(groups_P):
        ...     assert all(len(g.trajectories_G) >= 1 for g in groups_P)
        >>> check()
    """
    _check_sizes("batches: groups", min_groups, max_groups)
    return st.lists(
        trajectory_groups(**group_options), min_size=min_groups, max_size=max_groups
    ).map(tuple)


def ragged_rewards(
    *,
    min_groups: int = 1,
    max_groups: int = DEFAULT_MAX_GROUPS,
    min_group_size: int = 1,
    max_group_size: int = DEFAULT_MAX_GROUP_SIZE,
    reward_kind: RewardKind = "binary",
    reward_bound: float = _DEFAULT_REWARD_BOUND,
) -> st.SearchStrategy[tuple[tuple[float, ...], ...]]:
    """Ragged total rewards `rewards_P[p][g]`, without building trajectories (fast).

    Useful to property-test advantage maths directly; see `rewards` for the values.
    """
    _check_sizes("ragged_rewards: groups", min_groups, max_groups)
    _check_sizes("ragged_rewards: group size", min_group_size, max_group_size)
    group = st.lists(
        rewards(reward_kind=reward_kind, reward_bound=reward_bound),
        min_size=min_group_size,
        max_size=max_group_size,
    ).map(tuple)
    return st.lists(group, min_size=min_groups, max_size=max_groups).map(tuple)
