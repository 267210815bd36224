"""Experiment trackers: each metrics.jsonl row also goes to W&B (and TensorBoard) when asked.

Conventions:
- `TrainConfig.wandb_project` / `wandb_name` are the cookbook's (`utils/ml_log.py`
  `WandbLogger`): one W&B run per process (a resumed run is a new W&B run, as in the cookbook),
  `wandb.init(project=..., name=..., dir=LOG_DIR, config=...)`, the config logged once at init
  (`TrainConfig` as `config.json` holds it, plus `recipe_options`), and each row logged with
  `wandb.log(metrics, step=step)`: the keys and values of the row written to metrics.jsonl
  except its `step`, which is the tracker's own step axis (the cookbook logs its metrics dict,
  which has no `step` key, at `step=`), nothing renamed. `WANDB_DIR`, when set, wins over the
  log dir; `WANDB_MODE=offline` logs locally (`wandb sync` uploads later).
- `TrainConfig.tensorboard_dir` writes TensorBoard event files (`tensorboardX`): every numeric
  value of a row (its `step` aside) as a scalar at the row's step, the config once as a text
  summary.
- Both are optional extras (`pip install 'rlpure[wandb]'`, `'rlpure[tensorboard]'`): asking
  for one that is not installed, or a W&B run that cannot start (no credentials online), is
  a one-line `ConfigError` raised by `open_trackers`, before the first step.
- `Trackers` is a context manager: it finishes every run on the way out, with exit code 1 when
  the block raised (an error, Ctrl-C or a cancellation), so a failed run shows as failed in
  W&B and no background process outlives the loop.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any, Protocol

from shell.config import TrainConfig, config_to_dict
from shell.errors import ConfigError

__all__ = ["Tracker", "Trackers", "check_trackers", "open_trackers", "start_wandb_run"]

logger = logging.getLogger(__name__)

_EXTRAS = {"wandb": ("wandb", "wandb_project"), "tensorboardX": ("tensorboard", "tensorboard_dir")}


class Tracker(Protocol):
    """One experiment tracker's run."""

    def log_metrics(self, row: Mapping[str, Any], *, step: int) -> None:
        """Logs one metrics.jsonl row at `step`."""
        ...

    def finish(self, *, exit_code: int) -> None:
        """Ends the run (0: success)."""
        ...


def _import(module: str) -> ModuleType:
    """`module`, or a `ConfigError` naming the option and the extra that installs it."""
    extra, option = _EXTRAS[module]
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f"TrainConfig.{option}: {module} is not installed; install the extra with "
            f"pip install 'rlpure[{extra}]'"
        ) from None


def check_trackers(config: TrainConfig) -> None:
    """Refuses a config whose trackers are not installed, without starting any run (cheap;
    what a caller may do before loading data or compiling).

    Raises:
        ConfigError: naming the option and the extra to install.
    """
    for module, (_extra, option) in _EXTRAS.items():
        if getattr(config, option, None) is not None:
            _import(module)


class _WandbTracker:
    """A W&B run (`wandb.init` done by `open_trackers`)."""

    def __init__(self, run: Any) -> None:
        self._run = run

    def log_metrics(self, row: Mapping[str, Any], *, step: int) -> None:
        self._run.log(dict(row), step=step)

    def finish(self, *, exit_code: int) -> None:
        self._run.finish(exit_code=exit_code)


def start_wandb_run(
    *,
    project: str | None,
    name: str | None,
    directory: str | None,
    run_config: Mapping[str, Any] | None,
    option: str = "TrainConfig.wandb_project",
) -> Any:
    """`wandb.init(project=, name=, dir=, config=)`: the started W&B run.

    Args:
        project: the W&B project.
        name: the run's display name (None: W&B's).
        directory: where W&B keeps its files (None: W&B's default).
        run_config: the config logged once at init (None: none).
        option: the option that asked for W&B, named in errors.

    Raises:
        ConfigError: wandb is not installed, or the run did not start (no credentials
            online, ...): one line naming `option` and what to do.
    """
    wandb = _import("wandb")
    try:
        return wandb.init(
            project=project,
            name=name,
            dir=directory,
            config=None if run_config is None else dict(run_config),
        )
    except (wandb.errors.Error, OSError) as err:
        raise ConfigError(
            f"{option} {project!r}: the W&B run did not start "
            f"({type(err).__name__}: {' '.join(str(err).split())}); run `wandb login` or set "
            "WANDB_API_KEY, set WANDB_MODE=offline to log locally, or unset wandb_project"
        ) from None


