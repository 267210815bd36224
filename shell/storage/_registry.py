"""`RunRegistry`: finds the runs in one or more storages and hands out their stores.

Conventions:
- A run is a folder holding `metrics.jsonl` or `config.json`: the storage's root itself (run id
  `root`, or the prefix's last part), else each child folder (not deeper: listing is the
  expensive call on a remote store).
- Status: `running` when `metrics.jsonl` changed in the last 120 s, `completed` when a
  checkpoint row says `final`, else `idle`. Training type from the config's keys (`dpo_beta`
  → dpo, `loss_fn` → rl, `num_epochs` → sl, else the dataset builder's type name).
- The same run id in two storages: the later one is `<storage folder>--<run id>`.
- Eval stores (the cookbook's `EvalStore`) are not ported: `get_eval_store` returns None.
"""

from __future__ import annotations

import time
from typing import Literal

import msgspec

from shell.storage._backends import Storage, storage_join
from shell.storage._run_store import ITERATION_DIR, TrainingRunStore

__all__ = ["RunInfo", "RunRegistry", "discover_runs"]

Status = Literal["running", "completed", "idle"]
TrainingType = Literal["rl", "sl", "dpo"]

ACTIVE_THRESHOLD_S = 120
"""A run whose metrics changed this recently is `running`."""


class RunInfo(msgspec.Struct, frozen=True):
    """What a run's folder holds, as the registry found it (positional too, as the cookbook's)."""

    run_id: str
    prefix: str
    has_config: bool
    has_metrics: bool
    has_checkpoints: bool
    has_timing: bool
    iteration_count: int
    status: Status
    last_updated: float | None
    training_type: TrainingType | None


class RunRegistry:
    """The runs of several storages, each store routed to the storage holding its run.

    Args:
        storages: the storages to scan (the first is the primary).
        eval_prefixes: the cookbook's eval-store folders; kept, unused (no eval store here).

    Attributes:
        store_class: the class of the stores handed out (a subclass may name its own).
    """

    store_class: type[TrainingRunStore] = TrainingRunStore

    def __init__(
        self, storages: list[Storage], eval_prefixes: tuple[str, ...] = ("eval", "eval_store", "")
    ) -> None:
        self._storages = storages
        self._eval_prefixes = eval_prefixes
        self._runs: dict[str, RunInfo] | None = None
        self._storage: dict[str, Storage] = {}
        self._training_stores: dict[str, TrainingRunStore] = {}

    @property
    def storage_count(self) -> int:
        """How many storages are scanned."""
        return len(self._storages)

    @property
    def primary_storage(self) -> Storage:
        """The first storage."""
        return self._storages[0]

    def storage_for(self, run_id: str) -> Storage:
        """The storage holding `run_id` (the primary when unknown)."""
        return self._storage.get(run_id) or self._storages[0]

    def refresh(self) -> list[RunInfo]:
        """Scans every storage again (dropping cached stores); returns the runs."""
        runs: dict[str, RunInfo] = {}
        self._storage.clear()
        self._training_stores.clear()
        for storage in self._storages:
            source = storage.url().rstrip("/").rsplit("/", 1)[-1]
            for run in discover_runs(storage):
                run_id = f"{source}--{run.run_id}" if run.run_id in runs else run.run_id
                runs[run_id] = run
                self._storage[run_id] = storage
        self._runs = runs
        return list(runs.values())

    def _known(self) -> dict[str, RunInfo]:
        if self._runs is None:
            self.refresh()
        return self._runs or {}

    def get_runs(self) -> list[RunInfo]:
        """Every run found (scanning on first use)."""
        return list(self._known().values())

    def get_run(self, run_id: str) -> RunInfo | None:
        """One run by id, or None."""
        return self._known().get(run_id)

    def get_training_store(self, run_id: str) -> TrainingRunStore:
        """The (cached) store of a run."""
        if run_id not in self._training_stores:
            run = self.get_run(run_id)
            prefix = run.prefix if run else ""
            self._training_stores[run_id] = self.store_class(self.storage_for(run_id), prefix)
        return self._training_stores[run_id]

    def get_eval_store(self) -> object | None:
        """None: the cookbook's eval store is not ported."""
        return None


def discover_runs(storage: Storage, root_prefix: str = "") -> list[RunInfo]:
    """The runs at `root_prefix` of `storage`: itself when it is a run, else its child runs."""
    if _is_run_dir(storage, root_prefix):
        name = root_prefix.rstrip("/").rsplit("/", 1)[-1] if root_prefix else "root"
        return [_run_info(storage, name, root_prefix)]
    runs = []
    for child in sorted(storage.list_dir(root_prefix)):
        prefix = storage_join(root_prefix, child) if root_prefix else child
        if _is_run_dir(storage, prefix):
            runs.append(_run_info(storage, child, prefix))
    return runs


def _is_run_dir(storage: Storage, prefix: str) -> bool:
    return storage.exists(storage_join(prefix, "metrics.jsonl")) or storage.exists(
        storage_join(prefix, "config.json")
    )


def _status(store: TrainingRunStore) -> tuple[Status, float | None]:
    found = store.storage.stat(storage_join(store.prefix, "metrics.jsonl"))
    if found is None:
        return "idle", None
    if time.time() - found.mtime < ACTIVE_THRESHOLD_S:
        return "running", found.mtime
    if any(row.get("final") for row in store.read_checkpoints()):
        return "completed", found.mtime
    return "idle", found.mtime


def _training_type(store: TrainingRunStore) -> TrainingType | None:
    config = store.read_config()
    if config is None:
        return None
    for key, kind in (("dpo_beta", "dpo"), ("loss_fn", "rl"), ("num_epochs", "sl")):
        if key in config:
            return kind  # type: ignore[return-value]
    builder = config.get("dataset_builder")
    type_name = builder.get("__type__", "") if isinstance(builder, dict) else ""
    if "RL" in type_name:
        return "rl"
    if "Supervised" in type_name or "SL" in type_name:
        return "sl"
    return None


def _run_info(storage: Storage, run_id: str, prefix: str) -> RunInfo:
    store = TrainingRunStore(storage, prefix)
    status, last_updated = _status(store)
    return RunInfo(
        run_id=run_id,
        prefix=prefix,
        has_config=storage.exists(storage_join(prefix, "config.json")),
        has_metrics=storage.exists(storage_join(prefix, "metrics.jsonl")),
        has_checkpoints=storage.exists(storage_join(prefix, "checkpoints.jsonl")),
        has_timing=storage.exists(storage_join(prefix, "timing_spans.jsonl")),
        iteration_count=sum(1 for c in storage.list_dir(prefix) if ITERATION_DIR.match(c)),
        status=status,
        last_updated=last_updated,
        training_type=_training_type(store),
    )
