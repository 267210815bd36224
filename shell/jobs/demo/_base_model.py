"""The demo's base model: a noisy pretraining corpus, its cache, and a service starting from it.

Part of `rlpure demo` (see `shell.jobs.demo` for why the corpus looks as it does). Conventions:
- `pretraining_datum` shifts the renderer's supervised example to Tinker's `cross_entropy`
  convention: position `i` of the input predicts `target_tokens[i]`, the next token; `weights`
  is 1 on the answer tokens and 0 on the prompt.
- `pretrain_base_model` caches the trained state under `<cache_dir>/<key>/`, where the key is
  made of the seed and every pretraining option; an entry counts only if its record
  (`base_model.json`) and the state's `manifest.json` both exist.
- `BaseModelServiceClient` makes every new training client start from that state, as a
  Tinker run starts from a pretrained base.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import msgspec
import numpy as np
import tinker
from tinker.lib.retry_handler import RetryConfig

from rlpure.render import Renderer, get_renderer
from rlpure.tasks import arithmetic
from rlpure.tasks.arithmetic import ArithmeticProblem
from shell.clients import APIFuture, SamplingClient, ServiceClient, TrainingClient
from shell.jobs.demo._config import DemoConfig, demo_keys

__all__ = [
    "BaseModelServiceClient",
    "PretrainResult",
    "pretrain_base_model",
    "pretraining_datum",
    "supervised_step",
]

# Named for the demo's public module, so the demo's log lines read as before the split.
logger = logging.getLogger("shell.jobs.demo")

_BASE_RECORD = "base_model.json"


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


async def supervised_step(
    trainer: TrainingClient,
    data: list[tinker.Datum],
    adam: tinker.AdamParams,
    learning_rate: float,
) -> float:
    """One cross-entropy step on `data` at `learning_rate` (the other Adam settings from
    `adam`): `forward_backward` and `optim_step` submitted back to back, as the cookbook's
    supervised loop pipelines them. Returns the loss per weighted token (`loss:sum` over the
    sum of the datums' `weights`). Shared by the demo's pretraining and the tool-use recipe's
    warm-up."""
    fb_future = trainer.forward_backward(data, "cross_entropy")
    optim_future = trainer.optim_step(adam.model_copy(update={"learning_rate": learning_rate}))
    fb = await fb_future
    await optim_future
    num_tokens = sum(float(d.loss_fn_inputs["weights"].to_numpy().sum()) for d in data)
    return float(fb.metrics["loss:sum"]) / num_tokens


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


def _read_base_record(record_path: Path) -> dict[str, Any] | None:
    """The cache entry's record, or None when absent or unusable (torn, invalid): the base
    model is then rebuilt (a warning names the file) instead of failing every later demo."""
    try:
        text = record_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        record = json.loads(text)
        if not isinstance(record["state_path"], str):
            raise TypeError("state_path is not a string")
        float(record["final_loss_per_token"])
    except (ValueError, TypeError, KeyError) as err:
        logger.warning("Base model: ignoring unusable %s (%s); pretraining again", record_path, err)
        return None
    return dict(record)


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
    from shell.local import LocalServiceClient

    start = time.perf_counter()
    entry = cache_dir / _pretrain_cache_key(config, seed)
    cached = _cached_base_state(entry)
    if cached is not None:
        cached_state, final_loss_per_token = cached
        logger.info("Base model: cached at %s", cached_state)
        return PretrainResult(
            state_path=str(cached_state),
            cached=True,
            seconds=time.perf_counter() - start,
            final_loss_per_token=final_loss_per_token,
        )
    service = LocalServiceClient(seed=seed, checkpoint_dir=entry)
    trainer: TrainingClient = await service.create_lora_training_client(
        base_model=config.base_model
    )
    renderer = get_renderer("role_colon", trainer.get_tokenizer())
    corpus, responses_SB = _pretraining_corpus(config, seed, corpus_problems)
    loss_per_token, records = await _pretrain_steps(
        trainer, renderer, corpus, responses_SB, config=config
    )
    if metrics_path is not None:
        # written once at the end: one fsynced JsonlWriter line per step would cost seconds
        metrics_path.write_text("".join(json.dumps(r) + "\n" for r in records))
    saved = await trainer.save_state("base", overwrite=True)
    _write_base_record(entry, saved.path, loss_per_token)
    return PretrainResult(
        state_path=str(saved.path),
        cached=False,
        seconds=time.perf_counter() - start,
        final_loss_per_token=loss_per_token,
    )


def _cached_base_state(entry: Path) -> tuple[Path, float] | None:
    """The cache entry's state path and final loss per token, or None when it is incomplete."""
    record = _read_base_record(entry / _BASE_RECORD)
    # Stored relative to the cache entry, so a moved log dir keeps its cache (an absolute path
    # from an earlier version still works where it exists).
    cached_state = entry / record["state_path"] if record is not None else None
    if (
        record is not None
        and cached_state is not None
        and (cached_state / "manifest.json").exists()
    ):
        return cached_state, float(record["final_loss_per_token"])
    return None


def _pretraining_corpus(
    config: DemoConfig, seed: int, corpus_problems: Sequence[ArithmeticProblem]
) -> tuple[list[ArithmeticProblem], list[str]]:
    """The whole corpus up front (one PRNG call each, not one per step): `S·B` documents'
    problems and their responses, keyed by the seed's corpus key."""
    pick_key, answer_key = jax.random.split(demo_keys(seed)["corpus"])
    num_docs = config.pretrain_steps * config.pretrain_batch
    index_SB = np.asarray(jax.random.randint(pick_key, (num_docs,), 0, len(corpus_problems)))
    corpus = [corpus_problems[i] for i in index_SB.tolist()]
    responses_SB = arithmetic.corpus_responses(
        answer_key, corpus, p_correct=config.p_correct, p_high=config.p_high
    )
    return corpus, responses_SB


async def _pretrain_steps(
    trainer: TrainingClient,
    renderer: Renderer,
    corpus: Sequence[ArithmeticProblem],
    responses_SB: Sequence[str],
    *,
    config: DemoConfig,
) -> tuple[float, list[dict[str, float]]]:
    """Runs the `pretrain_steps` supervised steps; the last loss per token and every step's."""
    adam = tinker.AdamParams(learning_rate=config.pretrain_lr, beta1=0.9, beta2=0.95, eps=1e-8)
    loss_per_token = float("nan")
    records: list[dict[str, float]] = []
    for step in range(config.pretrain_steps):
        batch = slice(step * config.pretrain_batch, (step + 1) * config.pretrain_batch)
        problems, responses = corpus[batch], responses_SB[batch]
        data = [
            pretraining_datum(renderer, arithmetic.problem_question(p), response)
            for p, response in zip(problems, responses, strict=True)
        ]
        # Linear decay to 0: the last steps settle on the corpus distribution.
        lr = config.pretrain_lr * (1.0 - step / config.pretrain_steps)
        loss_per_token = await supervised_step(trainer, data, adam, lr)
        records.append({"step": step, "loss_per_token": loss_per_token})
        if (step + 1) % 100 == 0 or step + 1 == config.pretrain_steps:
            logger.info(
                "Base model: pretraining step %d/%d, loss per token %.4f",
                step + 1,
                config.pretrain_steps,
                loss_per_token,
            )
    return loss_per_token, records


def _write_base_record(entry: Path, state_path: str, final_loss_per_token: float) -> None:
    """Writes the cache entry's record atomically: a kill mid-write leaves the old record or
    none, never a torn one. The state path is stored relative to `entry`."""
    entry.mkdir(parents=True, exist_ok=True)
    record_path = entry / _BASE_RECORD
    temp = record_path.with_name(f".{_BASE_RECORD}.tmp-{os.getpid()}")
    temp.write_text(
        json.dumps(
            {
                "state_path": os.path.relpath(state_path, os.path.abspath(entry)),
                "final_loss_per_token": final_loss_per_token,
            }
        )
    )
    os.replace(temp, record_path)


class BaseModelServiceClient:
    """A service client whose new training clients start from a pretrained base state.

    `create_lora_training_client(base_model=...)` (what `shell.training.train` calls) returns a
    client created with `create_training_client_from_state(base_state_path)`: the base
    model's weights and a fresh optimizer. Everything else is the wrapped service's: the other
    `shell.clients.ServiceClient` methods call it, and any other attribute is read from it.

    Args:
        service: a `LocalServiceClient` (or any `shell.clients.ServiceClient`).
        base_model: the model name the base state was trained from.
        base_state_path: the base model's `save_state` path.
    """

    def __init__(self, service: ServiceClient, *, base_model: str, base_state_path: str) -> None:
        self._service = service
        self.base_model = base_model
        self.base_state_path = base_state_path

    def __getattr__(self, name: str) -> Any:
        return getattr(self._service, name)

    def create_lora_training_client(
        self,
        base_model: str,
        rank: int = 32,
        seed: int | None = None,
        train_mlp: bool = True,
        train_attn: bool = True,
        train_unembed: bool = True,
        user_metadata: dict[str, str] | None = None,
        optimizer: tinker.types.OptimizerConfig | None = None,
    ) -> APIFuture[TrainingClient]:
        """A training client on the base state (`base_model` must be the one it was trained
        from; `user_metadata` and `optimizer` are passed on, the LoRA options ignored).

        Raises:
            ValueError: another `base_model`.
        """
        if base_model != self.base_model:
            raise ValueError(
                f"BaseModelServiceClient: asked for base model {base_model!r}, holds a "
                f"pretrained {self.base_model!r}"
            )
        return self._service.create_training_client_from_state(
            self.base_state_path, user_metadata=user_metadata, optimizer=optimizer
        )

    async def create_lora_training_client_async(
        self, base_model: str, rank: int = 32, **kwargs: Any
    ) -> TrainingClient:
        return await self.create_lora_training_client(base_model, rank, **kwargs)

    def create_training_client_from_state(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
        optimizer: tinker.types.OptimizerConfig | None = None,
    ) -> APIFuture[TrainingClient]:
        return self._service.create_training_client_from_state(
            path, base_model, user_metadata, weights_access_token, optimizer
        )

    def create_training_client_from_state_with_optimizer(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
    ) -> APIFuture[TrainingClient]:
        return self._service.create_training_client_from_state_with_optimizer(
            path, base_model, user_metadata, weights_access_token
        )

    def create_sampling_client(
        self,
        model_path: str | None = None,
        base_model: str | None = None,
        retry_config: RetryConfig | None = None,
        record_stability_info: bool = False,
    ) -> APIFuture[SamplingClient]:
        return self._service.create_sampling_client(
            model_path, base_model, retry_config, record_stability_info
        )
