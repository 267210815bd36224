"""The offline GRPO demo, `rlpure demo`: a "base model" pretraining stage, then GRPO on arithmetic.

Everything runs on the local JAX backend (`shell.local_backend.LocalServiceClient`), through the
same code used against Tinker: the envs (`shell.env.ProblemEnv`), rollouts, datums, the
training loop (`shell.train.train`) and its logs (`metrics.jsonl`, `samples.jsonl`,
`reward_curve.png`). The recipe:

1. **Problems** (`rlpure.arithmetic`): `a + b` with `a, b in [0, max_operand]`, shuffled by
   the seed and split into `num_test` held-out test problems and the rest for training. The
   prompt is the `role_colon` rendering `[BOS]User: 3+5\\n\\nAssistant:`; a well-formed
   answer is `" 8\\n\\nUser:"` or `" =8\\n\\nUser:"`, graded exactly.
2. **Base model** (`pretrain_base_model`): cross-entropy (answer tokens weighted, prompt not)
   through the backend's `forward_backward` on a corpus whose format is always right but whose
   answers are right only with probability `p_correct`: a careful writer completes the
   equation (`"=8"`), a hasty one guesses a near miss (`"9"`); see
   `rlpure.arithmetic.corpus_responses`. The corpus covers the whole problem space, as a base
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
3. **GRPO** (`shell.train.train`, `importance_sampling` loss, group-centred advantages): the
   service handed to the loop starts every training client from the cached base model
   (`BaseModelServiceClient`), exactly as a Tinker run starts from a pretrained base. Rewards
   (`ProblemEnv`: 1 for a right answer, −`format_coef` for a malformed one) are computed on the
   training problems only; the held-out test problems never get a reward or a correct label
   during training: they are only evaluated, greedily, before the first step, every
   `eval_every` steps and at the end.

`summary.json` in the log dir records `seed`, `accuracy_before` / `accuracy_after` (held-out
greedy accuracy at step 0 and after the last step), `steps`, `wall_s` (the whole command,
compilation included), the time split, and the recipe.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import msgspec
import numpy as np
import tinker

from rlpure import arithmetic
from rlpure.arithmetic import ArithmeticProblem
from rlpure.render import Renderer, get_renderer
from rlpure.tokenizer import ByteTokenizer
from shell.cli import command
from shell.config import TrainConfig
from shell.env import EnvGroupBuilder, ProblemEnv, ProblemGroupBuilder, RLDataset
from shell.logs import METRICS_FILE, read_jsonl
from shell.train import train

__all__ = [
    "ArithmeticDataset",
    "ArithmeticEnv",
    "BaseModelServiceClient",
    "DemoConfig",
    "PretrainResult",
    "add_demo_arguments",
    "demo_main",
    "pretrain_base_model",
    "pretraining_datum",
    "run_demo",
    "run_demo_async",
]

logger = logging.getLogger(__name__)

SUMMARY_FILE = "summary.json"
PRETRAIN_METRICS_FILE = "pretrain_metrics.jsonl"
_BASE_RECORD = "base_model.json"


class DemoConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The demo's recipe (defaults: the benchmarked one).

    Attributes:
        base_model: local model config (`rlpure.model.MODEL_CONFIGS`).
        max_operand: operands lie in `[0, max_operand]`.
        num_test: held-out test problems.
        p_correct: probability that the pretraining corpus answers right (careful style).
        p_high: probability that it guesses `sum + 1` (else `sum − 1`).
        pretrain_steps: cross-entropy steps of the base-model stage.
        pretrain_batch: documents per pretraining step.
        pretrain_lr: Adam learning rate of the pretraining stage.
        rl_steps: GRPO steps.
        groups_per_batch: problems per GRPO step (`P`).
        group_size: samples per problem (`G`).
        rl_lr: Adam learning rate of GRPO.
        max_tokens: sampled tokens per answer.
        eval_every: greedy test evaluation every N GRPO steps (and always at 0 and the end).
        format_coef: reward penalty of a malformed answer.
    """

    base_model: str = "rlpure/tiny"
    max_operand: int = 9
    num_test: int = 20
    p_correct: float = 0.3
    p_high: float = 0.7
    pretrain_steps: int = 600
    pretrain_batch: int = 64
    pretrain_lr: float = 3e-3
    rl_steps: int = 40
    groups_per_batch: int = 16
    group_size: int = 8
    rl_lr: float = 3e-4
    max_tokens: int = 16
    eval_every: int = 5
    format_coef: float = 0.1

    def __post_init__(self) -> None:
        for name in (
            "max_operand",
            "num_test",
            "pretrain_batch",
            "rl_steps",
            "groups_per_batch",
            "group_size",
            "max_tokens",
            "eval_every",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"DemoConfig.{name}: expected >= 1, got {getattr(self, name)}")
        if self.pretrain_steps < 0:
            raise ValueError(f"DemoConfig.pretrain_steps: expected >= 0, got {self.pretrain_steps}")
        for name in ("pretrain_lr", "rl_lr"):
            if not getattr(self, name) > 0:
                raise ValueError(f"DemoConfig.{name}: expected > 0, got {getattr(self, name)}")


