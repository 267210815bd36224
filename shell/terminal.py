"""What a person sees and types at a terminal: coloured tokens, trajectories as text, a hand policy.

The cookbook's `display.py`, `utils/format_colorized.py` and `rl/play_w_env.py` (0.6.1), same
names, signatures and text:
- `colored` is the part of `termcolor.colored` they use, with termcolor's rule for when to
  colour (no colour under `ANSI_COLORS_DISABLED` or `NO_COLOR`, colour under `FORCE_COLOR`, else
  only when stdout is a terminal that is not `TERM=dumb`), checked on every call (termcolor
  caches it per process); `termcolor` is not a dependency.
- `format_colorized` colours runs of tokens by weight (green > 0, yellow = 0, red < 0), each
  run decoded in one call; `colorize_example` does so for a `tinker.Datum`'s loss weights
  (image chunks shown as `@` tokens); `format_trajectory` prints each transition's decoded
  observation and action, reward, end flag and metrics.
- `ManualPolicy` is a token policy typed at the keyboard (read in a worker thread, so the event
  loop keeps running); `play_env` plays one episode of an env with it.
"""

from __future__ import annotations

import asyncio
import io
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any, cast

import tinker

from rlpure.records import ModelInput, StopCondition, TokensWithLogprobs, Trajectory
from shell.completion import TokenCompleter
from shell.env import Env
from shell.rollouts import do_single_rollout
from shell.tokenizers import Tokenizer, encode_without_special_tokens

__all__ = [
    "ManualPolicy",
    "chunk_tokens",
    "colored",
    "colorize_example",
    "colors_enabled",
    "format_colorized",
    "format_trajectory",
    "get_async_input",
    "play_env",
    "print_trajectory_summary",
]

_COLORS = {
    "black": 30, "grey": 30, "red": 31, "green": 32, "yellow": 33, "blue": 34, "magenta": 35,
    "cyan": 36, "light_grey": 37, "dark_grey": 90, "light_red": 91, "light_green": 92,
    "light_yellow": 93, "light_blue": 94, "light_magenta": 95, "light_cyan": 96, "white": 97,
}  # fmt: skip
_ATTRIBUTES = {
    "bold": 1, "dark": 2, "italic": 3, "underline": 4, "blink": 5, "reverse": 7, "concealed": 8,
    "strike": 9,
}  # fmt: skip
_RESET = "\033[0m"


def colors_enabled() -> bool:
    """Whether `colored` colours now (termcolor's rule: module docstring)."""
    if os.environ.get("ANSI_COLORS_DISABLED") or os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    if os.environ.get("TERM") == "dumb" or not hasattr(sys.stdout, "fileno"):
        return False
    try:
        return os.isatty(sys.stdout.fileno())
    except (OSError, ValueError):  # ValueError: a replaced stdout without a real descriptor
        return sys.stdout.isatty()


def colored(text: object, color: str | None = None, attrs: Iterable[str] | None = None) -> str:
    """`text` in ANSI `color` with `attrs` (`"bold"`, ...), as `termcolor.colored` writes it;
    plain `str(text)` when colours are off.

    Raises:
        KeyError: an unknown colour or attribute name.
    """
    result = str(text)
    if not colors_enabled():
        return result
    if color is not None:
        result = f"\033[{_COLORS[color]}m{result}"
    for attr in attrs or ():
        result = f"\033[{_ATTRIBUTES[attr]}m{result}"
    return result + _RESET


def format_colorized(
    tokens: list[int], weights: list[float], tokenizer: Tokenizer, draw_newline_arrow: bool = False
) -> str:
    """`tokens` decoded, each run of equal-sign weights coloured (green > 0, yellow 0, red < 0);
    each line of a run is coloured on its own, and `draw_newline_arrow` shows newlines as `↵`.

    Raises:
        ValueError: `tokens` and `weights` differ in length.
    """
    if len(tokens) != len(weights):
        raise ValueError("`tokens` and `weights` must be the same length.")
    runs: list[tuple[str, list[int]]] = []
    for token, weight in zip(tokens, weights, strict=True):
        color = "red" if weight < 0 else "yellow" if weight == 0 else "green"
        if runs and runs[-1][0] == color:
            runs[-1][1].append(token)
        else:
            runs.append((color, [token]))
    chunks = []
    for color, run in runs:
        for line in str(tokenizer.decode(run)).splitlines(keepends=True):
            chunks.append(colored(line.replace("\n", "↵\n") if draw_newline_arrow else line, color))
    return "".join(chunks)


def chunk_tokens(chunk: tinker.ModelInputChunk, tokenizer: Tokenizer) -> list[int]:
    """A text chunk's tokens; any other chunk (an image) as `length` `@` tokens (the cookbook's
    `display.to_ints`)."""
    if isinstance(chunk, tinker.EncodedTextChunk):
        return [int(token) for token in chunk.tokens]
    (at_token,) = encode_without_special_tokens(tokenizer, "@")
    return [at_token] * chunk.length


