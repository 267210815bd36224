"""The cookbook's `tinker_cookbook.rl.rollout_presets`: per-model rollout defaults.

A thin facade over `shell.rollouts`: `RolloutConfig`, `ToolExecution`, `simple()`,
`agentic()`, `default_rollout_config_for_model` and `default_rollout_strategy_for_model`
(`MinViableGroup()` for `thinkingmachines/Inkling` models, `FailFast()` otherwise).
"""

from __future__ import annotations

from shell.rollouts import (
    RolloutConfig,
    ToolExecution,
    agentic,
    default_rollout_config_for_model,
    default_rollout_strategy_for_model,
    simple,
)

__all__ = [
    "RolloutConfig",
    "ToolExecution",
    "agentic",
    "default_rollout_config_for_model",
    "default_rollout_strategy_for_model",
    "simple",
]
