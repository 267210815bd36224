"""Resuming a run: what a log directory records, which changes a resume refuses, and the
checkpoint a run resumes from.

Conventions:
- What is recorded where, all under the run's `log_dir`:
  - `config.json` (`CONFIG_FILE`): the whole `TrainConfig` (`config_to_dict`), rewritten at
    the start of every `train` call, fresh or resumed.
  - `recipe_options.json` (`RECIPE_OPTIONS_FILE`): the recipe's own options that define the run
    (`train(recipe_options=...)`), as they read back from JSON (a tuple becomes a list). A
    resumed run given none keeps the record; a fresh run given none removes a record an earlier
    run left behind, since it is not its own.
  - `checkpoints.jsonl` (`shell.training._checkpoints`): one record per saved state, with the
    step, the state path, the KL reference's weights and the loop's PRNG key as `rng_key_data`
    — the uint32 words of `jax.random.key_data(key)`, flattened (`prng_key_data`), restored
    with `jax.random.wrap_key_data` (`prng_key_from_data`) so a resumed run draws the same
    per-step seeds as an uninterrupted one. The rows are also the cookbook's (`name`, `batch`,
    `state_path`, `sampler_path`, `rolling`, the token totals), and a row the cookbook's
    `rl.train.main` wrote resumes too, at its `batch`, with the PRNG key re-derived from
    `config.seed` (logged by `last_checkpoint`).
- The checkpoint a run resumes from is the last row (`last_checkpoint`), whether a periodic,
  rolling or final save wrote it (`shell.training._saves`); its saved files must exist
  (`check_states_exist`). The training client is restored from it
  (`shell.training._restore`), and the loop drops metrics and samples logged at or after its
  `step`.
- What may change on resume: the config fields in `RESUME_MAY_CHANGE` (where the run logs, how
  long it runs, how often and how it evaluates, how often it saves and how long the backend
  keeps its checkpoints, which diagnostics it logs, how rollouts are scheduled and retried,
  the price table and the W&B run), and
  the options a recipe leaves out of `recipe_options` (e.g. the evaluation set's size). Any
  other difference is refused with a `ConfigError` naming each changed field or option with its
  recorded and new values (`check_resumable_config`, or `checked_last_checkpoint` for a
  `log_dir`), before a session is opened. A name only one side holds (a field added or removed
  by a code update) and a missing record (a log directory written before it was recorded) are
  not compared.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import msgspec

from shell.config import TrainConfig, config_to_dict
from shell.errors import CheckpointError, ConfigError
from shell.training._checkpoints import (
    CHECKPOINTS_FILE,
    CheckpointRecord,
    is_uri,
    load_checkpoints,
)

__all__ = [
    "CONFIG_FILE",
    "RECIPE_OPTIONS_FILE",
    "RESUME_MAY_CHANGE",
    "check_resumable_config",
    "check_states_exist",
    "checked_last_checkpoint",
    "last_checkpoint",
    "recipe_options",
    "record_run_options",
]

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
"""Where `train` records its `TrainConfig` (in the run's `log_dir`)."""
RECIPE_OPTIONS_FILE = "recipe_options.json"
"""Where `train` records the recipe options it was given (beside `config.json`)."""

RESUME_MAY_CHANGE: frozenset[str] = frozenset(
    {
        "log_dir",
        "max_steps",
        "eval_every",
        "save_every",
        "ttl_seconds",
        "rolling_save_every",
        "rolling_ttl_seconds",
        "num_groups_to_log",
        "rollout_json_export",
        "progress",
        "enable_trace",
        "span_chart_every",
        "max_concurrent_groups",
        "rollout_strategy",
        "max_retries",
        "rollout_timeout",
        "min_viable_group",
        "num_epochs",
        "eval_temperature",
        "compute_post_kl",
        "price_table",
        "wandb_project",
        "wandb_name",
    }
)
"""Config fields a resumed run may change; any other difference would silently mix two runs."""


# --- the checkpoint a run resumes from ---------------------------------------------------------


def check_states_exist(record: CheckpointRecord, log_dir: str | os.PathLike[str]) -> None:
    """Refuses a record (read by `load_checkpoints`) whose saved files are not on disk.

    Catches a log dir copied without the states it holds (`local_states/`), which would
    otherwise fail deep in the backend, or with older absolute records load the original's.

    Raises:
        CheckpointError: naming the record's step, the missing path and the likely cause.
    """
    for label, path in (("state", record.state_path), ("KL reference", record.kl_reference_path)):
        if path is not None and not is_uri(path) and not Path(path).exists():
            raise CheckpointError(
                f"{Path(log_dir) / CHECKPOINTS_FILE}: the step-{record.step} checkpoint's "
                f"{label} {path} is missing (a log dir copied or moved without the states it "
                "holds, e.g. local_states/? copy or move the whole directory)"
            )


def last_checkpoint(log_dir: str | os.PathLike[str], *, seed: int = 0) -> CheckpointRecord | None:
    """The most recent checkpoint record of `log_dir`, or None.

    Args:
        log_dir: the run's log directory.
        seed: the run's seed, for a row without a PRNG key (see `load_checkpoints`); logged
            when used.
    """
    records = load_checkpoints(log_dir, seed=seed)
    if not records:
        return None
    last = records[-1]
    if last.rng_key_rederived:
        logger.warning(
            "%s: the checkpoint %r (batch %d) was written by tinker-cookbook and holds no PRNG "
            "key: the loop's key is re-derived from seed %d (what an uninterrupted rlpure run "
            "holds at that step) and no KL reference is carried over",
            Path(log_dir) / CHECKPOINTS_FILE,
            last.name,
            last.step,
            seed,
        )
    return last


# --- checking a resumed run's options ----------------------------------------------------------


def _recorded(path: Path) -> dict[str, Any] | None:
    """The JSON object recorded at `path` (None when there is no such file)."""
    if not path.exists():
        return None
    try:
        recorded = msgspec.json.decode(path.read_bytes())
    except msgspec.DecodeError as err:
        raise ConfigError(f"{path}: unreadable ({err}); cannot check the resumed run") from None
    if not isinstance(recorded, dict):
        raise ConfigError(f"{path}: expected a JSON object; cannot check the resumed run")
    return recorded


def _as_json(options: Mapping[str, Any]) -> dict[str, Any]:
    """`options` as they read back from JSON (tuples become lists), or a `ConfigError`."""
    try:
        decoded: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(dict(options)))
    except (TypeError, msgspec.EncodeError) as err:
        raise ConfigError(f"train(recipe_options=...): not JSON-encodable: {err}") from None
    return decoded


