"""The agent demo's run: a supervised warm-up, then GRPO with the calculator env, then a summary.

Part of `rlpure agent` (see `shell.jobs.tools`). `run_agent_async` splits the problems,
warms the model up on the imperfect corpus (`_task.corpus_conversations` after the
`system_prompt`; weight 1 on the assistant turns and what ends each: `"User:"` for the toy
model, `<|im_end|>` for a chat model; every weight of a toy model, LoRA adapters of a
pretrained one), and runs `shell.training.train` on
the local backend, every training client starting from the warmed-up state
(`shell.jobs.demo.BaseModelServiceClient`). The loop writes `metrics.jsonl`,
`samples.jsonl`, `reward_curve.png` and, per step, `iteration_NNNNNN/train.html` +
`train_rollout_summaries.jsonl` (the conversations of the first `num_groups_to_log` groups);
this module writes `warmup_metrics.jsonl` and `summary.json` (held-out greedy accuracy and
tool use before and after GRPO, read back from `metrics.jsonl`). The warm-up state is cached
under `<log_dir>/warmup/<key>/`, the key made of the seed and every warm-up option.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import msgspec
import numpy as np
import tinker

from shell.chat import Message, Renderer, TrainOnWhat, get_renderer
from shell.config import TrainConfig
from shell.errors import ConfigError
from shell.jobs.demo import BaseModelServiceClient, supervised_step
from shell.jobs.smollm2 import SMOLLM2_MODEL
from shell.jobs.tools._renderer import RoleColonToolRenderer
from shell.jobs.tools._task import (
    AgentDataset,
    ToolProblem,
    corpus_conversations,
    split_tool_problems,
)
from shell.model_meta import get_recommended_renderer_name
from shell.tokenizers import Tokenizer, get_tokenizer
from shell.training import (
    METRICS_FILE,
    TrainResult,
    eval_metric_before_after,
    finite_json,
    recipe_options,
    train,
)

__all__ = [
    "AGENT_MODELS",
    "SMOLLM2_TOOL_PROMPT",
    "SUMMARY_FILE",
    "WARMUP_METRICS_FILE",
    "AgentConfig",
    "agent_renderer",
    "conversation_prefix",
    "run_agent",
    "run_agent_async",
]

SUMMARY_FILE = "summary.json"
"""Held-out accuracy before and after GRPO, tool use, the time split and the recipe."""
WARMUP_METRICS_FILE = "warmup_metrics.jsonl"
"""One JSON object per warm-up step (`step`, `loss_per_token`), in the log dir."""


class AgentConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The agent demo's recipe (defaults: the measured one).

    Attributes:
        base_model: the local backend's model: a toy config (`rlpure.model.MODEL_CONFIGS`,
            full fine-tuning, `role_colon` with tool calls) or a pretrained chat model (LoRA,
            its recommended chat renderer).
        lora_rank: LoRA rank (ignored by the toy models, which train every weight).
        system_prompt: the system message of every conversation (empty: none), where a chat
            model is told about the tool.
        min_operand: smallest operand.
        max_operand: largest operand.
        num_train: training problems.
        num_test: held-out test problems.
        p_tool: probability that a warm-up transcript uses the calculator (and is right).
        warmup_steps: supervised warm-up steps.
        warmup_batch: transcripts per warm-up step.
        warmup_lr: Adam learning rate of the warm-up (decaying linearly to 0).
        rl_steps: GRPO steps.
        groups_per_batch: problems per GRPO step.
        group_size: episodes per problem.
        rl_lr: Adam learning rate of GRPO.
        temperature: sampling temperature of the GRPO episodes (evaluation is greedy).
        max_tokens: sampled tokens per assistant turn.
        max_turns: assistant turns per episode.
        eval_every: greedy test evaluation every N steps (and at 0 and the end).
        format_coef: penalty of a final answer without `\\boxed{}`.
        num_groups_to_log: groups shown per step in `iteration_NNNNNN/train.html`.
    """

    base_model: str = "rlpure/tiny"
    lora_rank: int = 32
    system_prompt: str = ""
    min_operand: int = 10
    max_operand: int = 99
    num_train: int = 4000
    num_test: int = 32
    p_tool: float = 0.4
    warmup_steps: int = 600
    warmup_batch: int = 16
    warmup_lr: float = 3e-3
    rl_steps: int = 20
    groups_per_batch: int = 8
    group_size: int = 8
    rl_lr: float = 3e-4
    temperature: float = 1.0
    max_tokens: int = 96
    max_turns: int = 3
    eval_every: int = 5
    format_coef: float = 0.1
    num_groups_to_log: int = 2

    def __post_init__(self) -> None:
        for name in (
            "num_train",
            "num_test",
            "warmup_batch",
            "rl_steps",
            "groups_per_batch",
            "group_size",
            "max_tokens",
            "max_turns",
            "eval_every",
            "lora_rank",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"AgentConfig.{name}: expected >= 1, got {getattr(self, name)}")
        if self.warmup_steps < 0 or self.num_groups_to_log < 0:
            raise ConfigError("AgentConfig.warmup_steps, num_groups_to_log: expected >= 0")
        if not 0 <= self.min_operand <= self.max_operand:
            raise ConfigError(
                f"AgentConfig.min_operand/max_operand: expected 0 <= min <= max, got "
                f"{self.min_operand}, {self.max_operand}"
            )
        if not 0 <= self.p_tool <= 1:
            raise ConfigError(f"AgentConfig.p_tool: expected in [0, 1], got {self.p_tool}")
        for name in ("warmup_lr", "rl_lr"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"AgentConfig.{name}: expected a finite value > 0, got {value}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ConfigError(
                f"AgentConfig.temperature: expected a finite value >= 0, got {self.temperature}"
            )