# --- envs and datasets -------------------------------------------------------------------------


class ArithmeticEnv(ProblemEnv):
    """One `a + b` question; correct iff the answer is exactly the sum (strict format)."""

    def __init__(
        self, problem: ArithmeticProblem, renderer: Renderer, *, format_coef: float = 0.1
    ) -> None:
        super().__init__(renderer, format_coef=format_coef)
        self.problem = problem

    def get_question(self) -> str:
        return arithmetic.problem_question(self.problem)

    def check_answer(self, sample_str: str) -> bool:
        return arithmetic.grade_response(sample_str, self.problem)

    def check_format(self, sample_str: str) -> bool:
        return arithmetic.check_answer_format(sample_str)

    def get_reference_answer(self) -> str:
        return str(self.problem.answer)


def _group_builder(
    problem: ArithmeticProblem, renderer: Renderer, *, group_size: int, format_coef: float
) -> ProblemGroupBuilder:
    def make_env() -> ProblemEnv:
        return ArithmeticEnv(problem, renderer, format_coef=format_coef)

    return ProblemGroupBuilder(env_thunk=make_env, num_envs=group_size, dataset_name="arithmetic")


class ArithmeticDataset(RLDataset):
    """Batches of arithmetic problems: batch `i` draws `groups_per_batch` distinct problems.

    With `key=None` the dataset is one batch holding every problem in order (for evaluation).

    Args:
        problems: the problems to draw from.
        renderer: the prompt renderer.
        num_batches: number of batches (`len`).
        groups_per_batch: problems per batch (at most `len(problems)`).
        group_size: envs per problem.
        key: JAX key; batch `i` uses `fold_in(key, i)` (None: evaluation order, one batch).
        format_coef: reward penalty of a malformed answer.
    """

    def __init__(
        self,
        problems: Sequence[ArithmeticProblem],
        renderer: Renderer,
        *,
        num_batches: int,
        groups_per_batch: int,
        group_size: int,
        key: jax.Array | None,
        format_coef: float = 0.1,
    ) -> None:
        if not problems:
            raise ValueError("ArithmeticDataset.problems: empty")
        if not 1 <= groups_per_batch <= len(problems):
            raise ValueError(
                f"ArithmeticDataset.groups_per_batch: expected in [1, {len(problems)}], got "
                f"{groups_per_batch}"
            )
        self.problems = tuple(problems)
        self.renderer = renderer
        self.num_batches = num_batches
        self.groups_per_batch = groups_per_batch
        self.group_size = group_size
        self.key = key
        self.format_coef = format_coef

    def __len__(self) -> int:
        return self.num_batches

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        if not 0 <= index < self.num_batches:
            raise IndexError(f"ArithmeticDataset.get_batch: index {index} not in [0, {len(self)})")
        if self.key is None:
            chosen = list(range(self.groups_per_batch))
        else:
            chosen = np.asarray(
                jax.random.choice(
                    jax.random.fold_in(self.key, index),
                    len(self.problems),
                    (self.groups_per_batch,),
                    replace=False,
                )
            ).tolist()
        return [
            _group_builder(
                self.problems[i],
                self.renderer,
                group_size=self.group_size,
                format_coef=self.format_coef,
            )
            for i in chosen
        ]


