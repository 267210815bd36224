"""The recipes and commands the `rlpure` CLI offers, listed by explicit import.

- `shell.jobs.toy`: `rlpure train toy`, a scripted smoke test of the whole loop.
- `shell.jobs.gsm8k`: `rlpure train gsm8k`, Tinker tutorial 104 on Tinker or offline.
- `shell.jobs.demo`: `rlpure demo`, the offline GRPO demo on the local backend.
- `shell.jobs.smollm2`: `rlpure train smollm2-addition`, GRPO with LoRA on the real
  SmolLM2-135M-Instruct, offline.
- `shell.jobs.tools`: `rlpure agent`, the offline tool-use agent demo (GRPO teaches the toy
  model to call a calculator tool) on the local backend.
- `shell.report`: `rlpure cost` and `rlpure report`, a run's cost and PNG report.
- `shell.serve`: `rlpure serve`, Tinker's HTTP API on localhost over the local backend.
- `shell.sandboxes`: `rlpure sandbox-serve`, SandboxFusion's `run_code` API on localhost over
  local subprocess sandboxes.

A new recipe module builds a `shell.commands.TrainRecipe` (or `Command`) and is added to the
tuple below; nothing is discovered by module name, so a renamed recipe fails at import.
"""

from __future__ import annotations

from shell.commands import by_name
from shell.jobs import demo, gsm8k, smollm2, tools, toy
from shell.report import COST_COMMAND, REPORT_COMMAND
from shell.sandboxes import RUN_CODE_COMMAND
from shell.serve import COMMAND as SERVE_COMMAND

__all__ = ["COMMANDS", "TRAIN_RECIPES"]

TRAIN_RECIPES = by_name([toy.RECIPE, gsm8k.RECIPE, smollm2.RECIPE])
"""`rlpure train NAME` → its `TrainRecipe`."""

COMMANDS = by_name(
    [demo.COMMAND, tools.COMMAND, COST_COMMAND, REPORT_COMMAND, SERVE_COMMAND, RUN_CODE_COMMAND]
)
"""`rlpure NAME` → its `Command` (besides `train`)."""
