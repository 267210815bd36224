"""The cookbook's `tinker_cookbook.rl.play_w_env`: play an env by typing the policy's actions.

A thin facade over `shell.terminal`. The cookbook's `main` (a twenty-questions demo built from
its recipes) is not offered: call `play_env(env, tokenizer)` with an env of your own.
"""

from __future__ import annotations

from shell.terminal import (
    ManualPolicy,
    get_async_input,
    play_env,
    print_trajectory_summary,
)

__all__ = ["ManualPolicy", "get_async_input", "play_env", "print_trajectory_summary"]
