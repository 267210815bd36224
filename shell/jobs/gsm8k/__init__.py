"""GSM8K with GRPO (Tinker tutorial 104, "first RL"), `rlpure train gsm8k`.

- `_data`: GSM8K rows → validated `Gsm8kProblem`s (local JSONL or the hub), the `Gsm8kEnv`
  (`\\boxed{}` reward, format penalty) and its datasets.
- `_recipe`: the recipe's options, per-backend defaults and `run_gsm8k` (the tutorial's loop
  settings), and `RECIPE`, which `shell.jobs` lists for the CLI as `rlpure train gsm8k`.
"""

from __future__ import annotations

from shell.jobs.gsm8k._data import (
    DatasetUnavailableError,
    Gsm8kDataError,
    Gsm8kDataset,
    Gsm8kDatasetBuilder,
    Gsm8kEnv,
    Gsm8kProblem,
    Gsm8kSplits,
    load_gsm8k,
    load_gsm8k_splits,
)
from shell.jobs.gsm8k._recipe import (
    GSM8K_CONFIG_DEFAULTS,
    GSM8K_LOCAL_CONFIG_DEFAULTS,
    GSM8K_TINKER_MODEL,
    RECIPE,
    Gsm8kOptions,
    TokenizerUnavailableError,
    default_gsm8k_options,
    run_gsm8k,
)

__all__ = [
    "GSM8K_CONFIG_DEFAULTS",
    "GSM8K_LOCAL_CONFIG_DEFAULTS",
    "GSM8K_TINKER_MODEL",
    "RECIPE",
    "DatasetUnavailableError",
    "Gsm8kDataError",
    "Gsm8kDataset",
    "Gsm8kDatasetBuilder",
    "Gsm8kEnv",
    "Gsm8kOptions",
    "Gsm8kProblem",
    "Gsm8kSplits",
    "TokenizerUnavailableError",
    "default_gsm8k_options",
    "load_gsm8k",
    "load_gsm8k_splits",
    "run_gsm8k",
]
