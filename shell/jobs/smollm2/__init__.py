"""GRPO with LoRA on the real SmolLM2-135M-Instruct, offline: `rlpure train smollm2-addition`
and `rlpure demo`'s default run.

- `_task`: the addition task in chat (`AdditionEnv`, `AdditionDataset`: the question after a
  system message and few-shot examples, the split less the shown problems), in the number
  style or the worked one (`rlpure.tasks.worked_addition`: only `"3+5=8"` counts).
- `_recipe`: the recipe's options and `TrainConfig` defaults, `run_smollm2` (the run and its
  `summary.json`) and `RECIPE`, which `shell.jobs` lists for the CLI.
- `_demo`: `rlpure demo`'s sizes (`DEMO_CONFIG_DEFAULTS`, `DEMO_OPTIONS`: the worked style, 3
  steps of 8 problems x 8 samples at temperature 1, lr 1e-3, no format penalty) and
  `run_smollm2_demo`.

Worked style, how it was chosen (greedy, base model, 40 problems, on a loaded machine): with
three worked examples 78% right (the model adds once it writes the equation out), so it knows
the content; with one worked example among three it writes most replies worked (60-72% right)
unless the worked one comes first (2.5% worked, then 2% of samples at temperature 1: too few
for GRPO, and accepting bare answers too left held-out accuracy flat, 0.22 -> 0.20 in 2 steps
on seed 1, as did two of four alternating examples, 0.27 -> 0.22). With those alternating
examples (`WORKED_FEWSHOT`) and only the worked form counting, 17.5% of greedy replies and 13%
of samples are worked; seed 1 at lr 1e-3: held-out 0.14 -> 0.88 after 2 steps, 0.90 after 4.
With the recipe's 0.1 format penalty, 3 steps: seed 0 0.15 -> 0.70, seed 1 0.14 -> 0.71, seed 2
0.08 -> 0.06 (one worked sample, none right, in its first batch: the penalty made wrong worked
replies out-score bare ones, test format 0.98). The demo's default, without it
(`rlpure demo --seed N`): seed 0 0.149 -> 0.681 (7/47 -> 32/47), seed 1 0.143 -> 0.694
(7/49 -> 34/49), seed 2 0.083 -> 0.917 (4/48 -> 44/48), in 161 s, 141 s and 221 s per process
on 2 loaded cores (load average 3-6, nice 19, a warm compilation cache; not yet measured under
the timing lock or with a cold cache).

The number style, measured (`rlpure train smollm2-addition --seed N`, defaults: LoRA rank 8, lr 5e-4, 10 steps of
8 problems x 8 samples at temperature 0.7, about 48 held-out problems, greedy): seed 0 0.188 ->
0.896 (9/48 -> 43/48) in 487 s, seed 1 0.184 -> 0.408 (9/49 -> 20/49) in 412 s, seed 2 0.184 ->
0.592 (9/49 -> 29/49) in 415 s (2 CPU cores, one seed after another, at 6789b2b's numerics;
before its hand-written VJPs the same accuracies took 864 s, 518 s and 471 s on a busier
machine). What was wrong before, and the evidence:
- the worked examples `12+7` -> `19`, `5+8` -> `13` made the base model guess "12" (44 of the
  100 problems) or "10" (34), so GRPO's few informative groups were those sums and seed 2
  collapsed onto "12" (0.179 -> 0.051); with the current examples (`_task`) seed 2 at the old
  lr 1e-3 (rank 32) rose 0.184 -> 0.510;
- lr 1e-3 over-sharpens: seed 0 at rank 8 reached train reward 0.84 after one step, then groups
  went constant on wrong answers ("11" for 9+4) and held-out ended 0.188 -> 0.229; lr 3e-4 (old
  examples, rank 32) stayed flat in 10 steps (0.163 -> 0.163). 5e-4 is 0.38x the cookbook's
  `hyperparam_utils.get_lr` for a Llama of width 576 (1.32e-3, an SFT rate);
- base-model prompts tried first (greedy, strict grade): two-digit sums 0% with every prompt;
  single digits without worked examples 0% strict although 67% of the verbose replies were right.
"""

from __future__ import annotations

from shell.jobs.smollm2._demo import (
    DEMO_CONFIG_DEFAULTS,
    DEMO_OPTIONS,
    run_smollm2_demo,
    smollm2_demo_config,
)
from shell.jobs.smollm2._recipe import (
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
from shell.jobs.smollm2._task import (
    FEWSHOT,
    SYSTEM_PROMPT,
    WORKED_FEWSHOT,
    WORKED_SYSTEM_PROMPT,
    AdditionDataset,
    AdditionEnv,
    addition_prefix,
    addition_split,
)

__all__ = [
    "DEMO_CONFIG_DEFAULTS",
    "DEMO_OPTIONS",
    "FEWSHOT",
    "RECIPE",
    "SMOLLM2_CONFIG_DEFAULTS",
    "SMOLLM2_MODEL",
    "SMOLLM2_RESUME_MAY_CHANGE",
    "SUMMARY_FILE",
    "SYSTEM_PROMPT",
    "WORKED_FEWSHOT",
    "WORKED_SYSTEM_PROMPT",
    "AdditionDataset",
    "AdditionEnv",
    "Smollm2Options",
    "addition_prefix",
    "addition_split",
    "run_smollm2",
    "run_smollm2_demo",
    "smollm2_config",
    "smollm2_demo_config",
    "smollm2_recipe_options",
]
