"""GRPO with LoRA on the real SmolLM2-135M-Instruct, offline: `rlpure train smollm2-addition`.

- `_task`: the addition task in chat (`AdditionDataset`: the demo's envs after the system message
  and few-shot prefix, the split less the few-shot problems).
- `_recipe`: the recipe's options and `TrainConfig` defaults, `run_smollm2` (the run and its
  `summary.json`) and `RECIPE`, which `shell.recipes` lists for the CLI.

Measured (2 shared CPU cores at load ~8, `rlpure train smollm2-addition --seed 0`, defaults):
held-out greedy accuracy 0.154 -> 0.692 (6/39 -> 27/39) in 10 steps, 939 s wall, 11 GB peak RSS;
train-batch correctness 0.02 at step 0, 0.69 at step 2. Base-model prompts tried first (greedy,
strict grade): two-digit sums 0% with every prompt (at most 19% counting the last number of
a verbose reply); single digits without the worked examples 0% strict although 67% of the
verbose replies ("The answer is 12.") were right; with the two examples 17%. A prototype at
temperature 1 (4 samples per problem, lr 2e-3) lost the reply format by step 4.
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