def _start_wandb(
    config: TrainConfig, run_config: Mapping[str, Any], log_dir: Path
) -> _WandbTracker:
    run = start_wandb_run(
        project=config.wandb_project,
        name=config.wandb_name,
        directory=os.environ.get("WANDB_DIR") or str(log_dir),
        run_config=run_config,
    )
    return _WandbTracker(run)


class _TensorBoardTracker:
    """A tensorboardX `SummaryWriter`."""

    def __init__(self, writer: Any) -> None:
        self._writer = writer

    def log_metrics(self, row: Mapping[str, Any], *, step: int) -> None:
        for key, value in row.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def finish(self, *, exit_code: int) -> None:
        del exit_code  # event files have no run status
        self._writer.close()


def _start_tensorboard(config: TrainConfig, run_config: Mapping[str, Any]) -> _TensorBoardTracker:
    tensorboardx = _import("tensorboardX")
    assert config.tensorboard_dir is not None
    try:
        writer = tensorboardx.SummaryWriter(logdir=config.tensorboard_dir)
    except OSError as err:
        raise ConfigError(
            f"TrainConfig.tensorboard_dir {config.tensorboard_dir}: cannot write event files "
            f"there: {err.strerror}"
        ) from None
    text = json.dumps(dict(run_config), indent=2, default=str)
    writer.add_text("config", "```\n" + text + "\n```", global_step=0)
    return _TensorBoardTracker(writer)


class Trackers:
    """The trackers of one run (possibly none); log each metrics row with `log_metrics`.

    Use as a context manager (`with open_trackers(config) as trackers:`): every run is finished
    on exit, failed (exit code 1) when the block raised.
    """

    def __init__(self, trackers: Sequence[Tracker] = ()) -> None:
        self._trackers = tuple(trackers)
        self._finished = False

    def __bool__(self) -> bool:
        return bool(self._trackers)

    def log_metrics(self, row: Mapping[str, Any], *, step: int) -> None:
        """Logs `row` (the dict written to metrics.jsonl) at `step` to every tracker, without
        its `step` key (the trackers' own step axis)."""
        metrics = {key: value for key, value in row.items() if key != "step"}
        for tracker in self._trackers:
            tracker.log_metrics(metrics, step=step)

    def finish(self, *, exit_code: int = 0) -> None:
        """Finishes every run once (later calls do nothing)."""
        if self._finished:
            return
        self._finished = True
        errors = []
        for tracker in self._trackers:  # one that fails to finish leaves the others to finish
            try:
                tracker.finish(exit_code=exit_code)
            except Exception as error:
                errors.append(error)
        if errors:
            raise errors[0]

    def __enter__(self) -> Trackers:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.finish(exit_code=0 if exc_type is None else 1)


def open_trackers(
    config: TrainConfig,
    *,
    recipe_options: Mapping[str, Any] | None = None,
    log_dir: str | os.PathLike[str] | None = None,
) -> Trackers:
    """Starts the trackers `config` asks for and logs the config to each once.

    Args:
        config: the run's config (`wandb_project`, `wandb_name`, `tensorboard_dir`).
        recipe_options: the recipe's own options, logged beside the config under
            `recipe_options`.
        log_dir: where W&B keeps its files (`LOG_DIR/wandb/`; default `config.log_dir`).

    Returns:
        The started trackers (empty when none is asked for).

    Raises:
        ConfigError: a tracker that is not installed or cannot start; none is left running.
    """
    run_config: dict[str, Any] = config_to_dict(config)
    if recipe_options is not None:
        run_config["recipe_options"] = dict(recipe_options)
    started: list[Tracker] = []
    try:
        if config.wandb_project is not None:
            started.append(_start_wandb(config, run_config, Path(log_dir or config.log_dir)))
        if config.tensorboard_dir is not None:
            started.append(_start_tensorboard(config, run_config))
    except BaseException:
        for tracker in started:
            tracker.finish(exit_code=1)
        raise
    return Trackers(started)
