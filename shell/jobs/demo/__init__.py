"""`rlpure demo`: the offline GRPO demo. By default LoRA on the real SmolLM2-135M-Instruct
(`--model smollm2`, `shell.jobs.smollm2`: the worked-addition task, `run_smollm2_demo`); with
`--model toy`, the toy demo below: a "base model" pretraining stage, then GRPO on arithmetic.

The toy demo runs on the local JAX backend (`shell.local.LocalServiceClient`), through the
same code used against Tinker: the envs (`shell.env.ProblemEnv`), rollouts, datums, the
training loop (`shell.training.train`) and its logs (`metrics.jsonl`, `samples.jsonl`,
`reward_curve.png`). The recipe:

1. **Problems** (`rlpure.tasks.arithmetic`): `a + b` with `a, b in [0, max_operand]`, shuffled by
   the seed and split into `num_test` held-out test problems and the rest for training. The
   prompt is the `role_colon` rendering `[BOS]User: 3+5\\n\\nAssistant:`; a well-formed
   answer is `" 8\\n\\nUser:"` or `" =8\\n\\nUser:"`, graded exactly.
2. **Base model** (`pretrain_base_model`): cross-entropy (answer tokens weighted, prompt not)
   through the backend's `forward_backward` on a corpus whose format is always right but whose
   answers are right only with probability `p_correct`: a careful writer completes the
   equation (`"=8"`), a hasty one guesses a near miss (`"9"`); see
   `rlpure.tasks.arithmetic.corpus_responses`. The corpus covers the whole problem space, as a base
   model's corpus covers its domain: the model has seen every question, mostly answered
   wrongly, so greedy decoding answers wrongly, yet it samples the careful, right answer about
   `p_correct` of the time. GRPO's job is to find and reinforce that behaviour, which — being
   one behaviour rather than 80 memorised facts — carries over to the held-out problems.
   Prototype findings behind this design: with only bare answers (right ones and near misses
   in one style) RL raised train reward but not held-out accuracy reliably (per-problem
   memorisation, 0.4–0.85 by seed); keeping the test questions out of the corpus too left
   nothing to elicit (a 2-layer model memorises single-digit sums rather than learning to add
   unseen pairs; ≤ 0.7). The state is cached in `cache_dir` (default `<log_dir>/base_model`)
   under a key made of the seed and every pretraining option; a second run reuses it.
3. **GRPO** (`shell.training.train`, `importance_sampling` loss, group-centred advantages): the
   service handed to the loop starts every training client from the cached base model
   (`BaseModelServiceClient`), exactly as a Tinker run starts from a pretrained base. Rewards
   (`ProblemEnv`: 1 for a right answer, −`format_coef` for a malformed one) are computed on the
   training problems only; the held-out test problems never get a reward or a correct label
   during training: they are only evaluated, greedily, before the first step, every
   `eval_every` steps and at the end.

`summary.json` in the log dir records `seed`, `accuracy_before` / `accuracy_after` (held-out
greedy accuracy at step 0 and after the last step), `steps`, `wall_s` (the whole command,
compilation included), the time split, and the recipe.

Layout: this module holds the command (`add_demo_arguments`, `demo_main`, which dispatches on
`--model`, and the `COMMAND` record, which `shell.jobs` lists for the CLI as `rlpure demo`) and
is the facade of the toy demo's private parts: `_config` (`DemoConfig`, `demo_keys`), `_arithmetic` (envs and
datasets), `_base_model` (corpus, pretraining, cache, `BaseModelServiceClient`) and `_run`
(`run_demo`, the summary).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import msgspec

from shell.commands import Command
from shell.config import MAX_SEED, check_log_dir
from shell.errors import ConfigError
from shell.jobs import smollm2
from shell.jobs.demo._arithmetic import ArithmeticDataset, ArithmeticEnv, batch_problem_indices
from shell.jobs.demo._base_model import (
    BaseModelServiceClient,
    PretrainResult,
    pretrain_base_model,
    pretraining_datum,
    supervised_step,
)
from shell.jobs.demo._config import DemoConfig, demo_keys
from shell.jobs.demo._run import PRETRAIN_METRICS_FILE, SUMMARY_FILE, run_demo, run_demo_async
from shell.training import hold_log_dir

__all__ = [
    "COMMAND",
    "DEMO_MODELS",
    "PRETRAIN_METRICS_FILE",
    "SUMMARY_FILE",
    "ArithmeticDataset",
    "ArithmeticEnv",
    "BaseModelServiceClient",
    "DemoConfig",
    "PretrainResult",
    "add_demo_arguments",
    "batch_problem_indices",
    "demo_keys",
    "demo_main",
    "pretrain_base_model",
    "pretraining_datum",
    "run_demo",
    "run_demo_async",
    "supervised_step",
]


# --- the command -------------------------------------------------------------------------------


DEMO_MODELS = ("smollm2", "toy")
"""`rlpure demo --model`: SmolLM2-135M-Instruct (the default, `shell.jobs.smollm2`) or the
toy byte model pretrained here."""


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds `--model`, `--seed`, `--log-dir`, `--cache-dir` and the main knobs to `parser`.

    The knobs default to None: the chosen model's recipe fills them (`DemoConfig` for the toy,
    `shell.jobs.smollm2.DEMO_CONFIG_DEFAULTS` / `DEMO_OPTIONS` for SmolLM2). A log dir that
    already holds a run resumes it (`shell.training.train` semantics): a finished run is not
    retrained, its summary is rewritten from its `metrics.jsonl`.
    """
    parser.add_argument(
        "--model",
        choices=DEMO_MODELS,
        default=DEMO_MODELS[0],
        help="smollm2: GRPO with LoRA on SmolLM2-135M-Instruct (default); toy: pretrain a "
        "133k-parameter byte model, then GRPO.",
    )
    parser.add_argument("--seed", type=int, default=0, help="Seed of the whole run (default 0).")
    parser.add_argument(
        "--log-dir",
        type=Path,
        default=None,
        help="Where metrics.jsonl, reward_curve.png and summary.json go "
        "(default runs/demo-seed<N>, runs/demo-toy-seed<N> with --model toy).",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="Toy only: cache of the pretrained base model (default <log-dir>/base_model).",
    )
    parser.add_argument("--rl-steps", type=int, default=None, help="GRPO steps.")
    parser.add_argument("--rl-lr", type=float, default=None, help="Adam learning rate of GRPO.")
    parser.add_argument(
        "--pretrain-steps",
        type=int,
        default=None,
        help="Toy only: cross-entropy steps of the base-model stage.",
    )
    parser.add_argument("--groups-per-batch", type=int, default=None, help="Problems per step.")
    parser.add_argument("--group-size", type=int, default=None, help="Samples per problem.")
    parser.add_argument(
        "--save-every",
        type=int,
        default=0,
        help="Checkpoint GRPO every N steps, so a killed demo resumes losing fewer than N "
        "steps (default 0: only at the end).",
    )
    parser.add_argument("--quiet", action="store_true", help="Do not print per-step lines.")


