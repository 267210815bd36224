"""The cookbook's `tinker_cookbook.rl.rollout_presets`: per-model rollout defaults.

A thin facade: `RolloutConfig`, `ToolExecution`, `simple()`, `agentic()` and
`default_rollout_config_for_model` come from `shell.limits`;
`default_rollout_strategy_for_model` (`MinViableGroup()` for `thinkingmachines/Inkling`
models, `FailFast()` otherwise) from `shell.rollouts`.
"""

from __future__ import annotations

from shell.limits import (
    RolloutConfig,
    ToolExecution,
    agentic,
    default_rollout_config_for_model,
    simple,
)
from shell.rollouts import default_rollout_strategy_for_model

__all__ = [
    "RolloutConfig",
    "ToolExecution",
    "agentic",
    "default_rollout_config_for_model",
    "default_rollout_strategy_for_model",
    "simple",
]