SMOLLM2_TOOL_PROMPT = (
    "You can use a calculator tool. To call it, write:\n<tool_call>\n"
    '{"name": "calculator", "arguments": {"expr": "2*3"}}\n</tool_call>\n'
    "After the result, give the answer as \\boxed{N}."
)
"""SmolLM2's system message: the tool and its Hermes call syntax, in 60 tokens.

`smollm2`'s `create_conversation_prefix_with_tools` (the Qwen/Hermes declaration with the JSON
schema) takes 205 tokens, which makes every episode ~280 tokens instead of ~130: twice the
training compute of a step on the CPU (and 16 such datums in one `forward_backward` exceeded
20 GB on the local backend before its activations were bounded). SmolLM2-135M ignores either
declaration zero-shot (no tool call in 4 greedy + 16 samples at temperature 0.7 with this
prompt, 4 greedy + 6 at temperature 1 with the full one), so the warm-up teaches the call."""

AGENT_MODELS: dict[str, AgentConfig] = {
    "toy": AgentConfig(),
    "smollm2": AgentConfig(
        base_model=SMOLLM2_MODEL,
        lora_rank=32,
        system_prompt=SMOLLM2_TOOL_PROMPT,
        num_test=16,
        p_tool=0.4,
        warmup_steps=12,
        warmup_batch=8,
        warmup_lr=2e-3,
        rl_steps=4,
        groups_per_batch=4,
        group_size=4,
        rl_lr=1e-4,
        temperature=1.0,
        max_tokens=40,
        max_turns=2,
        eval_every=4,
    ),
}
"""The recipe per `rlpure agent --model`: the toy model's (the measured one) and SmolLM2's.

SmolLM2's GRPO learning rate: a prototype at 5e-4 (seed 0, this warm-up) raised the training
reward from 0.19 to 0.93 in one step (tool use 0.19 -> 1.0), and at the next step the model
called the calculator again on its own result until `max_turns` (reward -0.03; held-out
accuracy 0.06 -> 0.0 with tool use 0.0 -> 1.0); 1e-4 moves a fifth as far per step.
Measured at these defaults (`rlpure agent --model smollm2`, seed 0, 2 CPU cores at load ~1.9,
warm-up reused from the prototype, where it took 217 s at load ~2-4): held-out greedy accuracy
0.0625 -> 1.0 (16 problems), tool use 0.0 -> 1.0, training reward 0.19, 0.50, 0.75, 0.88;
GRPO 298 s (50-84 s a step)."""

