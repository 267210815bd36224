"""`shell.terminal`: colours and when they are on, weighted token runs, datums and trajectories
as text, and a policy typed at the keyboard (with `input` scripted)."""

from __future__ import annotations

import asyncio
import io
import sys
from typing import Any

import numpy as np
import pytest
import tinker

from rlpure.model import ByteTokenizer
from rlpure.records import StepResult, TokensWithLogprobs, Trajectory, Transition
from shell import terminal
from shell.env import Env

G, Y, R, BOLD, END = "\033[32m", "\033[33m", "\033[31m", "\033[1m", "\033[0m"


@pytest.fixture
def forced(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ANSI_COLORS_DISABLED", "NO_COLOR", "TERM"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FORCE_COLOR", "1")


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"FORCE_COLOR": "1"}, True),
        ({"FORCE_COLOR": "1", "NO_COLOR": "1"}, False),
        ({"FORCE_COLOR": "1", "ANSI_COLORS_DISABLED": "1"}, False),
        ({}, False),  # stdout is a StringIO: not a terminal
        ({"TERM": "dumb"}, False),
    ],
)
def test_colors_follow_termcolors_rule(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: bool
) -> None:
    for name in ("ANSI_COLORS_DISABLED", "NO_COLOR", "FORCE_COLOR", "TERM"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert terminal.colors_enabled() is expected
    colored = terminal.colored("x", "green", attrs=["bold"])
    assert colored == (f"{BOLD}{G}x{END}" if expected else "x")


def test_format_colorized_colours_runs_line_by_line(forced: None) -> None:
    tokenizer = ByteTokenizer()
    tokens = tokenizer.encode("ab\ncd", add_special_tokens=False)
    text = terminal.format_colorized(tokens, [0.0, 0.0, 1.0, 1.0, -2.0], tokenizer)
    assert text == f"{Y}ab{END}{G}\n{END}{G}c{END}{R}d{END}"
    arrows = terminal.format_colorized(tokens, [1.0] * 5, tokenizer, draw_newline_arrow=True)
    assert arrows == f"{G}ab↵\n{END}{G}cd{END}"
    assert terminal.format_colorized([], [], tokenizer) == ""
    with pytest.raises(ValueError, match="same length"):
        terminal.format_colorized([1], [], tokenizer)


def test_colorize_example_shows_images_as_at_signs(forced: None) -> None:
    image = tinker.types.ImageChunk(data=b"png", format="png", expected_tokens=2)
    datum = tinker.Datum(
        model_input=tinker.ModelInput(chunks=[tinker.EncodedTextChunk(tokens=[72]), image]),
        loss_fn_inputs={
            "target_tokens": tinker.TensorData.from_numpy(np.array([64, 64, 105])),
            "weights": tinker.TensorData.from_numpy(np.array([0.0, 1.0, 1.0])),
        },
    )
    assert terminal.colorize_example(datum, ByteTokenizer()) == f"{Y}H@{END}{G}@i{END}"


def _trajectory(rewards: list[float]) -> Trajectory:
    transitions = [
        Transition(
            ob=[104, 105],
            ac=TokensWithLogprobs(tokens=[111, 107], logprobs=[0.0, 0.0]),
            reward=reward,
            episode_done=i == len(rewards) - 1,
            metrics={"m": 1.0},
        )
        for i, reward in enumerate(rewards)
    ]
    return Trajectory(transitions=transitions, final_ob=[])


def test_format_trajectory_lists_each_transition_or_the_last() -> None:
    text = terminal.format_trajectory(_trajectory([0.0, 0.5]), ByteTokenizer())
    block = (
        "Observation:: hi\nAction:: ok\nReward:: {}\nEpisode done:: {}\nMetrics:: {{'m': 1.0}}\n"
    )
    rule, line = "=" * 60 + "\n", "-" * 60 + "\n"
    assert text == (
        f"{rule}------ Transition 0 ------\n{block.format(0.0, False)}{line}"
        f"------ Transition 1 ------\n{block.format(0.5, True)}{line}{rule}"
    )
    last = terminal.format_trajectory(_trajectory([0.0, 0.5]), ByteTokenizer(), True)
    assert "Transition 0" not in last and "Transition 1" in last


def _typed(monkeypatch: pytest.MonkeyPatch, lines: list[str]) -> None:
    answers = iter(lines)

    def fake_input(prompt: str = "") -> str:
        sys.stdout.write(prompt)
        return next(answers)

    monkeypatch.setattr("builtins.input", fake_input)


def test_multiline_input_ends_at_two_blank_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    _typed(monkeypatch, ["a", "", "b", "", "", "never read"])
    assert asyncio.run(terminal.get_async_input("Say:", multiline=True)) == "a\n\nb"
    _typed(monkeypatch, ["only line"])
    assert asyncio.run(terminal.get_async_input("Say: ")) == "only line"


class _GuessSeven(Env):
    """Two turns; reward 1 when the action is the text `7`."""

    def __init__(self) -> None:
        self.turn = 0

    async def initial_observation(self) -> Any:
        return tinker.ModelInput.from_ints([71, 63]), ("\n",)

    async def step(self, action: Any, *, extra: Any = None) -> StepResult:
        self.turn += 1
        return StepResult(
            reward=1.0 if list(action) == [55] else 0.0,
            episode_done=self.turn == 2,
            next_observation=[71, 63],
            next_stop_condition=("\n",),
            metrics={},
        )


def test_play_env_plays_the_typed_actions_and_prints_the_summary(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _typed(monkeypatch, ["3", "7"])
    trajectory = asyncio.run(terminal.play_env(_GuessSeven(), ByteTokenizer(), multiline=False))
    assert [t.ac.tokens.tolist() for t in trajectory.transitions] == [[51], [55]]
    assert all(t.ac.logprobs is None for t in trajectory.transitions)
    out = capsys.readouterr().out
    assert "--- Step 1 ---\nObservation:\nG?\n" in out
    assert out.endswith(
        "Total steps: 2\nTotal reward: 1.0\n\nReward per step:\n  Step 1: reward = 1.0\n"
        "===================\n"
    )
