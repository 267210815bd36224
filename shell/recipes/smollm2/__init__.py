"""GRPO with LoRA on the real SmolLM2-135M-Instruct, offline: `rlpure train smollm2-addition`.

- `_task`: the addition task in chat (`AdditionDataset`: the demo's envs after the system message
  and few-shot prefix, the split less the few-shot problems).
- `_recipe`: the recipe's options and `TrainConfig` defaults, `run_smollm2` (the run and its
  `summary.json`) and `RECIPE`, which `shell.recipes` lists for the CLI.
"""

from __future__ import annotations

from shell.recipes.smollm2._recipe import (
    RECIPE,
    SMOLLM2_CONFIG_DEFAULTS,
    SMOLLM2_MODEL,
    SMOLLM2_RESUME_MAY_CHANGE,
    SUMMARY_FILE,
    Smollm2Options,
    run_smollm2,
    smollm2_config,
    smollm2_recipe_options,
)
from shell.recipes.smollm2._task import (
    FEWSHOT,
    SYSTEM_PROMPT,
    AdditionDataset,
    addition_prefix,
    addition_split,
)

__all__ = [
    "FEWSHOT",
    "RECIPE",
    "SMOLLM2_CONFIG_DEFAULTS",
    "SMOLLM2_MODEL",
    "SMOLLM2_RESUME_MAY_CHANGE",
    "SUMMARY_FILE",
    "SYSTEM_PROMPT",
    "AdditionDataset",
    "Smollm2Options",
    "addition_prefix",
    "addition_split",
    "run_smollm2",
    "smollm2_config",
    "smollm2_recipe_options",
]