# --- the base-model stage ----------------------------------------------------------------------


def pretraining_datum(renderer: Renderer, question: str, answer: str) -> tinker.Datum:
    """A `cross_entropy` datum for one corpus document `User: q / Assistant: a`.

    The renderer's supervised example (weight 1 on `" {answer}\\n\\nUser:"`, 0 on the prompt)
    shifted to Tinker's convention: input `tokens[:-1]`, `target_tokens = tokens[1:]`,
    `weights = weights[1:]`.
    """
    example = renderer.build_supervised_example(
        [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    )
    tokens_T = np.asarray(example.model_input.to_ints(), np.int64)
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(tokens_T[:-1].tolist()),
        loss_fn_inputs={
            "target_tokens": tinker.TensorData.from_numpy(tokens_T[1:]),
            "weights": tinker.TensorData.from_numpy(np.asarray(example.weights_T[1:], np.float32)),
        },
    )


class PretrainResult(msgspec.Struct, frozen=True, kw_only=True):
    """Where the base model's state lives and what producing it cost.

    Attributes:
        state_path: the backend's `save_state` path of the base model.
        cached: whether it was loaded from the cache instead of trained.
        seconds: wall time of the stage (just the cache lookup when cached).
        final_loss_per_token: mean cross-entropy per weighted token of the last step (NaN
            when cached).
    """

    state_path: str
    cached: bool
    seconds: float
    final_loss_per_token: float


def _pretrain_cache_key(config: DemoConfig, seed: int) -> str:
    fields = {
        "seed": seed,
        "base_model": config.base_model,
        "max_operand": config.max_operand,
        "num_test": config.num_test,
        "p_correct": config.p_correct,
        "p_high": config.p_high,
        "pretrain_steps": config.pretrain_steps,
        "pretrain_batch": config.pretrain_batch,
        "pretrain_lr": config.pretrain_lr,
        "format": 4,
    }
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
    return f"seed{seed}-{digest}"


def _demo_keys(seed: int) -> dict[str, jax.Array]:
    split, corpus, rl = jax.random.split(jax.random.key(seed), 3)
    return {"split": split, "corpus": corpus, "rl": rl}


