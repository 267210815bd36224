"""`rlpure demo`'s default run: the worked-addition recipe on SmolLM2-135M-Instruct, sized to
finish in about three minutes on 2 CPU cores (see `shell.jobs.smollm2` for the measurements).

The recipe is `rlpure train smollm2-addition --worked` with the smaller, shorter defaults of
`DEMO_CONFIG_DEFAULTS` and `DEMO_OPTIONS`; `run_smollm2_demo` runs it in `log_dir` and returns
the summary (`summary.json`), whose accuracies are held-out greedy accuracies.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from shell.config import TrainConfig
from shell.jobs.smollm2._recipe import (
    SMOLLM2_CONFIG_DEFAULTS,
    Smollm2Options,
    run_smollm2,
    smollm2_config,
)

__all__ = [
    "DEMO_CONFIG_DEFAULTS",
    "DEMO_OPTIONS",
    "run_smollm2_demo",
    "smollm2_demo_config",
]

DEMO_CONFIG_DEFAULTS: Mapping[str, Any] = {
    **SMOLLM2_CONFIG_DEFAULTS,
    "max_steps": 3,
    "learning_rate": 1e-3,
    # A worked reply to a single-digit sum is at most 7 tokens with <|im_end|> ("9+9=18").
    "max_tokens": 8,
    "temperature": 1.0,
    "eval_every": 3,  # before the first step and after the last
}
"""The demo's `TrainConfig` values (the recipe's, with fewer, larger steps)."""

# format_coef 0: the reward is 1 for a right worked answer, else 0. With the recipe's 0.1
# penalty on malformed (bare) replies a wrong worked reply out-scored a bare one, and seed 2,
# whose first batch held one worked sample and no right one, learned the form with wrong sums
# (held-out 0.08 -> 0.06, format 0.98); with 0 it went 0.08 -> 0.92.
DEMO_OPTIONS = Smollm2Options(
    worked=True, num_test=50, groups_per_batch=8, group_size=8, format_coef=0.0
)
"""The demo's task: worked-style addition, about 48 held-out problems, no format penalty."""


def smollm2_demo_config(
    *,
    seed: int,
    log_dir: Path,
    steps: int | None = None,
    learning_rate: float | None = None,
    save_every: int = 0,
    progress: bool = True,
) -> TrainConfig:
    """The demo's `TrainConfig`: `DEMO_CONFIG_DEFAULTS`, then the given values (None: default).

    Raises:
        ConfigError: a value out of range, naming the field.
    """
    explicit: dict[str, Any] = {
        **DEMO_CONFIG_DEFAULTS,
        "seed": seed,
        "log_dir": str(log_dir),
        "save_every": save_every,
        "progress": progress,
    }
    if steps is not None:
        explicit["max_steps"] = steps
    if learning_rate is not None:
        explicit["learning_rate"] = learning_rate
    return smollm2_config(explicit=explicit)


def run_smollm2_demo(
    config: TrainConfig, *, options: Smollm2Options = DEMO_OPTIONS
) -> dict[str, Any]:
    """Runs (or resumes) the demo in `config.log_dir` in a fresh event loop; returns the
    summary `run_smollm2` wrote."""
    return asyncio.run(run_smollm2(config, options=options))