AGENT_RESUME_MAY_CHANGE = frozenset({"rl_steps", "eval_every", "num_groups_to_log"})
"""AgentConfig fields a resumed run may change."""


def agent_renderer(base_model: str, tokenizer: Tokenizer) -> Renderer:
    """The conversation format for `base_model`: its recommended renderer
    (`shell.model_meta`), with `role_colon` replaced by `RoleColonToolRenderer` (the toy
    models: a byte tokenizer, no chat markers). SmolLM2-Instruct gets `smollm2` (its own
    ChatML template; Hermes `<tool_call>` blocks, tool results as role `tool`)."""
    name = get_recommended_renderer_name(base_model)
    if name == "role_colon":
        return RoleColonToolRenderer(tokenizer)
    return get_renderer(name, tokenizer)


def conversation_prefix(config: AgentConfig) -> list[Message]:
    """The messages before each question: the system message, if `config.system_prompt`."""
    return [{"role": "system", "content": config.system_prompt}] if config.system_prompt else []


def _shifted_datum(renderer: Renderer, messages: list[Message]) -> tinker.Datum:
    """A `cross_entropy` datum of one transcript (position `i` predicts token `i + 1`)."""
    model_input, weights_T = renderer.build_supervised_example(
        messages, TrainOnWhat.ALL_ASSISTANT_MESSAGES
    )
    tokens_T = np.asarray(model_input.to_ints(), np.int64)
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(tokens_T[:-1].tolist()),
        loss_fn_inputs={
            "target_tokens": tinker.TensorData.from_numpy(tokens_T[1:]),
            "weights": tinker.TensorData.from_numpy(np.asarray(weights_T[1:], np.float32)),
        },
    )


def _warmup_key(config: AgentConfig, seed: int) -> str:
    fields = {
        name: getattr(config, name)
        for name in (
            "base_model",
            "lora_rank",
            "system_prompt",
            "min_operand",
            "max_operand",
            "num_train",
            "num_test",
            "p_tool",
            "warmup_steps",
            "warmup_batch",
            "warmup_lr",
        )
    }
    fields["seed"] = seed
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
    return f"seed{seed}-{digest}"