async def pretrain_base_model(
    *,
    config: DemoConfig,
    seed: int,
    corpus_problems: Sequence[ArithmeticProblem],
    cache_dir: Path,
    metrics_path: Path | None = None,
) -> PretrainResult:
    """Trains (or loads from `cache_dir`) the base model on the noisy corpus.

    The corpus is `pretrain_steps · pretrain_batch` documents: problems drawn uniformly (with
    replacement) from `corpus_problems`, responses from `corpus_responses`, both keyed by the
    seed's corpus key. Step `s` trains on documents `[s·B, (s+1)·B)` with
    `forward_backward(..., "cross_entropy")` and `optim_step` (learning rate decaying linearly
    from `pretrain_lr` to 0) on a `LocalServiceClient(seed=seed)` training client.

    Args:
        config: the recipe.
        seed: the run's seed.
        corpus_problems: the questions the corpus may ask.
        cache_dir: parent of the cache entry `<cache_dir>/<key>/`.
        metrics_path: where to write one JSON line per step (`step`, `loss_per_token`).

    Returns:
        The base model's state path and the stage's cost.
    """
    from shell.local_backend import LocalServiceClient

    start = time.perf_counter()
    entry = cache_dir / _pretrain_cache_key(config, seed)
    record_path = entry / _BASE_RECORD
    if record_path.exists():
        record = json.loads(record_path.read_text())
        if Path(record["state_path"], "manifest.json").exists():
            logger.info("Base model: cached at %s", record["state_path"])
            return PretrainResult(
                state_path=record["state_path"],
                cached=True,
                seconds=time.perf_counter() - start,
                final_loss_per_token=float(record["final_loss_per_token"]),
            )
    service = LocalServiceClient(seed=seed, checkpoint_dir=entry)
    trainer = await service.create_lora_training_client(base_model=config.base_model)
    renderer = get_renderer("role_colon", trainer.get_tokenizer())
    corpus_key = _demo_keys(seed)["corpus"]
    adam = tinker.AdamParams(learning_rate=config.pretrain_lr, beta1=0.9, beta2=0.95, eps=1e-8)
    loss_per_token = float("nan")
    records: list[dict[str, float]] = []
    # The whole corpus up front (one PRNG call each, not one per step): S·B documents.
    pick_key, answer_key = jax.random.split(corpus_key)
    num_docs = config.pretrain_steps * config.pretrain_batch
    index_SB = np.asarray(jax.random.randint(pick_key, (num_docs,), 0, len(corpus_problems)))
    corpus = [corpus_problems[i] for i in index_SB.tolist()]
    responses_SB = arithmetic.corpus_responses(
        answer_key, corpus, p_correct=config.p_correct, p_high=config.p_high
    )
    for step in range(config.pretrain_steps):
        batch = slice(step * config.pretrain_batch, (step + 1) * config.pretrain_batch)
        problems, responses = corpus[batch], responses_SB[batch]
        data = [
            pretraining_datum(renderer, arithmetic.problem_question(p), response)
            for p, response in zip(problems, responses, strict=True)
        ]
        # Linear decay to 0: the last steps settle on the corpus distribution.
        lr = config.pretrain_lr * (1.0 - step / config.pretrain_steps)
        fb_future = trainer.forward_backward(data, "cross_entropy")
        optim_future = trainer.optim_step(adam.model_copy(update={"learning_rate": lr}))
        fb = await fb_future
        await optim_future
        num_tokens = sum(float(d.loss_fn_inputs["weights"].to_numpy().sum()) for d in data)
        loss_per_token = float(fb.metrics["loss:sum"]) / num_tokens
        records.append({"step": step, "loss_per_token": loss_per_token})
        if (step + 1) % 100 == 0 or step + 1 == config.pretrain_steps:
            logger.info(
                "Base model: pretraining step %d/%d, loss per token %.4f",
                step + 1,
                config.pretrain_steps,
                loss_per_token,
            )
    if metrics_path is not None:
        # written once at the end: one fsynced JsonlWriter line per step would cost seconds
        metrics_path.write_text("".join(json.dumps(r) + "\n" for r in records))
    saved = await trainer.save_state("base", overwrite=True)
    entry.mkdir(parents=True, exist_ok=True)
    record_path.write_text(
        json.dumps({"state_path": str(saved.path), "final_loss_per_token": loss_per_token})
    )
    return PretrainResult(
        state_path=str(saved.path),
        cached=False,
        seconds=time.perf_counter() - start,
        final_loss_per_token=loss_per_token,
    )