def colorize_example(datum: tinker.Datum, tokenizer: Tokenizer, key: str = "weights") -> str:
    """The datum's input and last target token, coloured by `loss_fn_inputs[key]` (the first
    token, which nothing predicts, as weight 0)."""
    tokens = [t for chunk in datum.model_input.chunks for t in chunk_tokens(chunk, tokenizer)]
    tokens.append(datum.loss_fn_inputs["target_tokens"].tolist()[-1])
    weights = [0.0, *datum.loss_fn_inputs[key].tolist()]
    return format_colorized(tokens, weights, tokenizer)


def _ints(tokens: Any) -> list[int]:
    return [int(token) for token in tokens]


def format_trajectory(
    trajectory: Trajectory | Any, tokenizer: Tokenizer, only_last_transition: bool = False
) -> str:
    """Each transition (or only the last) as text: decoded observation and action, reward, end
    flag and metrics, between rules of `=` and `-`."""
    buf = io.StringIO()

    def label(text: str) -> str:
        return colored(text, "green", attrs=["bold"])

    print("=" * 60, file=buf)
    transitions = list(enumerate(trajectory.transitions))
    for i, transition in transitions[-1:] if only_last_transition else transitions:
        print(f"------ Transition {i} ------", file=buf)
        print(f"{label('Observation:')}: {tokenizer.decode(transition.ob.to_ints())}", file=buf)
        print(f"{label('Action:')}: {tokenizer.decode(_ints(transition.ac.tokens))}", file=buf)
        print(f"{label('Reward:')}: {transition.reward}", file=buf)
        print(f"{label('Episode done:')}: {transition.episode_done}", file=buf)
        print(f"{label('Metrics:')}: {transition.metrics}", file=buf)
        print("-" * 60, file=buf)
    print("=" * 60, file=buf)
    return buf.getvalue()


async def get_async_input(prompt: str, multiline: bool = False) -> str:
    """A line typed at the keyboard (read in a worker thread); with `multiline`, lines until
    two blank lines in a row, joined by newlines (the first of the two blanks dropped)."""
    loop = asyncio.get_running_loop()
    if not multiline:
        return await loop.run_in_executor(None, input, prompt)
    print(prompt + " (enter two blank lines when done)")
    lines: list[str] = []
    previous = None
    while True:
        line = await loop.run_in_executor(None, input, "")
        if line == "" and previous == "":
            if lines and lines[-1] == "":
                lines.pop()
            return "\n".join(lines)
        lines.append(line)
        previous = line


class ManualPolicy:
    """A token policy typed by hand: shows the decoded observation, reads the action, encodes it
    without special tokens (no logprobs).

    Args:
        tokenizer: decodes observations and encodes the typed action.
        multiline: read several lines per action (ended by two blank lines).
        show_observation: print each observation before asking.
    """

    def __init__(
        self, tokenizer: Tokenizer, multiline: bool = True, show_observation: bool = True
    ) -> None:
        self.tokenizer = tokenizer
        self.step_count = 0
        self.multiline = multiline
        self.show_observation = show_observation

    async def __call__(
        self,
        ob: ModelInput | tinker.ModelInput,
        stop: StopCondition | Sequence[str | int],
        *,
        max_tokens: int | None = None,
    ) -> TokensWithLogprobs:
        """The typed action's tokens (`stop` and `max_tokens` are not applied to typed text)."""
        if self.show_observation:
            print(colored(f"\n--- Step {self.step_count} ---", "green"))
            print(colored("Observation:", "blue"))
            print(self.tokenizer.decode(ob.to_ints()))
            print(colored("-" * 60, "green"))
        prompt = "Your action:" if self.multiline else "Your action: "
        text = await get_async_input(colored(prompt, "yellow"), multiline=self.multiline)
        self.step_count += 1
        tokens = encode_without_special_tokens(self.tokenizer, text)
        return TokensWithLogprobs(tokens=tokens, logprobs=None)


def print_trajectory_summary(trajectory: Trajectory | Any) -> None:
    """Prints the episode's steps, its total step reward and each non-zero step reward."""
    print(colored("\n=== Game Summary ===", "cyan", attrs=["bold"]))
    print(f"Total steps: {len(trajectory.transitions)}")
    print(f"Total reward: {sum(t.reward for t in trajectory.transitions)}")
    if trajectory.transitions:
        print("\nReward per step:")
        for i, transition in enumerate(trajectory.transitions):
            if transition.reward != 0:
                print(f"  Step {i}: reward = {transition.reward}")
    print(colored("===================", "cyan", attrs=["bold"]))


async def play_env(
    env: Env, tokenizer: Tokenizer, multiline: bool = True, show_observation: bool = True
) -> Trajectory:
    """Plays one episode of `env` with a `ManualPolicy`, prints its summary and returns it."""
    print(colored("Starting interactive environment session...", "cyan", attrs=["bold"]))
    print("Type your actions when prompted. The episode will end when the episode is done.")
    policy = ManualPolicy(tokenizer, multiline=multiline, show_observation=show_observation)
    # The rollout calls a policy positionally; the cookbook names the first parameter `ob`.
    trajectory = await do_single_rollout(cast(TokenCompleter, policy), env)
    print_trajectory_summary(trajectory)
    return trajectory
