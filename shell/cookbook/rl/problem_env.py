"""The cookbook's `tinker_cookbook.rl.problem_env`: single-turn question/answer envs.

A thin facade over `shell.env.ProblemEnv` and `shell.env.ProblemGroupBuilder` (reward
`format_coef * (format - 1) + correct`, metrics `format` and `correct`, as the cookbook's).
`logger` is this module's logger, as cookbook recipes import it from here
(`from tinker_cookbook.rl.problem_env import ProblemEnv, ProblemGroupBuilder, logger`).
"""

from __future__ import annotations

import logging

from shell.env import ProblemEnv, ProblemGroupBuilder

__all__ = ["ProblemEnv", "ProblemGroupBuilder", "logger"]

logger = logging.getLogger(__name__)
"""The logger cookbook recipes import from `rl.problem_env` (e.g. `math_env.py`)."""