class BaseModelServiceClient:
    """A service client whose new training clients start from a pretrained base state.

    `create_lora_training_client(base_model=...)` (what `shell.train.train` calls) returns a
    client created with `create_training_client_from_state(base_state_path)`: the base
    model's weights and a fresh optimizer. Everything else is the wrapped service's.

    Args:
        service: a `LocalServiceClient` (or any client with the SDK's methods).
        base_model: the model name the base state was trained from.
        base_state_path: the base model's `save_state` path.
    """

    def __init__(self, service: Any, *, base_model: str, base_state_path: str) -> None:
        self._service = service
        self.base_model = base_model
        self.base_state_path = base_state_path

    def __getattr__(self, name: str) -> Any:
        return getattr(self._service, name)

    def create_lora_training_client(self, base_model: str, rank: int = 32, **kwargs: Any) -> Any:
        if base_model != self.base_model:
            raise ValueError(
                f"BaseModelServiceClient: asked for base model {base_model!r}, holds a "
                f"pretrained {self.base_model!r}"
            )
        return self._service.create_training_client_from_state(self.base_state_path)

    async def create_lora_training_client_async(
        self, base_model: str, rank: int = 32, **kwargs: Any
    ) -> Any:
        return await self.create_lora_training_client(base_model, rank, **kwargs)


# --- the demo ----------------------------------------------------------------------------------


def _accuracy_before_after(metrics_path: Path) -> tuple[float | None, float | None]:
    key = "test/env/all/correct"
    records = [r for r in read_jsonl(metrics_path) if r.get(key) is not None]
    if not records:
        return None, None
    before = next((r[key] for r in records if r["step"] == 0 and not r.get("final_eval")), None)
    finals = [r[key] for r in records if r.get("final_eval")]
    return before, (finals[-1] if finals else None)


