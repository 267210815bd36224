"""`tinker_cookbook.checkpoint_utils`: `checkpoints.jsonl` rows and renderer metadata.

The rows are read and appended by `shell.training._checkpoints` (`read_checkpoint_rows`,
`append_checkpoint_row`); the renderer metadata is `shell.run_metadata`. What is defined here
adapts them to the cookbook 0.6.1 names and signatures: its `CheckpointRecord` dataclass (the
known keys typed, the rest in `extra`), `save_checkpoint(_async)` (save through the training
client, then append `{"name": ..., **loop_state, **paths}`), `get_last_checkpoint`, and
`CheckpointManager` (periodic, rolling and final saves of a hand-written loop).

Deliberate differences: a torn last line of `checkpoints.jsonl` (a kill during an append) is
ignored with a warning instead of raising, and an append cuts it off first; rows are fsynced;
`@trace.scope` spans are not recorded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import tinker

from shell.clients import TrainingClient
from shell.model_meta import get_recommended_renderer_name
from shell.run_metadata import (
    RENDERER_NAME_METADATA_KEY,
    check_checkpoint_renderer,
    checkpoint_renderer_name,
    checkpoint_renderer_name_async,
    renderer_metadata,
)
from shell.training._checkpoints import (
    CHECKPOINTS_FILE,
    append_checkpoint_row,
    read_checkpoint_rows,
)

__all__ = [
    "CHECKPOINTS_BASE_NAME",
    "RENDERER_NAME_METADATA_KEY",
    "CheckpointManager",
    "CheckpointRecord",
    "add_renderer_name_to_user_metadata",
    "check_renderer_name_for_checkpoint",
    "check_renderer_name_for_checkpoint_async",
    "get_last_checkpoint",
    "get_renderer_name_from_checkpoint",
    "get_renderer_name_from_checkpoint_async",
    "load_checkpoints_file",
    "resolve_renderer_name_from_checkpoint_or_default",
    "resolve_renderer_name_from_checkpoint_or_default_async",
    "save_checkpoint",
    "save_checkpoint_async",
]

logger = logging.getLogger(__name__)

CHECKPOINTS_BASE_NAME = CHECKPOINTS_FILE
"""The file of checkpoint rows in a log dir (`checkpoints.jsonl`)."""

get_renderer_name_from_checkpoint = checkpoint_renderer_name
get_renderer_name_from_checkpoint_async = checkpoint_renderer_name_async

_MISSING: Any = object()  # "not given", apart from None


class _Store(Protocol):
    """The cookbook's `TrainingRunStore`, as far as checkpoint rows go."""

    def write_checkpoint(self, record: dict[str, Any]) -> None: ...


@dataclass
class CheckpointRecord:
    """One row of `checkpoints.jsonl` (the cookbook's): the known keys typed, every other key
    (a loop's own `loop_state` keys, rlpure's `step`, ...) in `extra`, so a row round-trips.

    Attributes:
        name: the checkpoint's name (`"000020"`, `"final"`).
        batch: the next batch to train, when the row records it.
        epoch: the epoch, when recorded.
        final: whether the run ended here, when recorded.
        state_path: the training state (weights and optimizer), when saved.
        sampler_path: the sampler weights, when saved.
        extra: the row's other keys.
    """

    name: str
    batch: int | None = None
    epoch: int | None = None
    final: bool | None = None
    state_path: str | None = None
    sampler_path: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        overlap = set(self.extra) & _KNOWN_KEYS
        if overlap:
            logger.warning("CheckpointRecord: dropping known keys from extra: %s", overlap)
            self.extra = {k: v for k, v in self.extra.items() if k not in overlap}

    def to_dict(self) -> dict[str, Any]:
        """The row: `name`, the known keys that are not None (in field order), then `extra`."""
        row: dict[str, Any] = {"name": self.name}
        for key in ("batch", "epoch", "final", "state_path", "sampler_path"):
            if getattr(self, key) is not None:
                row[key] = getattr(self, key)
        row.update(self.extra)
        return row

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CheckpointRecord:
        """The record of a row (which needs a `name`); unknown keys go to `extra`."""
        return cls(
            name=d["name"],
            batch=d.get("batch"),
            epoch=d.get("epoch"),
            final=d.get("final"),
            state_path=d.get("state_path"),
            sampler_path=d.get("sampler_path"),
            extra={k: v for k, v in d.items() if k not in _KNOWN_KEYS},
        )

    def has(self, key: str) -> bool:
        """Whether `key` is present: a known key that is not None, or a key of `extra`."""
        if key in _KNOWN_KEYS:
            return getattr(self, key) is not None
        return key in self.extra

    def get(self, key: str, default: Any = _MISSING) -> Any:
        """A known key's value (None when unset), else `extra[key]`, else `default` (None
        when not given)."""
        if key in _KNOWN_KEYS:
            return getattr(self, key)
        return self.extra.get(key, None if default is _MISSING else default)


