"""`tinker_cookbook.utils.ml_log`: metric loggers for a hand-written loop.

The cookbook 0.6.1 `Logger` classes and `setup_logging`, over the project's own rooms:
`config.json`, console tables and the root logger's handlers are `shell.metric_sinks`,
`metrics.jsonl` is written by `shell.training._logs.JsonlWriter`, `code.diff` is
`shell.source_state`, and a W&B run starts through `shell.training._trackers.start_wandb_run`.
`setup_logging(log_dir, ...)` gives the cookbook's `MultiplexLogger` of a `JsonLogger`, a
`PrettyPrintLogger` and, with `wandb_project`, the W&B / Neptune / Trackio loggers whose packages
are installed; it logs the config once and, by default, replaces the root logger's handlers
with the console and `<log_dir>/logs.log`.

Deliberate differences: there are no cloud stores, so `log_dir` is a local directory and
`Logger.store` is always None; `metrics.jsonl` holds `null` where a metric is NaN or infinite
(JSON has neither; the cookbook writes the non-standard `NaN`), and numpy / jax scalars are
written as numbers; `code.diff` describes the repository holding `shell` (the code that runs).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from shell.errors import ConfigError
from shell.metric_sinks import (
    config_lines_text,
    configure_root_logging,
    jsonable,
    metrics_table_text,
    write_config_json,
)
from shell.source_state import source_state
from shell.training._logs import METRICS_FILE, JsonlWriter
from shell.training._trackers import start_wandb_run

__all__ = [
    "JsonLogger",
    "Logger",
    "MultiplexLogger",
    "NeptuneLogger",
    "PrettyPrintLogger",
    "TrackioLogger",
    "WandbLogger",
    "configure_logging_module",
    "dump_config",
    "setup_logging",
]

logger = logging.getLogger(__name__)

dump_config = jsonable


def configure_logging_module(path: str, level: int = logging.INFO) -> logging.Logger:
    """Replaces the root logger's handlers with a coloured console and the file `path`."""
    return configure_root_logging(path, level=level)


def _installed(module: str) -> bool:
    """Whether `module` imports (already imported, or found), without importing it."""
    return sys.modules.get(module) is not None or importlib.util.find_spec(module) is not None


class Logger(ABC):
    """A metrics sink (the cookbook's base class): `log_hparams` and `log_metrics` are
    required, the rest do nothing unless overridden."""

    @abstractmethod
    def log_hparams(self, config: Any) -> None:
        """Logs the run's configuration."""

    @abstractmethod
    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Logs one row of metrics at `step` (None: no step)."""

    def enable_event_steps(self) -> None:  # noqa: B027 (optional no-op hook)
        """Lets rows arrive out of step order (async loops); nothing by default."""

    def log_metrics_event(
        self,
        metrics: dict[str, Any],
        step: int,
        step_metric: str,
        metric_axes: dict[str, str] | None = None,
    ) -> None:
        """Logs a row about step `step` of `step_metric`, possibly an earlier one."""
        self.log_metrics(metrics | {step_metric: step}, step=step)

    def log_summary(self, metrics: dict[str, Any]) -> None:  # noqa: B027 (optional no-op hook)
        """Records the latest value of running totals outside the step rows (optional)."""

    def log_long_text(self, key: str, text: str) -> None:  # noqa: B027 (optional no-op hook)
        """Logs a long text (optional)."""

    def close(self) -> None:  # noqa: B027 (optional no-op hook)
        """Flushes and releases the sink (optional)."""

    def sync(self) -> None:  # noqa: B027 (optional no-op hook)
        """Forces buffered rows out (optional)."""

    def get_logger_url(self) -> str | None:
        """A link to the logged run, if the sink has one."""
        return None

    @property
    def store(self) -> Any:
        """The cookbook's `TrainingRunStore` of the logger: none here (no stores)."""
        return None


class JsonLogger(Logger):
    """Writes `config.json` and `code.diff` on the first `log_hparams`, and appends one
    `{"step": step, ...metrics}` row per `log_metrics` to `metrics.jsonl`, in `log_dir`."""

    def __init__(self, log_dir: str | Path, store: Any = None) -> None:
        if store is not None:
            raise ConfigError("JsonLogger(store=...): no stores here; it writes into log_dir")
        self.log_dir = str(log_dir)
        Path(self.log_dir).mkdir(parents=True, exist_ok=True)
        self._logged_hparams = False

    def log_hparams(self, config: Any) -> None:
        """Writes `config.json` and `code.diff`, once."""
        if self._logged_hparams:
            return
        write_config_json(self.log_dir, config)
        (Path(self.log_dir) / "code.diff").write_text(source_state(["shell"]), encoding="utf-8")
        self._logged_hparams = True

    def _append(self, row: dict[str, Any]) -> None:
        with JsonlWriter(Path(self.log_dir) / METRICS_FILE) as writer:
            writer.write(row)

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Appends the row `{"step": step, **metrics}` (no `step` key when None)."""
        self._append({"step": step, **metrics} if step is not None else dict(metrics))
        logger.info("Wrote metrics to %s/%s", self.log_dir, METRICS_FILE)

    def log_summary(self, metrics: dict[str, Any]) -> None:
        """Appends the values as a row without a step."""
        self._append(dict(metrics))


class PrettyPrintLogger(Logger):
    """Logs each row as a table (and the config as lines) at INFO through `logging`."""

    def __init__(self) -> None:
        from rich.console import Console

        self.console = Console()

    def log_hparams(self, config: Any) -> None:
        """Logs the config, one `key: value` line per entry."""
        logger.info("\n" + config_lines_text(dump_config(config), console=self.console))

    def log_summary(self, metrics: dict[str, Any]) -> None:
        """Logs the values as a table."""
        self.log_metrics(metrics)

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Logs the row as a table titled `Step <step>`."""
        text = metrics_table_text(metrics, step=step, console=self.console)
        if text is not None:
            logger.info("\n" + text)