async def _warm_up(
    *,
    config: AgentConfig,
    seed: int,
    corpus_key: jax.Array,
    problems: Any,
    renderer: Renderer,
    log_dir: Path,
    progress: bool,
) -> tuple[str, bool, float]:
    """`(state_path, cached, final_loss_per_token)` of the warmed-up model (full weights for
    a toy model, LoRA adapters of rank `config.lora_rank` for a pretrained one)."""
    from shell.local import LocalServiceClient

    entry = log_dir / "warmup" / _warmup_key(config, seed)
    record_path = entry / "warmup.json"
    if record_path.exists():
        record = json.loads(record_path.read_text())
        state = entry / record["state_path"]
        if (state / "manifest.json").exists():
            return str(state), True, float(record["final_loss_per_token"])
    service = LocalServiceClient(seed=seed, checkpoint_dir=entry)
    trainer = await service.create_lora_training_client(
        base_model=config.base_model, rank=config.lora_rank
    )
    pick_key, style_key = jax.random.split(corpus_key)
    num_docs = config.warmup_steps * config.warmup_batch
    index = np.asarray(jax.random.randint(pick_key, (num_docs,), 0, len(problems))).tolist()
    prefix = conversation_prefix(config)
    corpus = [
        prefix + messages
        for messages in corpus_conversations(
            style_key, [problems[i] for i in index], p_tool=config.p_tool
        )
    ]
    report_every = max(1, config.warmup_steps // 10)
    adam = tinker.AdamParams(learning_rate=config.warmup_lr, beta1=0.9, beta2=0.95, eps=1e-8)
    records: list[dict[str, float]] = []
    loss_per_token = float("nan")
    for step in range(config.warmup_steps):
        batch = corpus[step * config.warmup_batch : (step + 1) * config.warmup_batch]
        data = [_shifted_datum(renderer, messages) for messages in batch]
        lr = config.warmup_lr * (1.0 - step / config.warmup_steps)
        loss_per_token = await supervised_step(trainer, data, adam, lr)
        records.append({"step": step, "loss_per_token": loss_per_token})
        if progress and ((step + 1) % report_every == 0 or step + 1 == config.warmup_steps):
            print(
                f"warm-up step {step + 1}/{config.warmup_steps}: loss per token "
                f"{loss_per_token:.4f}",
                flush=True,
            )
    (log_dir / WARMUP_METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
    saved = await trainer.save_state("warmup", overwrite=True)
    entry.mkdir(parents=True, exist_ok=True)
    state_rel = str(Path(saved.path).resolve().relative_to(entry.resolve()))
    temp = record_path.with_suffix(".tmp")
    temp.write_text(finite_json({"state_path": state_rel, "final_loss_per_token": loss_per_token}))
    temp.replace(record_path)
    return str(saved.path), False, loss_per_token


async def run_agent_async(
    *, seed: int, log_dir: Path, config: AgentConfig | None = None, progress: bool = True
) -> dict[str, Any]:
    """Runs the agent demo (see the module docstring) and writes `summary.json`; returns it.

    Args:
        seed: seeds the split, the corpus, the model, sampling and the loop.
        log_dir: where the run's files go (created).
        config: the recipe (default `AgentConfig()`).
        progress: print the loop's per-step lines.
    """
    from shell.local import LocalServiceClient

    start = time.perf_counter()
    config = config or AgentConfig()
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    split_key, corpus_key, rl_key = jax.random.split(jax.random.key(seed), 3)
    train_problems, test_problems = split_tool_problems(
        split_key,
        min_operand=config.min_operand,
        max_operand=config.max_operand,
        num_train=config.num_train,
        num_test=config.num_test,
    )
    warmup_start = time.perf_counter()
    tokenizer = get_tokenizer(config.base_model)
    renderer = agent_renderer(config.base_model, tokenizer)
    state_path, cached, warmup_loss = await _warm_up(
        config=config,
        seed=seed,
        corpus_key=corpus_key,
        problems=train_problems,
        renderer=renderer,
        log_dir=log_dir,
        progress=progress,
    )
    warmup_s = time.perf_counter() - warmup_start
    dataset, test_dataset = _agent_datasets(
        train_problems, test_problems, renderer, config=config, key=rl_key
    )
    train_config = _agent_train_config(config, seed=seed, log_dir=log_dir, progress=progress)
    service = BaseModelServiceClient(
        LocalServiceClient(seed=seed, checkpoint_dir=log_dir / "local_states"),
        base_model=config.base_model,
        base_state_path=state_path,
    )
    rl_start = time.perf_counter()
    result = await train(
        train_config,
        dataset=dataset,
        test_dataset=test_dataset,
        service_client=service,
        tokenizer=tokenizer,
        recipe_options=recipe_options(
            "agent", msgspec.to_builtins(config), may_change=AGENT_RESUME_MAY_CHANGE
        ),
    )
    rl_s = time.perf_counter() - rl_start
    summary = _agent_summary(
        seed,
        config,
        result,
        metrics_path=log_dir / METRICS_FILE,
        start=start,
        warmup_s=warmup_s,
        warmup_cached=cached,
        warmup_loss=warmup_loss,
        rl_s=rl_s,
        num_train_problems=len(train_problems),
        num_test_problems=len(test_problems),
    )
    (log_dir / SUMMARY_FILE).write_text(finite_json(summary, indent=2) + "\n")
    return summary


def _agent_summary(
    seed: int,
    config: AgentConfig,
    result: TrainResult,
    *,
    metrics_path: Path,
    start: float,
    warmup_s: float,
    warmup_cached: bool,
    warmup_loss: float,
    rl_s: float,
    num_train_problems: int,
    num_test_problems: int,
) -> dict[str, Any]:
    """The `summary.json` record: held-out accuracy and tool use before and after (read from
    `metrics_path`), steps, the time split (`wall_s` since `start`, a `perf_counter` value)
    and the recipe."""
    before, after = eval_metric_before_after(metrics_path, "test/env/all/correct")
    tool_before, tool_after = eval_metric_before_after(metrics_path, "test/env/all/used_tool")
    return {
        "seed": seed,
        "base_model": config.base_model,
        "accuracy_before": before,
        "accuracy_after": after,
        "tool_use_before": tool_before,
        "tool_use_after": tool_after,
        "steps": result.end_step,
        "resumed_from_step": result.start_step,
        "wall_s": round(time.perf_counter() - start, 2),
        "warmup_s": round(warmup_s, 2),
        "warmup_cached": warmup_cached,
        "warmup_final_loss_per_token": warmup_loss,
        "rl_s": round(rl_s, 2),
        "num_train_problems": num_train_problems,
        "num_test_problems": num_test_problems,
        "reward_curve": result.reward_curve,
        "recipe": msgspec.to_builtins(config),
    }


def _agent_datasets(
    train_problems: Sequence[ToolProblem],
    test_problems: Sequence[ToolProblem],
    renderer: Renderer,
    *,
    config: AgentConfig,
    key: jax.Array,
) -> tuple[AgentDataset, AgentDataset]:
    """The training dataset (`rl_steps` batches, groups keyed by `key`) and the held-out one
    (every test problem once, in one batch), both after `conversation_prefix(config)`."""
    prefix = conversation_prefix(config)
    dataset = AgentDataset(
        train_problems,
        renderer,
        num_batches=config.rl_steps,
        groups_per_batch=config.groups_per_batch,
        group_size=config.group_size,
        key=key,
        max_turns=config.max_turns,
        format_coef=config.format_coef,
        convo_prefix=prefix,
    )
    test_dataset = AgentDataset(
        test_problems,
        renderer,
        num_batches=1,
        groups_per_batch=len(test_problems),
        group_size=1,
        key=None,
        max_turns=config.max_turns,
        format_coef=config.format_coef,
        convo_prefix=prefix,
    )
    return dataset, test_dataset


def _agent_train_config(
    config: AgentConfig, *, seed: int, log_dir: Path, progress: bool
) -> TrainConfig:
    """The GRPO stage's `TrainConfig`: local backend, importance sampling, greedy evaluation."""
    return TrainConfig(
        log_dir=str(log_dir),
        backend="local",
        base_model=config.base_model,
        lora_rank=config.lora_rank,
        seed=seed,
        max_steps=config.rl_steps,
        learning_rate=config.rl_lr,
        adam_eps=1e-8,
        loss_fn="importance_sampling",
        max_tokens=config.max_tokens,
        temperature=config.temperature,
        advantage_estimator="group_centered",
        eval_every=config.eval_every,
        eval_temperature=0.0,
        num_groups_to_log=config.num_groups_to_log,
        progress=progress,
    )


def run_agent(
    *, seed: int, log_dir: Path, config: AgentConfig | None = None, progress: bool = True
) -> dict[str, Any]:
    """`run_agent_async` in a fresh event loop."""
    return asyncio.run(
        run_agent_async(seed=seed, log_dir=log_dir, config=config, progress=progress)
    )