async def run_demo_async(
    *,
    seed: int,
    log_dir: Path,
    config: DemoConfig | None = None,
    cache_dir: Path | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Runs the demo (see the module docstring) and writes `summary.json`; returns it.

    Args:
        seed: seeds the split, the corpus, the base model, sampling and the loop.
        log_dir: where the run's files go (created).
        config: the recipe (default `DemoConfig()`).
        cache_dir: base-model cache (default `<log_dir>/base_model`).
        progress: print the loop's per-step lines.
    """
    from shell.local_backend import LocalServiceClient

    start = time.perf_counter()
    config = config or DemoConfig()
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    cache_dir = Path(cache_dir) if cache_dir is not None else log_dir / "base_model"
    keys = _demo_keys(seed)
    split = arithmetic.split_problems(
        keys["split"], max_operand=config.max_operand, num_test=config.num_test
    )
    base = await pretrain_base_model(
        config=config,
        seed=seed,
        corpus_problems=arithmetic.all_problems(max_operand=config.max_operand),
        cache_dir=cache_dir,
        metrics_path=log_dir / PRETRAIN_METRICS_FILE,
    )
    tokenizer = ByteTokenizer()
    renderer = get_renderer("role_colon", tokenizer)
    dataset = ArithmeticDataset(
        split.train,
        renderer,
        num_batches=config.rl_steps,
        groups_per_batch=min(config.groups_per_batch, len(split.train)),
        group_size=config.group_size,
        key=keys["rl"],
        format_coef=config.format_coef,
    )
    test_dataset = ArithmeticDataset(
        split.test,
        renderer,
        num_batches=1,
        groups_per_batch=len(split.test),
        group_size=1,
        key=None,
        format_coef=config.format_coef,
    )
    train_config = TrainConfig(
        log_dir=str(log_dir),
        backend="local",
        base_model=config.base_model,
        seed=seed,
        max_steps=config.rl_steps,
        learning_rate=config.rl_lr,
        adam_eps=1e-8,
        loss_fn="importance_sampling",
        max_tokens=config.max_tokens,
        temperature=1.0,
        advantage_estimator="group_centered",
        eval_every=config.eval_every,
        progress=progress,
    )
    service = BaseModelServiceClient(
        LocalServiceClient(seed=seed, checkpoint_dir=log_dir / "local_states"),
        base_model=config.base_model,
        base_state_path=base.state_path,
    )
    rl_start = time.perf_counter()
    result = await train(
        train_config,
        dataset=dataset,
        test_dataset=test_dataset,
        service_client=service,
        tokenizer=tokenizer,
    )
    rl_seconds = time.perf_counter() - rl_start
    before, after = _accuracy_before_after(log_dir / METRICS_FILE)
    wall_s = time.perf_counter() - start
    ran = result.end_step - result.start_step
    summary: dict[str, Any] = {
        "seed": seed,
        "accuracy_before": before,
        "accuracy_after": after,
        "steps": result.end_step,
        "resumed_from_step": result.start_step,
        "wall_s": round(wall_s, 2),
        "pretrain_s": round(base.seconds, 2),
        "pretrain_cached": base.cached,
        "pretrain_final_loss_per_token": base.final_loss_per_token,
        "rl_s": round(rl_seconds, 2),
        "rl_steps_per_s": round(ran / rl_seconds, 3) if ran and rl_seconds > 0 else None,
        "num_train_problems": len(split.train),
        "num_test_problems": len(split.test),
        "reward_curve": result.reward_curve,
        "recipe": msgspec.to_builtins(config),
    }
    (log_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def run_demo(
    *,
    seed: int,
    log_dir: Path,
    config: DemoConfig | None = None,
    cache_dir: Path | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """`run_demo_async` in a fresh event loop (for scripts and benchmarks)."""
    return asyncio.run(
        run_demo_async(
            seed=seed, log_dir=log_dir, config=config, cache_dir=cache_dir, progress=progress
        )
    )


# --- the command -------------------------------------------------------------------------------


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds `--seed`, `--log-dir`, `--cache-dir` and the recipe's main knobs to `parser`.

    A log dir that already holds a run resumes it (`shell.train.train` semantics): a finished
    run is not retrained, its summary is rewritten from its `metrics.jsonl`.
    """
    defaults = DemoConfig()
    parser.add_argument("--seed", type=int, default=0, help="Seed of the whole run (default 0).")
    parser.add_argument(
        "--log-dir",
        type=Path,
        default=None,
        help="Where metrics.jsonl, reward_curve.png and summary.json go "
        "(default runs/demo-seed<N>).",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="Cache of the pretrained base model (default <log-dir>/base_model).",
    )
    parser.add_argument("--rl-steps", type=int, default=defaults.rl_steps, help="GRPO steps.")
    parser.add_argument(
        "--rl-lr", type=float, default=defaults.rl_lr, help="Adam learning rate of GRPO."
    )
    parser.add_argument(
        "--pretrain-steps",
        type=int,
        default=defaults.pretrain_steps,
        help="Cross-entropy steps of the base-model stage.",
    )
    parser.add_argument(
        "--groups-per-batch", type=int, default=defaults.groups_per_batch, help="Problems per step."
    )
    parser.add_argument(
        "--group-size", type=int, default=defaults.group_size, help="Samples per problem."
    )
    parser.add_argument("--quiet", action="store_true", help="Do not print per-step lines.")


def demo_main(args: argparse.Namespace) -> int:
    """Runs the demo from parsed arguments, prints the summary; exit code 0."""
    config = DemoConfig(
        rl_steps=args.rl_steps,
        rl_lr=args.rl_lr,
        pretrain_steps=args.pretrain_steps,
        groups_per_batch=args.groups_per_batch,
        group_size=args.group_size,
    )
    log_dir = args.log_dir if args.log_dir is not None else Path(f"runs/demo-seed{args.seed}")
    summary = run_demo(
        seed=args.seed,
        log_dir=log_dir,
        config=config,
        cache_dir=args.cache_dir,
        progress=not args.quiet,
    )
    print(
        f"rlpure demo (seed {summary['seed']}): held-out greedy accuracy "
        f"{summary['accuracy_before']} -> {summary['accuracy_after']} in {summary['steps']} "
        f"GRPO steps, {summary['wall_s']:.1f} s; files in {log_dir}"
    )
    return 0


command(
    "demo",
    help="Offline GRPO demo: pretrain a tiny base model, then GRPO on arithmetic (local backend).",
    add_arguments=add_demo_arguments,
)(demo_main)