def demo_main(args: argparse.Namespace) -> int:
    """Runs the demo of `args.model` from parsed arguments, prints the summary; exit code 0.

    Raises:
        ConfigError: an option out of range, one the model does not take, or an unusable
            `--log-dir` / `--cache-dir`, before anything is compiled.
    """
    if not 0 <= args.seed <= MAX_SEED:
        raise ConfigError(f"demo --seed: must lie in [0, 2**63 - 1], got {args.seed}")
    if args.save_every < 0:
        raise ConfigError(f"demo --save-every: must be >= 0, got {args.save_every}")
    if args.model == "toy":
        log_dir = (
            args.log_dir if args.log_dir is not None else Path(f"runs/demo-toy-seed{args.seed}")
        )
        summary = _toy_demo(args, log_dir)
    else:
        log_dir = args.log_dir if args.log_dir is not None else Path(f"runs/demo-seed{args.seed}")
        summary = _smollm2_demo(args, log_dir)
    print(
        f"rlpure demo --model {args.model} (seed {summary['seed']}): held-out greedy accuracy "
        f"{summary['accuracy_before']} -> {summary['accuracy_after']} in {summary['steps']} "
        f"GRPO steps, {summary['wall_s']:.1f} s; files in {log_dir}"
    )
    return 0


def _toy_demo(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    """The toy demo (`run_demo`) with the given knobs over `DemoConfig`'s defaults."""
    knobs = {
        "rl_steps": args.rl_steps,
        "rl_lr": args.rl_lr,
        "pretrain_steps": args.pretrain_steps,
        "groups_per_batch": args.groups_per_batch,
        "group_size": args.group_size,
    }
    config = DemoConfig(**{k: v for k, v in knobs.items() if v is not None})
    # Refused up front (exit code 2), before the pretraining stage compiles anything.
    check_log_dir(log_dir)
    if args.cache_dir is not None:
        check_log_dir(args.cache_dir, option="--cache-dir")
    with hold_log_dir(log_dir):  # before pretraining writes base_model.json into it
        return run_demo(
            seed=args.seed,
            log_dir=log_dir,
            config=config,
            cache_dir=args.cache_dir,
            progress=not args.quiet,
            save_every=args.save_every,
        )


def _smollm2_demo(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    """The SmolLM2 demo (`shell.jobs.smollm2.run_smollm2_demo`) with the given knobs."""
    for flag, value in (("--cache-dir", args.cache_dir), ("--pretrain-steps", args.pretrain_steps)):
        if value is not None:
            raise ConfigError(f"demo {flag}: only with --model toy (SmolLM2 is pretrained)")
    sizes = {"groups_per_batch": args.groups_per_batch, "group_size": args.group_size}
    for name, value in sizes.items():
        if value is not None and value < 1:
            raise ConfigError(f"demo --{name.replace('_', '-')}: must be >= 1, got {value}")
    check_log_dir(log_dir)
    config = smollm2.smollm2_demo_config(
        seed=args.seed,
        log_dir=log_dir,
        steps=args.rl_steps,
        learning_rate=args.rl_lr,
        save_every=args.save_every,
        progress=not args.quiet,
    )
    options = msgspec.structs.replace(
        smollm2.DEMO_OPTIONS, **{k: v for k, v in sizes.items() if v is not None}
    )
    with hold_log_dir(log_dir):  # before the backend writes local_states/ into it
        return smollm2.run_smollm2_demo(config, options=options)


COMMAND = Command(
    "demo",
    help="Offline GRPO demo: LoRA on SmolLM2-135M-Instruct learns to add (local backend); "
    "--model toy: pretrain a tiny base model, then GRPO on arithmetic.",
    run=demo_main,
    add_arguments=add_demo_arguments,
)
"""`rlpure demo`."""
