"""The cookbook's `tinker_cookbook.rl.train`: `Config`, `KLReferenceConfig` and `main`.

`Config` is a `chz` class with the cookbook 0.6.1 field names, types, required fields and
defaults, so a cookbook recipe's `Config(...)` (or its `chz` CLI) builds it unchanged. `main`
is not a second loop: it maps `Config` onto `shell.config.TrainConfig` and runs
`shell.training.train`, which records, resumes and logs as the project's loop does
(`metrics.jsonl`, `samples.jsonl`, `checkpoints.jsonl` in `log_path`).

What `main(config, rollout_executor=None, service_client=None)` does, in order:

1. checks the whole config before anything runs: a custom loss (`loss_fn="custom"`, which this
   loop does not implement yet), or the cookbook's own errors
   (`kl_penalty_coef > 0` without `kl_reference_config`, `Config.loss_fn` conflicting with
   `AsyncConfig.loss_fn`, `stable_reinforce` with `kl_discount_factor > 0`), or what
   `TrainConfig` refuses for the backend (e.g. `stable_reinforce`, the async default, on the
   local backend; streaming minibatches that do not divide the batch) raise `ConfigError`
   (which is `shell.cookbook.exceptions.ConfigurationError`) naming the field; async runs with an
   `importance_sampling` or `cispo` loss and `max_steps_off_policy > 0` get the cookbook's
   instability warning;
2. opens the service: `tinker.ServiceClient(base_url=..., user_metadata=..., display_name=...)`
   when `service_client` is None, as the cookbook, else the given client (e.g.
   `shell.LocalServiceClient()`), which `main` does not close;
3. refuses a resume whose options changed, then opens the training client as the cookbook:
   restored from the log dir's last checkpoint (weights and optimizer), else from
   `load_checkpoint_path` (weights only), else `create_lora_training_client(model_name,
   rank=lora_rank)`;
4. registers `training_client.get_tokenizer()` under `model_name` with
   `shell.tokenizers.register_tokenizer`, **before** `await config.dataset_builder()`, so a
   cookbook builder that calls `get_tokenizer(model_name)` gets the backend's tokenizer offline;
5. builds the datasets and runs `shell.training.train` with the rollout strategy resolved from
   `rollout_error_tolerance` (`effective_rollout_strategy`) and the evaluators of
   `evaluator_builders`, group rollouts going to `rollout_executor` when one is given
   (`shell.rollouts.set_rollout_executor`).

How the fields map onto `TrainConfig`: `log_path` → `log_dir`, `model_name` → `base_model`,
`kl_discount_factor` → `kl_discount`, `kl_reference_config` → `kl_reference_model` and
`kl_reference_checkpoint`, `async_config` and `stream_minibatch_config` → the
`shell.config.AsyncConfig` / `StreamMinibatchConfig` records (async and streaming training,
`shell.training._async` and `shell.training._stream`); the optimizer, loss, sampling, KL,
cadence, epoch, step and timing fields keep their names (`save_every`, `ttl_seconds`,
`rolling_save_every` and `rolling_ttl_seconds` save as the cookbook's `CheckpointManager`, see
`shell.training._saves`; `enable_trace` writes `trace_events.jsonl` and `span_chart_every` the
`iteration_NNNNNN/timing_gantt.html` charts, as the cookbook's, from the loop's spans);
`wandb_project` and `wandb_name` log to W&B as the cookbook's `WandbLogger`
(`shell.training._trackers`). The evaluation temperature is the cookbook's 1.0. `recipe_name`
and the dataset builder's class are recorded as recipe options, so a resume with another recipe
or builder class is refused.

Extensions (rlpure's, issue 30; absent from the cookbook and off by default, so defaults stay
the cookbook's): `mismatch_correction`, `kl_penalty_estimator`, `overlong` and
`dynamic_sampling` take `shell.config`'s records and map onto the `TrainConfig` fields of the
same names. `mismatch_correction` is refused with `stable_reinforce` (the async default loss):
set `async_config.loss_fn` (or `loss_fn`) to another loss to use it.

Deliberate differences: `main` returns the `shell.training.TrainResult` (the cookbook returns
None); `renderer_name` is accepted and not used (the renderer is the dataset builder's
business); the TTLs are passed to the backend, which on the local one keeps every checkpoint
until it is deleted. `rollout_json_export=False` leaves out the `iteration_NNNNNN/`
`*_rollout_summaries.jsonl` files, as the cookbook's (rlpure's `samples.jsonl` is still written).

`run_evaluations_parallel(evaluators, sampling_client, config, i_batch, store=None)` and
`run_single_evaluation` are the cookbook's (recipes call them after `main`, e.g. forecasting's
final evaluation): the evaluators run concurrently, their metrics merge in order, and each
writes the cookbook's files under `config.log_path`'s `iteration_NNNNNN/`:
`eval_<label>.html` (a `shell.logtree` page of what the evaluator and its envs log), and through
`store` `eval_<label>_logtree.json` and, for `shell.cookbook.rl.metric_util.RLTestSetEvaluator`,
`eval_<label>_rollout_summaries.jsonl`. Deliberate difference: rlpure's rollouts do not log
their groups to logtree (the loop draws its pages from the groups afterwards), so the page
holds only what the evaluator and envs log themselves.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterator
from concurrent.futures import Executor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import chz
import tinker

from shell import logtree
from shell.clients import ServiceClient, backend_of
from shell.config import AsyncConfig as TrainAsyncConfig
from shell.config import (
    DynamicSamplingConfig,
    MismatchCorrectionConfig,
    OverlongConfig,
    TerminationConfig,
    TrainConfig,
)
from shell.config import StreamMinibatchConfig as TrainStreamMinibatchConfig
from shell.cookbook.rl.rollout_logging import RolloutSummaryExportConfig
from shell.cookbook.rl.types import RLDatasetBuilder
from shell.cookbook.utils import trace
from shell.cookbook.utils.misc_utils import iteration_dir
from shell.errors import ConfigError
from shell.evaluation import (
    RLTestSetEvaluator,
    SamplingClientEvaluator,
    SamplingClientEvaluatorBuilder,
)
from shell.rollouts import (
    RolloutStrategy,
    TerminationRewardPolicy,
    default_rollout_config_for_model,
    default_rollout_strategy_for_model,
    rollout_strategy_from_config,
    set_rollout_executor,
)
from shell.storage import TrainingRunStore
from shell.tokenizers import register_tokenizer
from shell.training import (
    TrainResult,
    checked_last_checkpoint,
    open_training_client,
    recipe_options,
    train,
)

__all__ = [
    "AsyncConfig",
    "Config",
    "KLReferenceConfig",
    "StreamMinibatchConfig",
    "main",
    "run_evaluations_parallel",
    "run_single_evaluation",
    "to_train_config",
]

logger = logging.getLogger(__name__)

LossFnType = Literal[
    "cross_entropy",
    "importance_sampling",
    "ppo",
    "cispo",
    "dro",
    "gspo",
    "stable_reinforce",
    "custom",
]


@chz.chz
class KLReferenceConfig:
    """The KL penalty's reference model (the cookbook's).

    Attributes:
        base_model: the reference model's name.
        load_checkpoint_path: sampler weights to load into it (None: the base model's).
    """

    base_model: str
    load_checkpoint_path: str | None = None


@chz.chz
class StreamMinibatchConfig:
    """Sync training with streaming minibatches (the cookbook's fields), run as
    `shell.config.StreamMinibatchConfig` (see `shell.training._stream`).

    Attributes:
        groups_per_batch: trajectory groups per training iteration.
        num_minibatches: `forward_backward` calls per optimizer substep.
    """

    groups_per_batch: int
    num_minibatches: int


@chz.chz
class AsyncConfig:
    """Async, off-policy training (the cookbook's fields and check), run as
    `shell.config.AsyncConfig` (see `shell.training._async`).

    Attributes:
        max_steps_off_policy: how many steps sampling may run ahead of training (>= 0).
        groups_per_batch: trajectory groups per training batch (>= 1).
        loss_fn: the loss of async runs.
    """

    max_steps_off_policy: int
    groups_per_batch: int
    loss_fn: LossFnType = "stable_reinforce"

    @chz.validate
    def _check(self) -> None:
        if self.max_steps_off_policy < 0 or self.groups_per_batch < 1:
            raise ConfigError(
                "AsyncConfig needs max_steps_off_policy >= 0 and groups_per_batch >= 1, got "
                f"{self.max_steps_off_policy} and {self.groups_per_batch}"
            )


@chz.chz
class Config:
    """Configuration of an RL run, with the cookbook 0.6.1 `rl.train.Config` fields.

    Required: `learning_rate`, `dataset_builder`, `model_name`, `recipe_name`, `max_tokens`,
    `log_path`. See the module docstring for how each field maps onto
    `shell.config.TrainConfig` and which ones `main` refuses when set.
    """

    learning_rate: float
    dataset_builder: RLDatasetBuilder
    model_name: str
    recipe_name: str
    max_tokens: int
    log_path: str = chz.field(munger=lambda _, s: str(Path(s).expanduser()))
    eval_every: int = 20
    save_every: int = 20
    evaluator_builders: list[SamplingClientEvaluatorBuilder] = chz.field(default_factory=list)
    load_checkpoint_path: str | None = None
    renderer_name: str | None = None
    wandb_project: str | None = None
    wandb_name: str | None = None
    session_name: str | None = None

    kl_penalty_coef: float = 0.0
    kl_discount_factor: float = 0.0
    kl_reference_config: KLReferenceConfig | None = None

    loss_fn: LossFnType = "importance_sampling"
    loss_fn_config: dict[str, Any] | None = None
    num_substeps: int = 1
    lora_rank: int = 32

    temperature: float = 1.0
    compute_post_kl: bool = False
    remove_constant_reward_groups: bool = False
    rollout_error_tolerance: bool | RolloutStrategy | None = None
    termination: TerminationRewardPolicy | None = None
    enable_trace: bool = False
    span_chart_every: int = 0

    async_config: AsyncConfig | None = None
    stream_minibatch_config: StreamMinibatchConfig | None = None
    base_url: str | None = None

    ttl_seconds: int | None = 604800
    rolling_save_every: int = 0
    rolling_ttl_seconds: int = 7200
    num_groups_to_log: int = 4
    rollout_json_export: bool = True

    num_epochs: int = 1
    max_steps: int | None = None

    # rlpure's extensions (issue 30), not the cookbook's: off by default, so a cookbook
    # recipe's Config trains as the cookbook's (see `shell.config.FIELD_HELP` for each)
    mismatch_correction: MismatchCorrectionConfig | None = None
    kl_penalty_estimator: Literal["k1", "k2", "k3"] = "k1"
    overlong: OverlongConfig | None = None
    dynamic_sampling: DynamicSamplingConfig | None = None

    def training_loss_fn(self) -> LossFnType:
        """The loss this run trains with: `async_config.loss_fn` for async runs, else
        `loss_fn`."""
        return self.async_config.loss_fn if self.async_config is not None else self.loss_fn

    def records_stability_info(self) -> bool:
        """Whether sampling must record what `stable_reinforce` trains on."""
        return self.training_loss_fn() == "stable_reinforce"

    def effective_termination(self) -> TerminationRewardPolicy | None:
        """The termination policy of the run: `termination`, else the model's preset
        (`shell.rollouts.default_rollout_config_for_model`: the agentic grade-then-clamp policy
        for `thinkingmachines/Inkling` models, none for the others)."""
        if self.termination is not None:
            return self.termination
        return default_rollout_config_for_model(self.model_name).termination

    def effective_rollout_strategy(self) -> RolloutStrategy:
        """The rollout strategy of the run: `rollout_error_tolerance` None → the model's
        preset (`MinViableGroup()` for Inkling models, `FailFast()` otherwise), False →
        `FailFast()`, True → `RetryOnFailure()`, a strategy → itself.

        Raises:
            ConfigError: any other value (the cookbook's `ConfigurationError`).
        """
        if self.rollout_error_tolerance is None:
            return default_rollout_strategy_for_model(self.model_name)
        return rollout_strategy_from_config(self.rollout_error_tolerance)


def _check_supported(config: Config) -> None:
    """Refuses what `main` cannot honour, before anything runs (see the module docstring)."""
    if config.training_loss_fn() == "custom":
        where = "AsyncConfig.loss_fn" if config.async_config is not None else "Config.loss_fn"
        raise ConfigError(f"{where}='custom': custom losses are not supported")
    config.effective_rollout_strategy()  # an invalid rollout_error_tolerance fails here
    if config.kl_penalty_coef > 0 and config.kl_reference_config is None:
        raise ConfigError("kl_reference_config must be specified when kl_penalty_coef > 0")


def to_train_config(config: Config, *, backend: Literal["local", "tinker", "fake"]) -> TrainConfig:
    """The `TrainConfig` `main` runs for `config` (see the module docstring for the mapping).

    Raises:
        ConfigError: a value `TrainConfig` refuses (naming its `TrainConfig` field).
    """
    kl = config.kl_reference_config
    fields: dict[str, Any] = {
        "log_dir": config.log_path,
        "backend": backend,
        "base_model": config.model_name,
        "lora_rank": config.lora_rank,
        "max_steps": config.max_steps,
        "num_epochs": config.num_epochs,
        "load_checkpoint_path": config.load_checkpoint_path,
        "learning_rate": config.learning_rate,
        "loss_fn": config.loss_fn,
        "loss_fn_config": config.loss_fn_config,
        "num_substeps": config.num_substeps,
        "max_tokens": config.max_tokens,
        "temperature": config.temperature,
        "eval_temperature": 1.0,
        # None resolves to the model's preset inside TrainConfig, as `effective_termination` does
        "termination": (
            None
            if config.termination is None
            else TerminationConfig.from_policy(config.termination)
        ),
        "remove_constant_reward_groups": config.remove_constant_reward_groups,
        "kl_penalty_coef": config.kl_penalty_coef,
        "kl_discount": config.kl_discount_factor,
        "kl_reference_model": None if kl is None else kl.base_model,
        "kl_reference_checkpoint": None if kl is None else kl.load_checkpoint_path,
        "compute_post_kl": config.compute_post_kl,
        "eval_every": config.eval_every,
        "save_every": config.save_every,
        "ttl_seconds": config.ttl_seconds,
        "rolling_save_every": config.rolling_save_every,
        "rolling_ttl_seconds": config.rolling_ttl_seconds,
        "num_groups_to_log": config.num_groups_to_log,
        "rollout_json_export": config.rollout_json_export,
        "enable_trace": config.enable_trace,
        "span_chart_every": config.span_chart_every,
        "stream_minibatch_config": (
            None
            if config.stream_minibatch_config is None
            else TrainStreamMinibatchConfig(
                groups_per_batch=config.stream_minibatch_config.groups_per_batch,
                num_minibatches=config.stream_minibatch_config.num_minibatches,
            )
        ),
        "async_config": (
            None
            if config.async_config is None
            else TrainAsyncConfig(
                max_steps_off_policy=config.async_config.max_steps_off_policy,
                groups_per_batch=config.async_config.groups_per_batch,
                loss_fn=config.async_config.loss_fn,  # type: ignore[arg-type]
            )
        ),
        "kl_penalty_estimator": config.kl_penalty_estimator,
        "mismatch_correction": config.mismatch_correction,
        "overlong": config.overlong,
        "dynamic_sampling": config.dynamic_sampling,
        "wandb_project": config.wandb_project,
        # the cookbook names a W&B run only with a project (else wandb_name names the session)
        "wandb_name": config.wandb_name if config.wandb_project else None,
    }
    try:
        return TrainConfig(**fields)
    except (TypeError, ValueError) as err:  # msgspec's type errors; ConfigError is a ValueError
        if isinstance(err, ConfigError):
            raise
        raise ConfigError(f"Config: {err}") from None


def _recipe_options(config: Config) -> dict[str, Any]:
    builder = type(config.dataset_builder)
    return recipe_options(
        config.recipe_name,
        {"dataset_builder": f"{builder.__module__}.{builder.__qualname__}"},
        may_change=(),
    )


async def main(
    config: Config,
    rollout_executor: Executor | None = None,
    service_client: ServiceClient | None = None,
) -> TrainResult:
    """Runs (or resumes) RL training as the cookbook's `main` (see the module docstring).

    Args:
        config: the run's configuration.
        rollout_executor: where group rollouts run (`shell.rollouts.set_rollout_executor`,
            for this call; shut down once training succeeded, as the cookbook); None runs them
            as coroutines in this process.
        service_client: the backend; None opens `tinker.ServiceClient` (reads
            `TINKER_API_KEY`), e.g. `shell.LocalServiceClient()` trains offline.

    Returns:
        What `shell.training.train` did (`TrainResult`).

    Raises:
        ConfigError: an unsupported field, a bad value, the cookbook's configuration errors,
            or a resume with changed options; all before a session is opened.

    Examples:
        A cookbook recipe's call, ported: ``await main(config,
        service_client=shell.LocalServiceClient())``.
    """
    _check_supported(config)
    to_train_config(
        config, backend="tinker" if service_client is None else backend_of(service_client)
    )
    if (
        config.async_config is not None
        and config.async_config.max_steps_off_policy > 0
        and config.training_loss_fn() in ("importance_sampling", "cispo")
    ):
        logger.warning(
            "loss_fn=%r can become unstable on the off-policy data that async training "
            "produces; prefer 'stable_reinforce' (the async default) or a clipped loss such as "
            "'ppo'.",
            config.training_loss_fn(),
        )
    if service_client is not None and config.base_url is not None:
        raise ConfigError(
            f"Config.base_url={config.base_url!r}: only used to open tinker.ServiceClient; "
            "main was given a service_client"
        )
    if rollout_executor is not None:
        set_rollout_executor(rollout_executor)  # refuses a fork-started process pool
    try:
        if service_client is not None:
            result = await _run(config, service_client)
        else:
            with tinker.ServiceClient(
                base_url=config.base_url,
                user_metadata={"recipe_name": config.recipe_name},
                display_name=config.session_name or config.wandb_name or None,
            ) as tinker_client:
                result = await _run(config, tinker_client)
    finally:
        if rollout_executor is not None:
            set_rollout_executor(None)
    if rollout_executor is not None:
        rollout_executor.shutdown(wait=True)  # as the cookbook, once training succeeded
    return result


async def _run(config: Config, service_client: ServiceClient) -> TrainResult:
    """`main` once the service client is open: steps 3-5 of the module docstring."""
    train_config = to_train_config(config, backend=backend_of(service_client))
    options = _recipe_options(config)
    resume = checked_last_checkpoint(train_config, recipe_options=options)
    opened = await open_training_client(train_config, service_client, resume)
    tokenizer = opened.client.get_tokenizer()
    register_tokenizer(config.model_name, tokenizer)
    dataset, test_dataset = await config.dataset_builder()
    return await train(
        train_config,
        dataset=dataset,
        service_client=service_client,
        test_dataset=test_dataset,
        tokenizer=tokenizer,
        training_client=opened,
        recipe_options=options,
        evaluator_builders=config.evaluator_builders,
        strategy=config.effective_rollout_strategy(),
    )


# --- the cookbook's evaluation entry points (recipes call them after `main`) -------------------

_LOGTREE_EXPLANATION = (
    "This HTML log was generated by logtree during RL training. "
    "It shows rollouts and rewards for a subset of trajectory groups in this iteration. "
    "To customize what gets logged, modify the logtree calls in your Env implementation "
    "(see examples in tinker_cookbook/recipes/)."
)
"""The first paragraph of each evaluation page, the cookbook's words."""


def _get_evaluator_name(evaluator: SamplingClientEvaluator) -> str:
    """A test-set evaluator's `name`, else `""` (the cookbook's)."""
    return (
        evaluator.name
        if isinstance(evaluator, RLTestSetEvaluator) and evaluator.name is not None
        else ""
    )


def _sanitize_filename_component(text: str) -> str:
    """`text` as a safe file-name part: runs of other characters become `_` (the cookbook's)."""
    sanitized = re.sub(r"[^A-Za-z0-9_.-]+", "_", text)
    return sanitized.strip("._") or "unnamed"


@contextmanager
def _eval_page(
    output_dir: Path | None,
    num_groups_to_log: int,
    f_name: str,
    scope_name: str,
    iteration: int,
    store: TrainingRunStore | None,
) -> Iterator[None]:
    """The evaluation's logtree page, as the cookbook's `_get_logtree_scope`.

    Writes `output_dir/{f_name}.html` (whatever the evaluator and its envs log while the block
    runs) and, with a `store`, `{f_name}_logtree.json` through `store.write_logtree`; nothing
    when `output_dir` is None or `num_groups_to_log <= 0`.
    """
    if output_dir is None or num_groups_to_log <= 0:
        yield
        return
    output_dir.mkdir(parents=True, exist_ok=True)
    page: logtree.Trace | None = None
    try:
        with logtree.init_trace(scope_name, path=output_dir / f"{f_name}.html") as page:
            logtree.log_text(_LOGTREE_EXPLANATION)
            yield
    finally:
        if page is not None and store is not None:
            store.write_logtree(iteration, page.to_dict(), base_name=f_name)


@trace.scope
async def run_single_evaluation(
    evaluator: SamplingClientEvaluator,
    config: Config,
    i_batch: int,
    sampling_client: tinker.SamplingClient,
    evaluator_label: str,
    store: TrainingRunStore | None = None,
) -> dict[str, Any]:
    """Runs one evaluator at step `i_batch` and returns its metrics (the cookbook's).

    Inside a logtree page `iteration_NNNNNN/eval_{evaluator_label}.html` of `config.log_path`
    (when `config.num_groups_to_log > 0`; its JSON goes to `store`), a test-set evaluator is
    called with a `RolloutSummaryExportConfig` (split `eval/{evaluator_label}`, base name
    `eval_{evaluator_label}`, when `config.rollout_json_export`) and `store`, so
    `shell.cookbook.rl.metric_util.RLTestSetEvaluator` writes its rollout summaries there;
    any other evaluator is called with the sampling client alone.

    Args:
        evaluator: the evaluator to run.
        config: the run's configuration (`log_path`, `num_groups_to_log`,
            `rollout_json_export` are read).
        i_batch: the training step evaluated.
        sampling_client: a sampling client of the weights evaluated.
        evaluator_label: the file-safe label of the evaluator's files.
        store: the run's store (None: no logtree JSON, no rollout summaries).

    Returns:
        The evaluator's metrics.
    """
    ev_name = _get_evaluator_name(evaluator)
    eval_base_name = f"eval_{evaluator_label}"
    iter_dir = iteration_dir(config.log_path, i_batch)
    with _eval_page(
        iter_dir,
        config.num_groups_to_log,
        eval_base_name,
        f"Running evaluation {ev_name} {i_batch}",
        i_batch,
        store,
    ):
        if isinstance(evaluator, RLTestSetEvaluator):
            export = (
                RolloutSummaryExportConfig(
                    split=f"eval/{evaluator_label}",
                    iteration=i_batch,
                    base_name=eval_base_name,
                    sampling_client_step=i_batch,
                )
                if config.rollout_json_export and iter_dir is not None
                else None
            )
            return dict(
                await evaluator(sampling_client, rollout_summary_export=export, store=store)
            )
        return dict(await evaluator(sampling_client))


@trace.scope
async def run_evaluations_parallel(
    evaluators: list[SamplingClientEvaluator],
    sampling_client: tinker.SamplingClient,
    config: Config,
    i_batch: int,
    store: TrainingRunStore | None = None,
) -> dict[str, Any]:
    """Runs every evaluator concurrently at step `i_batch`; their metrics merged in order, a
    later evaluator's key winning (the cookbook's).

    Each evaluator runs as `run_single_evaluation` in its own task, labelled by its sanitized
    name (a test-set evaluator's `name`), else by its index.

    Args:
        evaluators: the evaluators.
        sampling_client: a sampling client of the weights evaluated.
        config: the run's configuration (see `run_single_evaluation`).
        i_batch: the training step evaluated.
        store: the run's store (see `run_single_evaluation`).

    Returns:
        The merged metrics.
    """
    tasks = []
    for i, evaluator in enumerate(evaluators):
        label = _sanitize_filename_component(_get_evaluator_name(evaluator) or str(i))
        tasks.append(
            asyncio.create_task(
                run_single_evaluation(
                    evaluator, config, i_batch, sampling_client, label, store=store
                ),
                name=f"eval_{label}_iteration_{i_batch:06d}",
            )
        )
    metrics: dict[str, Any] = {}
    for result in await asyncio.gather(*tasks):
        metrics.update(result)
    return metrics