_KNOWN_KEYS = frozenset(f.name for f in dataclasses.fields(CheckpointRecord) if f.name != "extra")


def add_renderer_name_to_user_metadata(
    user_metadata: dict[str, str], renderer_name: str | None
) -> None:
    """Records `renderer_name` in `user_metadata`, in place (nothing for None or "")."""
    user_metadata.update(renderer_metadata(renderer_name))


def _default_renderer(model_name: str, checkpoint: str | None, found: str | None) -> str:
    if found is not None:
        logger.info("Using renderer from checkpoint metadata for %s: %s", checkpoint, found)
        return found
    return get_recommended_renderer_name(model_name)


def resolve_renderer_name_from_checkpoint_or_default(
    *,
    model_name: str,
    explicit_renderer_name: str | None,
    load_checkpoint_path: str | None,
    base_url: str | None = None,
) -> str:
    """The renderer of a run: `explicit_renderer_name`, else the one recorded for
    `load_checkpoint_path` (looked up through `tinker.ServiceClient(base_url=base_url)`, so a
    process that binds `tinker.ServiceClient = shell.LocalServiceClient` looks up locally),
    else the model's recommended renderer."""
    if explicit_renderer_name is not None:
        return explicit_renderer_name
    found = None
    if load_checkpoint_path is not None:
        service_client = tinker.ServiceClient(base_url=base_url)
        found = checkpoint_renderer_name(service_client, load_checkpoint_path)
    return _default_renderer(model_name, load_checkpoint_path, found)


async def resolve_renderer_name_from_checkpoint_or_default_async(
    *,
    model_name: str,
    explicit_renderer_name: str | None,
    load_checkpoint_path: str | None,
    base_url: str | None = None,
) -> str:
    """`resolve_renderer_name_from_checkpoint_or_default`, awaiting the lookup."""
    if explicit_renderer_name is not None:
        return explicit_renderer_name
    found = None
    if load_checkpoint_path is not None:
        service_client = tinker.ServiceClient(base_url=base_url)
        found = await checkpoint_renderer_name_async(service_client, load_checkpoint_path)
    return _default_renderer(model_name, load_checkpoint_path, found)


def check_renderer_name_for_checkpoint(
    service_client: Any, checkpoint_path: str, expected_renderer_name: str | None
) -> None:
    """Logs whether `checkpoint_path`'s recorded renderer is `expected_renderer_name` (a
    warning on a mismatch); nothing when `expected_renderer_name` is None."""
    if expected_renderer_name is None:
        return
    recorded = checkpoint_renderer_name(service_client, checkpoint_path)
    check_checkpoint_renderer(checkpoint_path, expected=expected_renderer_name, recorded=recorded)


async def check_renderer_name_for_checkpoint_async(
    service_client: Any, checkpoint_path: str, expected_renderer_name: str | None
) -> None:
    """`check_renderer_name_for_checkpoint`, awaiting the lookup."""
    if expected_renderer_name is None:
        return
    recorded = await checkpoint_renderer_name_async(service_client, checkpoint_path)
    check_checkpoint_renderer(checkpoint_path, expected=expected_renderer_name, recorded=recorded)


