"""The offline tool-use agent demo, `rlpure agent`: a model learns to call a calculator with GRPO.

Everything runs on the local JAX backend, with the toy model (`rlpure/tiny`, the default) or
with `--model smollm2` the real SmolLM2-135M-Instruct (LoRA), through the same code used
against Tinker: `shell.agents` (`@tool calculator`, `build_agent_tool_env`, i.e.
`AgentToolMessageEnv` inside `shell.agents._message_env.EnvFromMessageEnv`), the rollouts, the
training loop (`shell.training.train`) and its logs. The recipe:

1. **Task** (`_task`): "What is 37*45?" (two-digit `+` and `*`). The agent may call
   `calculator(expr="37*45")`; the tool's result comes back as a tool message; the episode ends
   with a turn that calls no tool, graded once: 1 for `\\boxed{1665}`, 0 for a wrong number,
   `-format_coef` without `\\boxed{}`. A malformed call (bad JSON, unknown tool, wrong argument,
   bad expression) is an error tool message counted in `tool_error/*` / `parse_error`, never a
   crash.
2. **Format** (`_renderer`): the toy model's byte tokenizer has no special tokens for chat
   markers, so the chat renderers (`chatml`, `qwen3`, `llama3`) refuse it; the demo uses
   `role_colon` with Hermes `<tool_call>{json}</tool_call>` blocks in the text and tool results
   as `User: <tool_response>…</tool_response>` turns (Qwen's layout), which keeps one stop
   sequence and the prefix property (one datum per episode). SmolLM2 gets its recommended
   renderer, `smollm2` (its own ChatML template, `<|im_end|>` the stop token, tool results as
   role `tool`), and a system message (`SMOLLM2_TOOL_PROMPT`) that names the tool and shows
   one Hermes call; zero-shot it never calls the tool, with this prompt or with the renderer's
   full Hermes declaration (`SMOLLM2_TOOL_PROMPT` says what was sampled).
3. **Warm-up** (`_run`): a random toy model cannot call tools, so, as `rlpure demo` pretrains
   its base model, it first fits a corpus of transcripts that is imperfect on purpose: a
   fraction `p_tool` calls the calculator and copies its result (right), the rest answer at
   once with a near miss (wrong). The warmed-up model samples tool use about `p_tool` of the
   time, but its greedy answer is a direct (wrong) guess. SmolLM2 fits the same kind of
   corpus with a few LoRA steps (rank `lora_rank`; GRPO continues those adapters).
4. **GRPO** (`importance_sampling` loss, group-centred advantages) on the training problems;
   held-out problems are only evaluated, greedily, at step 0, every `eval_every` steps and at
   the end. `summary.json` records held-out accuracy and tool use before/after, the reward
   curve, the time split and the recipe; each step's `iteration_NNNNNN/train.html` and
   `train_rollout_summaries.jsonl` show the conversations (tool calls and results included)
   of the first `num_groups_to_log` groups. `AGENT_MODELS` holds the recipe of each `--model`.

Layout: this module holds the command (`add_agent_arguments`, `agent_main`, `COMMAND`, which
`shell.jobs` lists as `rlpure agent`) and re-exports the parts: `_renderer`
(`RoleColonToolRenderer`), `_task` (problems, the `calculator` tool as
`shell.jobs.tools._task.calculator`, grading, corpus, datasets) and `_run` (`AgentConfig`,
`AGENT_MODELS`, `agent_renderer`, `run_agent`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import msgspec

from shell.commands import Command
from shell.config import MAX_SEED, check_log_dir
from shell.errors import ConfigError
from shell.jobs.tools._renderer import RoleColonToolRenderer
from shell.jobs.tools._run import (
    AGENT_MODELS,
    SMOLLM2_TOOL_PROMPT,
    SUMMARY_FILE,
    WARMUP_METRICS_FILE,
    AgentConfig,
    agent_renderer,
    conversation_prefix,
    run_agent,
    run_agent_async,
)
from shell.jobs.tools._task import (
    AgentDataset,
    AgentGroupBuilder,
    ToolProblem,
    corpus_conversations,
    grade_messages,
    split_tool_problems,
)
from shell.training import hold_log_dir

__all__ = [
    "AGENT_MODELS",
    "COMMAND",
    "SMOLLM2_TOOL_PROMPT",
    "SUMMARY_FILE",
    "WARMUP_METRICS_FILE",
    "AgentConfig",
    "AgentDataset",
    "AgentGroupBuilder",
    "RoleColonToolRenderer",
    "ToolProblem",
    "add_agent_arguments",
    "agent_main",
    "agent_renderer",
    "conversation_prefix",
    "corpus_conversations",
    "grade_messages",
    "run_agent",
    "run_agent_async",
    "split_tool_problems",
]


_OPTION_HELP: dict[str, str] = {
    "rl_steps": "GRPO steps",
    "warmup_steps": "Supervised warm-up steps on the imperfect transcripts",
    "groups_per_batch": "Problems per step",
    "group_size": "Episodes per problem",
    "eval_every": "Greedy held-out evaluation every N steps",
}
"""Help of the numeric flags, one per `AgentConfig` field (default: the `--model` preset's)."""


def add_agent_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds `--model`, `--seed`, `--log-dir` and the recipe's main knobs to `parser`."""
    parser.add_argument(
        "--model",
        choices=sorted(AGENT_MODELS),
        default="toy",
        help="toy: the byte-level rlpure/tiny, fully fine-tuned; smollm2: the real "
        "SmolLM2-135M-Instruct (packaged GGUF) with LoRA and its chat template (default toy).",
    )
    parser.add_argument("--seed", type=int, default=0, help="Seed of the whole run (default 0).")
    parser.add_argument(
        "--log-dir",
        type=Path,
        default=None,
        help="Where metrics.jsonl, the conversation pages and summary.json go "
        "(default runs/agent-seed<N>, runs/agent-smollm2-seed<N> with --model smollm2).",
    )
    for name, text in _OPTION_HELP.items():
        shown = ", ".join(f"{model} {getattr(c, name)}" for model, c in AGENT_MODELS.items())
        parser.add_argument(
            "--" + name.replace("_", "-"),
            type=int,
            default=None,
            help=f"{text} (default: {shown}).",
        )
    parser.add_argument("--quiet", action="store_true", help="Do not print per-step lines.")


def agent_main(args: argparse.Namespace) -> int:
    """Runs the agent demo from parsed arguments and prints its summary; exit code 0.

    Raises:
        ConfigError: an option out of range or an unusable `--log-dir`, before any work.
    """
    given = {name: getattr(args, name) for name in _OPTION_HELP if getattr(args, name) is not None}
    config = msgspec.structs.replace(AGENT_MODELS[args.model], **given)
    if not 0 <= args.seed <= MAX_SEED:
        raise ConfigError(f"agent --seed: must lie in [0, 2**63 - 1], got {args.seed}")
    name = "agent" if args.model == "toy" else f"agent-{args.model}"
    log_dir = args.log_dir if args.log_dir is not None else Path(f"runs/{name}-seed{args.seed}")
    check_log_dir(log_dir)
    with hold_log_dir(log_dir):
        summary = run_agent(seed=args.seed, log_dir=log_dir, config=config, progress=not args.quiet)
    print(
        f"rlpure agent ({args.model}, seed {summary['seed']}): held-out greedy accuracy "
        f"{summary['accuracy_before']} -> {summary['accuracy_after']}, tool use "
        f"{summary['tool_use_before']} -> {summary['tool_use_after']} in {summary['steps']} "
        f"GRPO steps, {summary['wall_s']:.1f} s; files in {log_dir}"
    )
    return 0


COMMAND = Command(
    "agent",
    help="Offline tool-use agent demo: warm up a model (toy or SmolLM2), then GRPO it to use "
    "a calculator.",
    run=agent_main,
    add_arguments=add_agent_arguments,
)
"""`rlpure agent`."""