def _changes(
    recorded: Mapping[str, Any], current: Mapping[str, Any], *, label: str = ""
) -> list[str]:
    """`"<label><name>: old -> new"` for each name in both mappings whose values differ.

    A name missing on either side (an option added or removed by a code update) is not a
    change: there is nothing to compare it with.
    """
    return [
        f"{label}{name}: {recorded[name]!r} -> {current[name]!r}"
        for name in sorted(current)
        if name in recorded and recorded[name] != current[name]
    ]


def check_resumable_config(
    path: Path, config: TrainConfig, *, recipe_options: Mapping[str, Any] | None = None
) -> None:
    """Refuses to resume a log directory with options that change how the run trains.

    Compares `config` with the `config.json` at `path` (fields outside `RESUME_MAY_CHANGE`)
    and `recipe_options` with the `recipe_options.json` beside it (every key both hold). A
    missing file (a log directory written before it was recorded) is not checked.

    Args:
        path: the run's `config.json`.
        config: the config of the resumed run.
        recipe_options: the recipe's own options that define the run (JSON-able), or None.

    Raises:
        ConfigError: naming each changed field or recipe option with its recorded and new
            values; or a recorded file that cannot be read.
    """
    changed = []
    recorded = _recorded(path)
    if recorded is not None:
        current = {
            name: value
            for name, value in config_to_dict(config).items()
            if name not in RESUME_MAY_CHANGE
        }
        changed += _changes(recorded, current)
    if recipe_options is not None:
        recorded_options = _recorded(path.with_name(RECIPE_OPTIONS_FILE))
        if recorded_options is not None:
            changed += _changes(recorded_options, _as_json(recipe_options), label="recipe option ")
    if changed:
        raise ConfigError(
            f"{path.parent}: resuming with a different config would mix two runs ("
            + "; ".join(changed)
            + "). Use a new --log-dir, or the recorded values."
        )


def checked_last_checkpoint(
    config: TrainConfig, *, recipe_options: Mapping[str, Any] | None = None
) -> CheckpointRecord | None:
    """`config.log_dir`'s last checkpoint (None: a fresh run), once the run may resume it.

    What `train` starts from; a recipe calls it before opening clients so that a resume with
    changed options is refused before any session is opened (`train` checks again).

    Raises:
        ConfigError: see `check_resumable_config`.
        CheckpointError: an unreadable `checkpoints.jsonl`, a record naming a state outside
            the log dir, or a last checkpoint whose saved files are missing (see
            `shell.training._checkpoints`).
    """
    resume = last_checkpoint(config.log_dir, seed=config.seed)
    if resume is not None:
        check_resumable_config(
            Path(config.log_dir) / CONFIG_FILE, config, recipe_options=recipe_options
        )
        check_states_exist(resume, config.log_dir)
    return resume


def recipe_options(
    recipe: str, fields: Mapping[str, Any], *, may_change: Collection[str]
) -> dict[str, Any]:
    """What a recipe passes as `train(recipe_options=...)`: `{"recipe": recipe}` plus every
    field outside `may_change` (those a resumed run may change, e.g. how long it runs).

    Examples:
        >>> recipe_options("toy", {"group_size": 2, "num_batches": 8}, may_change={"num_batches"})
        {'recipe': 'toy', 'group_size': 2}
    """
    return {"recipe": recipe, **{k: v for k, v in fields.items() if k not in may_change}}


# --- recording a run's options -----------------------------------------------------------------


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Replaces `path` whole: written beside it, then renamed over it, so a full disk or a
    kill mid-write leaves the previous record readable (a resume checks the run against it)."""
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        staging.write_text(
            msgspec.json.format(msgspec.json.encode(data)).decode() + "\n", encoding="utf-8"
        )
        os.replace(staging, path)
    finally:
        staging.unlink(missing_ok=True)


def record_run_options(
    log_dir: Path,
    config: TrainConfig,
    *,
    recipe_options: Mapping[str, Any] | None,
    resuming: bool,
) -> None:
    """Writes `config.json` and `recipe_options.json` (see the module docstring).

    Args:
        log_dir: the run's log directory (it exists).
        config: the run's config.
        recipe_options: the recipe's own options (JSON-able), or None.
        resuming: whether the run continues a checkpoint of `log_dir` (then a recorded
            `recipe_options.json` stays when `recipe_options` is None; a fresh run drops it).

    Raises:
        ConfigError: `recipe_options` that cannot be encoded as JSON (after `config.json` is
            written).
    """
    _write_json(log_dir / CONFIG_FILE, config_to_dict(config))
    if recipe_options is not None:
        _write_json(log_dir / RECIPE_OPTIONS_FILE, _as_json(recipe_options))
    elif not resuming:
        # a fresh run without recipe options: a record left by an earlier run is not its own
        (log_dir / RECIPE_OPTIONS_FILE).unlink(missing_ok=True)