def load_checkpoints_file(log_dir: str) -> list[CheckpointRecord]:
    """Every row of `<log_dir>/checkpoints.jsonl` (none: an empty list), oldest first."""
    rows = read_checkpoint_rows(log_dir)
    if not rows:
        logger.info("No checkpoints found at %s/%s", log_dir, CHECKPOINTS_FILE)
    return [CheckpointRecord.from_dict(row) for row in rows]


def get_last_checkpoint(log_dir: str, required_key: str = "state_path") -> CheckpointRecord | None:
    """The last row of `log_dir` that has `required_key` (default: a resumable state), or None.

    Rows without it (a sampler-only save) are skipped, as the cookbook does.
    """
    usable = [r for r in load_checkpoints_file(log_dir) if r.has(required_key)]
    if not usable:
        logger.info("No checkpoints found with key %s in %s", required_key, log_dir)
        return None
    logger.info(
        "Found %d valid checkpoints with key '%s' in %s", len(usable), required_key, log_dir
    )
    logger.info("Using last checkpoint: %s", usable[-1])
    return usable[-1]


async def save_checkpoint_async(
    training_client: TrainingClient,
    name: str,
    log_path: str,
    loop_state: dict[str, Any],
    kind: Literal["state", "sampler", "both"] = "state",
    ttl_seconds: int | None = None,
    store: _Store | None = None,
) -> dict[str, str]:
    """Saves the training state (`kind="state"`), the sampler weights (`"sampler"`) or both,
    submitted together, then appends the row `{"name": name, **loop_state, **paths}` to
    `<log_path>/checkpoints.jsonl` (or hands it to `store.write_checkpoint`).

    Returns:
        `{"state_path": ..., "sampler_path": ...}`, the paths saved.
    """
    futures: dict[str, Any] = {}  # the SDK's futures of save responses
    if kind in ("state", "both"):
        futures["state"] = training_client.save_state(name, ttl_seconds=ttl_seconds)
    if kind in ("sampler", "both"):
        futures["sampler"] = training_client.save_weights_for_sampler(name, ttl_seconds=ttl_seconds)
    paths = {f"{k}_path": str((await future).path) for k, future in futures.items()}
    logger.info("Saved checkpoints: %s", paths)
    row = CheckpointRecord.from_dict({"name": name, **loop_state, **paths}).to_dict()
    if store is not None:
        store.write_checkpoint(row)
    else:
        append_checkpoint_row(log_path, row)
    return paths


def save_checkpoint(
    training_client: TrainingClient,
    name: str,
    log_path: str,
    loop_state: dict[str, Any],
    kind: Literal["state", "sampler", "both"] = "state",
    ttl_seconds: int | None = None,
    store: _Store | None = None,
) -> dict[str, str]:
    """`save_checkpoint_async`, run to completion (`asyncio.run`: not inside a running loop)."""
    return asyncio.run(
        save_checkpoint_async(
            training_client,
            name=name,
            log_path=log_path,
            kind=kind,
            loop_state=loop_state,
            ttl_seconds=ttl_seconds,
            store=store,
        )
    )