class WandbLogger(Logger):
    """Streams the config and rows to a W&B run.

    Raises:
        ImportError: wandb is not installed.
        ConfigurationError: the run did not start (no credentials online, ...).
    """

    def __init__(
        self,
        project: str | None = None,
        config: Any | None = None,
        log_dir: str | Path | None = None,
        wandb_name: str | None = None,
    ) -> None:
        if not _installed("wandb"):
            raise ImportError(
                "wandb is not installed. Please install it with: pip install wandb (or uv add "
                "wandb)"
            )
        self._wandb = importlib.import_module("wandb")
        self._event_steps = False
        self._event_metric_axes: set[tuple[str, str]] = set()
        self.run = start_wandb_run(
            project=project,
            name=wandb_name,
            directory=str(log_dir) if log_dir else None,
            run_config=dump_config(config) if config else None,
            option="WandbLogger project",
        )

    def enable_event_steps(self) -> None:
        """Rows carry `training/step`; W&B's own step counts arrivals."""
        if self.run and not self._event_steps:
            self.run.define_metric("training/step")
            self.run.define_metric("*", step_metric="training/step", step_sync=False)
            self._event_steps = True

    def log_metrics_event(
        self,
        metrics: dict[str, Any],
        step: int,
        step_metric: str,
        metric_axes: dict[str, str] | None = None,
    ) -> None:
        """Logs the row against `step_metric` (or the axes named in `metric_axes`)."""
        if not self.run:
            return
        self.enable_event_steps()
        axes = metric_axes or {}
        coordinates = {step_metric, *axes.values()}
        for coordinate in coordinates:
            self.run.define_metric(coordinate)
        for name in metrics:
            if name in coordinates:
                continue
            key = (name, axes.get(name, step_metric))
            if key not in self._event_metric_axes:
                self.run.define_metric(name, step_metric=key[1], step_sync=False)
                self._event_metric_axes.add(key)
        self.log_metrics(metrics | {step_metric: step})

    def log_hparams(self, config: Any) -> None:
        """Adds the config to the run's."""
        if self.run:
            self._wandb.config.update(dump_config(config))

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Logs the row at `step` (with event steps: committed at once, `training/step`)."""
        if not self.run:
            return
        if self._event_steps:
            coordinates = {"training/step": step} if step is not None else {}
            self._wandb.log(metrics | coordinates, commit=True)
        else:
            self._wandb.log(metrics, step=step)
        logger.info("Logging to: %s", self.run.url)

    def log_summary(self, metrics: dict[str, Any]) -> None:
        """Updates the run's summary."""
        if self.run:
            self.run.summary.update(metrics)

    def close(self) -> None:
        """Finishes the run."""
        if self.run:
            self._wandb.finish()

    def get_logger_url(self) -> str | None:
        """The run's URL."""
        return str(self.run.url) if self.run else None


