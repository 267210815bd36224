"""Pairwise-preference RL: a group's completions play a tournament scored by a judge.

The cookbook's `rl/preference_envs.py` (0.6.1), with its names, signatures and behaviour. Each
problem is a prompt; its `G` envs each sample one completion (a single turn, step reward 0);
`PairwisePreferenceGroupBuilder.compute_group_rewards` then pairs the completions
(`get_pairs_chunked`: within consecutive chunks of `matchup_group_size`, all pairs one way or
both ways), asks the `PreferenceModel` about each pair in turn (a score in [-1, 1], positive
when the second completion is preferred) and gives each completion its mean win-minus-loss
plus a format term: `reward_g = mean_pairs(±score) + (is_stop_sequence_g - 1)`. The prompt,
completions and matchups are written to the active logtree as the cookbook writes them.

Deliberate differences: the builder checks `num_envs >= 1` and `matchup_group_size >= 1` when
it is built (the cookbook fails later, or runs an empty group), and a trajectory group whose
trajectories are not single-turn raises `ValueError` naming the trajectory (the cookbook
asserts). Observations are stored as `rlpure` `ModelInput`s, as `shell.env.ProblemEnv` does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import chz

from rlpure.records import (
    Metrics,
    ModelInput,
    StepResult,
    StopCondition,
    Trajectory,
    as_model_input,
)
from shell import logtree
from shell.chat import Message, Renderer, get_renderer, get_text_content
from shell.comparisons._datasets import ComparisonDatasetBuilder
from shell.comparisons._types import Comparison, LabeledComparison, PreferenceModel
from shell.env import Action, ActionExtra, Env, EnvGroupBuilder, RLDataset, RLDatasetBuilder
from shell.errors import ConfigError
from shell.tokenizers import get_tokenizer

__all__ = [
    "PairwisePreferenceDataset",
    "PairwisePreferenceGroupBuilder",
    "PairwisePreferenceRLDatasetBuilder",
    "PreferenceEnv",
    "TournamentPattern",
    "get_pairs",
    "get_pairs_chunked",
    "tournament_scores",
]

logger = logging.getLogger(__name__)

_FORMAT_COEF = 1.0


class PreferenceEnv(Env):
    """One single-turn episode: the prompt in, one completion out, step reward 0.

    The reward comes later, from the group's tournament
    (`PairwisePreferenceGroupBuilder.compute_group_rewards`).

    Args:
        convo_prefix: the prompt's messages.
        policy_renderer: renders the prompt and gives the stop sequences.
    """

    def __init__(self, convo_prefix: list[Message], policy_renderer: Renderer | Any) -> None:
        self.convo_prefix = convo_prefix
        self.policy_renderer = policy_renderer

    @property
    def stop_condition(self) -> StopCondition:
        """The policy renderer's stop sequences (a tuple, as `ProblemEnv`'s)."""
        return tuple(self.policy_renderer.get_stop_sequences())

    async def initial_observation(self) -> tuple[ModelInput, StopCondition]:
        """The rendered prompt and the stop sequences."""
        prompt = self.policy_renderer.build_generation_prompt(self.convo_prefix)
        observation = as_model_input(prompt, record="PreferenceEnv", field="initial_observation")
        return observation, self.stop_condition

    async def step(self, action: Action, *, extra: ActionExtra | None = None) -> StepResult:
        """Ends the episode with reward 0 (the tournament scores it)."""
        return StepResult(
            reward=0,
            episode_done=True,
            next_observation=ModelInput.empty(),
            next_stop_condition=self.stop_condition,
            metrics={},
        )


class TournamentPattern(StrEnum):
    """Which pairs of a chunk play: every ordered pair (`i != j`), or each unordered pair once."""

    ALL_PAIRS_BOTH_WAYS = "all_pairs_both_ways"
    ALL_PAIRS_ONE_WAY = "all_pairs_one_way"


def get_pairs(n: int, pattern: TournamentPattern) -> list[tuple[int, int]]:
    """The `(i, j)` matchups of `n` players under `pattern`, row by row.

    Raises:
        ConfigError: `pattern` is not a `TournamentPattern` value (the cookbook's
            `ConfigurationError`).

    Examples:
        >>> get_pairs(3, TournamentPattern.ALL_PAIRS_ONE_WAY)
        [(0, 1), (0, 2), (1, 2)]
    """
    if pattern == TournamentPattern.ALL_PAIRS_BOTH_WAYS:
        return [(i, j) for i in range(n) for j in range(n) if i != j]
    if pattern == TournamentPattern.ALL_PAIRS_ONE_WAY:
        return [(i, j) for i in range(n) for j in range(i + 1, n)]
    raise ConfigError(f"Invalid tournament pattern: {pattern}")


def get_pairs_chunked(n: int, pattern: TournamentPattern, chunk_size: int) -> list[tuple[int, int]]:
    """`get_pairs` within each run of `chunk_size` consecutive players (the last may be shorter),
    so the number of matchups grows linearly in `n`; indices are the players' own.

    Examples:
        >>> get_pairs_chunked(5, TournamentPattern.ALL_PAIRS_ONE_WAY, 2)
        [(0, 1), (2, 3)]
    """
    return [
        (start + i, start + j)
        for start in range(0, n, chunk_size)
        for i, j in get_pairs(min(chunk_size, n - start), pattern)
    ]


def tournament_scores(
    pairs: Sequence[tuple[int, int]], scores: Sequence[float], num_players: int
) -> list[float]:
    """Each player's mean win-minus-loss over its matchups (0 for a player that never played).

    A matchup `(i, j)` with score `s` (positive: `j` preferred) adds `s` to `j` and `-s` to `i`;
    sums are taken in matchup order, as the cookbook's.

    Raises:
        ValueError: `pairs` and `scores` differ in length.

    Examples:
        >>> tournament_scores([(0, 1), (1, 0)], [1.0, -1.0], 2)
        [-1.0, 1.0]
    """
    if len(pairs) != len(scores):
        raise ValueError(
            f"tournament_scores: {len(pairs)} pairs but {len(scores)} scores; expected one each"
        )
    totals = [0.0] * num_players
    counts = [0] * num_players
    for (i, j), score in zip(pairs, scores, strict=True):
        totals[j] += score
        totals[i] -= score
        counts[j] += 1
        counts[i] += 1
    return [
        total / count if count > 0 else 0.0 for total, count in zip(totals, counts, strict=True)
    ]


def _log_prompt_and_completions(
    prompt: list[Message], completions: Sequence[list[Message]], valid: Sequence[bool]
) -> None:
    with logtree.scope_header("Prompt"):
        logtree.log_formatter(logtree.ConversationFormatter(messages=prompt))
    for index, (messages, is_valid) in enumerate(zip(completions, valid, strict=True)):
        with logtree.scope_header(f"Completion {index}"):
            logtree.log_formatter(logtree.ConversationFormatter(messages=messages))
            logtree.log_text(f"Valid format: {is_valid}")


@dataclass(frozen=True)
class PairwisePreferenceGroupBuilder(EnvGroupBuilder):
    """`num_envs` `PreferenceEnv`s on one prompt, rewarded by a tournament (module docstring).

    Attributes:
        convo_prefix: the prompt's messages.
        policy_renderer: the policy's renderer (prompts, stop sequences, response parsing).
        tournament_pattern: which pairs of a chunk play.
        preference_model: the judge, awaited once per matchup in order.
        num_envs: completions per prompt, `G` (>= 1).
        content_preprocessor: applied to each completion's text before judging (e.g. to
            strip `<thinking>`); None leaves it as is.
        matchup_group_size: the chunk size of `get_pairs_chunked` (>= 1).
        eval_target_completion_A: a reference completion for evaluation (unused here, as in the
            cookbook).
    """

    convo_prefix: list[Message]
    policy_renderer: Renderer | Any
    tournament_pattern: TournamentPattern
    preference_model: PreferenceModel
    num_envs: int
    content_preprocessor: Callable[[str], str] | None = None
    matchup_group_size: int = 4
    eval_target_completion_A: list[Message] | None = None

    def __post_init__(self) -> None:
        for name in ("num_envs", "matchup_group_size"):
            if getattr(self, name) < 1:
                raise ValueError(
                    f"PairwisePreferenceGroupBuilder.{name}: expected >= 1, got "
                    f"{getattr(self, name)}"
                )

    async def make_envs(self) -> Sequence[Env]:
        """`num_envs` envs on the prompt."""
        return [
            PreferenceEnv(self.convo_prefix, self.policy_renderer) for _ in range(self.num_envs)
        ]

    def _preprocess_message(self, message: Message) -> Message:
        if self.content_preprocessor is None:
            return message
        return {**message, "content": self.content_preprocessor(get_text_content(message))}

    def get_response_message(self, trajectory: Trajectory) -> tuple[list[Message], bool]:
        """The trajectory's completion as one parsed message, and whether it ended on a stop
        sequence (the only well-formed ending, as `ProblemEnv`'s strict default)."""
        tokens = trajectory.transitions[0].ac.tokens
        response, termination = self.policy_renderer.parse_response(list(map(int, tokens)))
        return [response], bool(termination.is_stop_sequence)

    def comparison_reward_for_second_messages(
        self, message_i: list[Message], message_j: list[Message]
    ) -> Comparison:
        """The comparison of two completions of the prompt (A: `message_i`, B: `message_j`),
        each preprocessed."""
        return Comparison(
            prompt_conversation=self.convo_prefix,
            completion_A=[self._preprocess_message(m) for m in message_i],
            completion_B=[self._preprocess_message(m) for m in message_j],
        )

    async def _judge(self, comparisons: Sequence[Comparison]) -> list[float]:
        """The judge's score of each comparison, awaited one after another (the cookbook's order:
        a judge that logs to the tree logs in matchup order)."""
        return [await self.preference_model(comparison) for comparison in comparisons]

    @logtree.scope_header_decorator
    async def compute_group_rewards(
        self, trajectory_group: list[Trajectory], env_group: Sequence[Env]
    ) -> list[tuple[float, Metrics]]:
        """`(mean win-minus-loss + (format - 1), {"win_minus_loss", "format"})` per completion.

        Raises:
            ValueError: a trajectory has other than one transition.
        """
        for index, trajectory in enumerate(trajectory_group):
            if len(trajectory.transitions) != 1:
                raise ValueError(
                    f"PairwisePreferenceGroupBuilder.compute_group_rewards: trajectory {index} "
                    f"has {len(trajectory.transitions)} transitions; expected 1 (single turn)"
                )
        parsed = [self.get_response_message(trajectory) for trajectory in trajectory_group]
        completions = [messages for messages, _ in parsed]
        valid = [is_valid for _, is_valid in parsed]
        _log_prompt_and_completions(self.convo_prefix, completions, valid)
        pairs = get_pairs_chunked(
            len(completions), self.tournament_pattern, self.matchup_group_size
        )
        logtree.log_text(
            f"Got {len(trajectory_group)} trajectories, doing {len(pairs)} pairwise matchups."
        )
        comparisons = [
            self.comparison_reward_for_second_messages(completions[i], completions[j])
            for i, j in pairs
        ]
        with logtree.scope_header("Pairwise Comparisons"):
            scores = await self._judge(comparisons)
            for index, ((i, j), score) in enumerate(zip(pairs, scores, strict=True)):
                logtree.log_text(f"Matchup {index}: ({i} vs {j}) — Reward: {score:.2f}")
        means = tournament_scores(pairs, scores, len(completions))
        return [
            (
                mean + _FORMAT_COEF * (float(is_valid) - 1.0),
                {"win_minus_loss": mean, "format": is_valid},
            )
            for mean, is_valid in zip(means, valid, strict=True)
        ]

    def logging_tags(self) -> list[str]:
        """`["pair_pref"]`."""
        return ["pair_pref"]


class PairwisePreferenceDataset(RLDataset):
    """Batches of `PairwisePreferenceGroupBuilder`s, one per prompt of the comparison rows.

    Row `k` of the builder's train split is batch `k // batch_size`'s prompt (its comparison's
    `prompt_conversation`; rows the builder skips give no group); a trailing partial batch is
    dropped.

    Args:
        comparison_builder: the comparison rows (their completions and labels are unused).
        renderer: the policy's renderer.
        batch_size: rows per batch.
        preference_model: the judge of every group.
        tournament_pattern: which pairs play.
        group_size: completions per prompt.
        content_preprocessor: applied to completions before judging.
    """

    def __init__(
        self,
        comparison_builder: ComparisonDatasetBuilder,
        renderer: Renderer | Any,
        batch_size: int,
        preference_model: PreferenceModel,
        tournament_pattern: TournamentPattern = TournamentPattern.ALL_PAIRS_BOTH_WAYS,
        group_size: int = 4,
        content_preprocessor: Callable[[str], str] | None = None,
    ) -> None:
        self.comparison_builder = comparison_builder
        self.renderer = renderer
        self.batch_size = batch_size
        self.preference_model = preference_model
        self.train_dataset, _ = comparison_builder.get_train_and_test_datasets()
        self.tournament_pattern = tournament_pattern
        self.group_size = group_size
        self.content_preprocessor = content_preprocessor

    def get_batch(self, index: int) -> list[EnvGroupBuilder]:
        """The group builders of batch `index` (rows the comparison builder skips left out)."""
        rows = self.train_dataset.select(
            range(index * self.batch_size, (index + 1) * self.batch_size)
        )
        found = (self.comparison_builder.example_to_labeled_comparison(row) for row in rows)
        return [self._group(labeled) for labeled in found if labeled is not None]

    def _group(self, labeled: LabeledComparison) -> EnvGroupBuilder:
        return PairwisePreferenceGroupBuilder(
            convo_prefix=labeled.comparison.prompt_conversation,
            policy_renderer=self.renderer,
            preference_model=self.preference_model,
            tournament_pattern=self.tournament_pattern,
            num_envs=self.group_size,
            content_preprocessor=self.content_preprocessor,
        )

    def __len__(self) -> int:
        """Whole batches in the train split."""
        return len(self.train_dataset) // self.batch_size


@chz.chz
class PairwisePreferenceRLDatasetBuilder(RLDatasetBuilder):
    """Builds a `PairwisePreferenceDataset` from names (a chz config); no test split.

    Attributes:
        comparison_builder: the comparison rows.
        batch_size: rows per batch.
        policy_renderer_name: the policy's renderer (`shell.chat.get_renderer`).
        policy_model_name: the tokenizer's model (`shell.tokenizers.get_tokenizer`).
        tournament_pattern: which pairs play.
        group_size: completions per prompt.
        content_preprocessor: applied to completions before judging.
        preference_model_builder: makes the judge when the dataset is built.
    """

    comparison_builder: ComparisonDatasetBuilder
    batch_size: int
    policy_renderer_name: str
    policy_model_name: str
    tournament_pattern: TournamentPattern = TournamentPattern.ALL_PAIRS_BOTH_WAYS
    group_size: int
    content_preprocessor: Callable[[str], str] | None = None
    preference_model_builder: Callable[[], PreferenceModel]

    async def __call__(self) -> tuple[PairwisePreferenceDataset, None]:
        """`(the dataset, None)`."""
        renderer = get_renderer(self.policy_renderer_name, get_tokenizer(self.policy_model_name))
        dataset = PairwisePreferenceDataset(
            comparison_builder=self.comparison_builder,
            renderer=renderer,
            batch_size=self.batch_size,
            preference_model=self.preference_model_builder(),
            tournament_pattern=self.tournament_pattern,
            group_size=self.group_size,
            content_preprocessor=self.content_preprocessor,
        )
        return dataset, None