class CheckpointManager:
    """Periodic, rolling and final saves of a hand-written loop (the cookbook's).

    - periodic: state and sampler weights every `save_every` steps (or `save_every_tokens`
      tokens, or `save_every_seconds`), named `f"{step:06d}"`, with `ttl_seconds`; in the
      background with `async_periodic_saves` (its row is appended once it completes);
    - rolling: the state only every `rolling_save_every` steps (not on a periodic step), in the
      background, its row marked `"rolling": true`, with `rolling_ttl_seconds`; once the next
      one is saved the previous state is deleted through
      `service_client.create_rest_client().delete_checkpoint_from_tinker_path` (a failure is
      a warning);
    - final: state and sampler weights named `"final"`, no TTL, after the pending saves; then
      the last rolling state is deleted.

    A failed rolling or background save is a warning; a periodic or final one raises.
    """

    def __init__(
        self,
        training_client: TrainingClient,
        service_client: Any,
        log_path: str,
        save_every: int = 0,
        save_every_tokens: int = 0,
        save_every_seconds: float = 0.0,
        ttl_seconds: int | None = 604800,
        rolling_save_every: int = 0,
        rolling_ttl_seconds: int = 7200,
        store: _Store | None = None,
        async_periodic_saves: bool = False,
    ) -> None:
        self._training_client = training_client
        self._service_client = service_client
        self._log_path = log_path
        self._save_every = save_every
        self._save_every_tokens = save_every_tokens
        self._save_every_seconds = save_every_seconds
        self._ttl_seconds = ttl_seconds
        self._rolling_save_every = rolling_save_every
        self._rolling_ttl_seconds = rolling_ttl_seconds
        self._store = store
        self._async_periodic_saves = async_periodic_saves
        self._pending_rolling_task: asyncio.Task[None] | None = None
        self._pending_periodic_task: asyncio.Task[dict[str, str]] | None = None
        self._prev_state_path: str | None = None
        self._last_saved_tokens = 0
        self._last_saved_wall_time = time.perf_counter()

    def restore_last_saved_tokens(self, last_saved_tokens: int) -> None:
        """Counts `save_every_tokens` from `last_saved_tokens` (a resumed run's)."""
        self._last_saved_tokens = last_saved_tokens

    def should_save_periodic(self, step: int, *, elapsed_tokens: int = 0) -> bool:
        """Whether a periodic save is due after `step` (by steps, tokens or seconds)."""
        if step <= 0:
            return False
        by_step = self._save_every > 0 and step % self._save_every == 0
        by_tokens = (
            self._save_every_tokens > 0
            and elapsed_tokens - self._last_saved_tokens >= self._save_every_tokens
        )
        by_seconds = (
            self._save_every_seconds > 0
            and time.perf_counter() - self._last_saved_wall_time >= self._save_every_seconds
        )
        return by_step or by_tokens or by_seconds

    def _periodic_args(self, step: int, loop_state: dict[str, Any]) -> dict[str, Any]:
        return {
            "training_client": self._training_client,
            "name": f"{step:06d}",
            "log_path": self._log_path,
            "loop_state": loop_state,
            "kind": "both",
            "ttl_seconds": self._ttl_seconds,
            "store": self._store,
        }

    async def save_periodic_async(self, step: int, loop_state: dict[str, Any]) -> dict[str, str]:
        """Saves a periodic checkpoint (state and sampler weights) now; returns its paths."""
        return await save_checkpoint_async(**self._periodic_args(step, loop_state))

    def save_periodic(self, step: int, loop_state: dict[str, Any]) -> dict[str, str]:
        """`save_periodic_async`, run to completion."""
        return save_checkpoint(**self._periodic_args(step, loop_state))

    def _should_save_rolling(self, step: int) -> bool:
        if self._rolling_save_every <= 0 or step <= 0 or step % self._rolling_save_every:
            return False
        return not (self._save_every > 0 and step % self._save_every == 0)

    async def maybe_save_rolling_async(self, step: int, loop_state: dict[str, Any]) -> None:
        """Waits for the pending rolling save, then starts one in the background if due."""
        await self._resolve_pending_rolling_async()
        if self._should_save_rolling(step):
            self._pending_rolling_task = asyncio.create_task(
                self._do_rolling_save_async(step, loop_state),
                name=f"rolling_checkpoint_{step:06d}",
            )

    def maybe_save_rolling(self, step: int, loop_state: dict[str, Any]) -> None:
        """Saves a rolling checkpoint now if due; a failure is a warning."""
        if not self._should_save_rolling(step):
            return
        try:
            asyncio.run(self._do_rolling_save_async(step, loop_state))
        except Exception:
            logger.warning("Rolling checkpoint save failed", exc_info=True)

    async def maybe_save_async(
        self, step: int, loop_state: dict[str, Any], *, elapsed_tokens: int = 0
    ) -> dict[str, str] | None:
        """The periodic save if due, then the rolling one if due; returns the periodic paths
        when saved in the foreground, else None."""
        result: dict[str, str] | None = None
        if self.should_save_periodic(step, elapsed_tokens=elapsed_tokens):
            if self._async_periodic_saves:
                await self._resolve_pending_periodic_async()
                self._pending_periodic_task = asyncio.create_task(
                    self.save_periodic_async(step, loop_state),
                    name=f"periodic_checkpoint_{step:06d}",
                )
            else:
                result = await self.save_periodic_async(step, loop_state)
            self._last_saved_tokens = elapsed_tokens
            self._last_saved_wall_time = time.perf_counter()
        await self.maybe_save_rolling_async(step, loop_state)
        return result

    def maybe_save(
        self, step: int, loop_state: dict[str, Any], *, elapsed_tokens: int = 0
    ) -> dict[str, str] | None:
        """`maybe_save_async` without an event loop (every save in the foreground)."""
        result: dict[str, str] | None = None
        if self.should_save_periodic(step, elapsed_tokens=elapsed_tokens):
            result = self.save_periodic(step, loop_state)
            self._last_saved_tokens = elapsed_tokens
            self._last_saved_wall_time = time.perf_counter()
        self.maybe_save_rolling(step, loop_state)
        return result

    def _final_args(self, loop_state: dict[str, Any]) -> dict[str, Any]:
        return {**self._periodic_args(0, loop_state), "name": "final", "ttl_seconds": None}

    async def save_final_async(self, loop_state: dict[str, Any]) -> dict[str, str]:
        """Saves the final checkpoint (no TTL) after the pending saves, then deletes the last
        rolling state."""
        await self._resolve_pending_periodic_async()
        await self._resolve_pending_rolling_async()
        paths = await save_checkpoint_async(**self._final_args(loop_state))
        await self.finalize_async()
        return paths

    def save_final(self, loop_state: dict[str, Any]) -> dict[str, str]:
        """`save_final_async` without an event loop."""
        paths = save_checkpoint(**self._final_args(loop_state))
        self.finalize()
        return paths

    async def finalize_async(self) -> None:
        """Waits for the pending saves, then deletes the last rolling state."""
        await self._resolve_pending_periodic_async()
        await self._resolve_pending_rolling_async()
        await self._delete_prev_async()

    def finalize(self) -> None:
        """Deletes the last rolling state (a failure is a warning)."""
        try:
            asyncio.run(self._delete_prev_async())
        except Exception:
            logger.warning("Failed to delete last rolling checkpoint", exc_info=True)

    async def _resolve_pending_rolling_async(self) -> None:
        task, self._pending_rolling_task = self._pending_rolling_task, None
        if task is not None:
            try:
                await task
            except Exception:
                logger.warning("Rolling checkpoint save failed", exc_info=True)

    async def _resolve_pending_periodic_async(self) -> None:
        task, self._pending_periodic_task = self._pending_periodic_task, None
        if task is not None:
            try:
                await task
            except Exception:
                logger.warning("Background periodic checkpoint save failed", exc_info=True)

    async def _do_rolling_save_async(self, step: int, loop_state: dict[str, Any]) -> None:
        paths = await save_checkpoint_async(
            training_client=self._training_client,
            name=f"{step:06d}",
            log_path=self._log_path,
            loop_state={**loop_state, "rolling": True},
            kind="state",
            ttl_seconds=self._rolling_ttl_seconds,
            store=self._store,
        )
        await self._delete_prev_async()
        self._prev_state_path = paths.get("state_path")

    async def _delete_prev_async(self) -> None:
        path, self._prev_state_path = self._prev_state_path, None
        if path is None:
            return
        try:
            rest_client = self._service_client.create_rest_client()
            await rest_client.delete_checkpoint_from_tinker_path(path)
            logger.info("Deleted rolling checkpoint %s", path)
        except Exception:
            logger.warning(
                "Failed to delete rolling checkpoint %s (TTL will clean up)", path, exc_info=True
            )