class NeptuneLogger(Logger):
    """Streams the config and rows to a Neptune run (`neptune-scale`, `NEPTUNE_API_TOKEN`).

    Raises:
        ImportError: neptune-scale is not installed.
        ConfigurationError: `NEPTUNE_API_TOKEN` is not set.
    """

    def __init__(
        self,
        project: str | None = None,
        config: Any | None = None,
        log_dir: str | Path | None = None,
        neptune_name: str | None = None,
    ) -> None:
        if not _installed("neptune_scale"):
            raise ImportError(
                "neptune-scale is not installed. Please install it with: pip install "
                "neptune-scale (or uv add neptune-scale)"
            )
        if not os.environ.get("NEPTUNE_API_TOKEN"):
            raise ConfigError("NEPTUNE_API_TOKEN environment variable not set")
        run_class = importlib.import_module("neptune_scale").Run
        self.run = run_class(
            project=project,
            log_directory=str(log_dir) if log_dir else None,
            experiment_name=neptune_name,
        )
        self.run.log_configs(dump_config(config) if config else None, flatten=True)

    def log_hparams(self, config: Any) -> None:
        """Logs the config as the run's configs."""
        self.run.log_configs(dump_config(config) if config else None, flatten=True)

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Logs the row at `step` (required by Neptune)."""
        if step is None:
            raise ValueError("NeptuneLogger.log_metrics: step is required (an int or float)")
        self.run.log_metrics(metrics, step=step)
        logger.info("Logging to: %s", self.run.get_run_url())

    def log_summary(self, metrics: dict[str, Any]) -> None:
        """Sets the values as run attributes."""
        self.run.log_configs(metrics)

    def close(self) -> None:
        """Closes the run."""
        self.run.close()


class TrackioLogger(Logger):
    """Streams the config and rows to a Trackio run.

    Raises:
        ImportError: trackio is not installed.
    """

    def __init__(
        self,
        project: str | None = None,
        config: Any | None = None,
        log_dir: str | Path | None = None,
        trackio_name: str | None = None,
    ) -> None:
        if not _installed("trackio"):
            raise ImportError(
                "trackio is not installed. Please install it with: pip install trackio (or uv "
                "add trackio)"
            )
        self._trackio = importlib.import_module("trackio")
        self.run = self._trackio.init(
            project=project or "default",
            name=trackio_name,
            config=dump_config(config) if config else None,
        )

    def log_hparams(self, config: Any) -> None:
        """Nothing: Trackio takes its config at init."""

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Logs the row at `step`."""
        self._trackio.log(metrics, step=step)
        logger.info("Logged metrics to Trackio project: %s", self.run.project)

    def close(self) -> None:
        """Finishes the run."""
        self._trackio.finish()


class MultiplexLogger(Logger):
    """Hands every call to each of `loggers` (what `setup_logging` returns)."""

    def __init__(self, loggers: list[Logger]) -> None:
        self.loggers = loggers

    def log_hparams(self, config: Any) -> None:
        """To every logger."""
        for child in self.loggers:
            child.log_hparams(config)

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """To every logger."""
        for child in self.loggers:
            child.log_metrics(metrics, step)

    def enable_event_steps(self) -> None:
        """To every logger."""
        for child in self.loggers:
            child.enable_event_steps()

    def log_metrics_event(
        self,
        metrics: dict[str, Any],
        step: int,
        step_metric: str,
        metric_axes: dict[str, str] | None = None,
    ) -> None:
        """To every logger."""
        for child in self.loggers:
            child.log_metrics_event(metrics, step, step_metric, metric_axes)

    def log_summary(self, metrics: dict[str, Any]) -> None:
        """To every logger."""
        for child in self.loggers:
            child.log_summary(metrics)

    def log_long_text(self, key: str, text: str) -> None:
        """To every logger."""
        for child in self.loggers:
            child.log_long_text(key, text)

    def close(self) -> None:
        """Closes every logger."""
        for child in self.loggers:
            child.close()

    def sync(self) -> None:
        """Syncs every logger."""
        for child in self.loggers:
            child.sync()

    def get_logger_url(self) -> str | None:
        """The first URL a logger gives."""
        for child in self.loggers:
            if url := child.get_logger_url():
                return url
        return None


def _remote_loggers(
    project: str, name: str | None, config: Any | None, log_dir: str
) -> list[Logger]:
    """The W&B, Neptune and Trackio loggers `setup_logging` adds for `project` (each when
    its package is installed, Neptune also needing its token), as the cookbook."""
    loggers: list[Logger] = []
    if not _installed("wandb"):
        print("WARNING: wandb is not installed. Skipping W&B logging.")
    else:
        loggers.append(
            WandbLogger(project=project, config=config, log_dir=log_dir, wandb_name=name)
        )
    if _installed("neptune_scale"):
        if not os.environ.get("NEPTUNE_API_TOKEN"):
            print(
                "WARNING: NEPTUNE_API_TOKEN environment variable not set. "
                "Skipping Neptune logging. "
            )
        else:
            loggers.append(NeptuneLogger(project, config, log_dir, neptune_name=name))
    if _installed("trackio"):
        loggers.append(TrackioLogger(project, config, log_dir, trackio_name=name))
        print(f"Trackio logging enabled for project: {project}")
    return loggers


def setup_logging(
    log_dir: str,
    wandb_project: str | None = None,
    wandb_name: str | None = None,
    config: Any | None = None,
    do_configure_logging_module: bool = True,
) -> Logger:
    """The loggers of a run in `log_dir` (see the module docstring), the config logged once.

    Raises:
        ConfigurationError: `log_dir` is a URI (no cloud stores here), or a W&B run did not
            start.
    """
    if "://" in log_dir and not log_dir.startswith("file://"):
        raise ConfigError(f"setup_logging: log_dir {log_dir!r}: only local directories here")
    local = str(Path(log_dir.removeprefix("file://")).expanduser())
    loggers: list[Logger] = [JsonLogger(local), PrettyPrintLogger()]
    if wandb_project:
        loggers += _remote_loggers(wandb_project, wandb_name, config, local)
    multiplexed = MultiplexLogger(loggers)
    if config is not None:
        multiplexed.log_hparams(config)
    if do_configure_logging_module:
        configure_logging_module(str(Path(local) / "logs.log"))
    logger.info("Logging to: %s", log_dir)
    return multiplexed
