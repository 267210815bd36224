"""The checkpoint save policy: what `train` saves when, and with which TTL.

`Checkpointer` is the cookbook's `CheckpointManager`; each save is recorded as a
`checkpoints.jsonl` row (`shell.training._checkpoints`). Per `train` call:

- **periodic**: after step `i` when `save_every` divides `i + 1` (the row's `batch`), the
  training state *and* the sampler weights (`save_state` + `save_weights_for_sampler`,
  submitted together, then awaited), both with `TrainConfig.ttl_seconds` (the cookbook's 7
  days by default; None: kept indefinitely); the row has `state_path` and `sampler_path`;
- **rolling**: when `rolling_save_every` (> 0) divides the batch and no periodic save falls
  on it, the training state only, with `rolling_ttl_seconds`, in a row marked `"rolling":
  true`; once it is recorded, the previous rolling state is deleted
  (`service_client.create_rest_client().delete_checkpoint_from_tinker_path`, as the cookbook;
  a failed or impossible deletion is a warning, the TTL cleans up on Tinker). A rolling save
  that fails (the backend's error or an `OSError`) is a warning too and the run goes on, as
  the cookbook's manager only logs it: a resume then starts from the save before it. A
  resumed run deletes the rolling state its log dir still holds (`live_rolling_state`: the
  last rolling row's, unless a final row followed it) once it saved a newer one, also when it
  resumed from a periodic row saved after it (the cookbook's manager only deletes what its own
  process saved, and the local backend has no TTL, so such a state stayed for good);
- **final**: after the last step, state and sampler weights with no TTL (kept
  indefinitely), name `"final"`, then the last rolling state is deleted.

Deliberate differences from the cookbook, with no effect on what resumes: no periodic or
rolling save on the last batch (the cookbook saves `"000020"` and then `"final"` for the same
weights when `save_every` divides the step count); the saves are awaited in the loop (the
cookbook's rolling save overlaps the next step).

TTLs on the backends: Tinker expires checkpoints server-side; the local backend and the fake SDK
accept `ttl_seconds` and keep every checkpoint until it is deleted (`shell.local`), so a local
rolling state is removed by the deletion above, never by expiry.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Literal, Protocol, runtime_checkable

import tinker

from rlpure.usage import TokenUsage
from shell.clients import ServiceClient, TrainingClient
from shell.config import TrainConfig
from shell.errors import CheckpointError
from shell.training._checkpoints import (
    CheckpointRecord,
    append_checkpoint,
    checkpoint_name,
    load_checkpoints,
)

__all__ = ["Checkpointer", "live_rolling_state", "save_checkpoint"]

logger = logging.getLogger(__name__)


async def save_checkpoint(
    training_client: TrainingClient,
    *,
    log_dir: str | os.PathLike[str],
    step: int,
    rng_key_data: tuple[int, ...],
    final: bool = False,
    kl_reference_path: str | None = None,
    cumulative_tokens: TokenUsage | None = None,
    discarded_tokens: TokenUsage | None = None,
    kind: Literal["state", "both"] = "state",
    ttl_seconds: int | None = None,
    rolling: bool = False,
) -> CheckpointRecord:
    """Saves the training state (weights and optimizer), and with `kind="both"` the sampler
    weights too, then records them (the cookbook's `save_checkpoint_async`).

    Args:
        training_client: the run's training client.
        log_dir: the run's log directory.
        step: completed training steps.
        rng_key_data: the loop's PRNG key data after `step` steps.
        final: mark the record as the end of the run (its name is `"final"`).
        kl_reference_path: where the run's KL reference weights are, carried over on resume.
        cumulative_tokens: the run's running token totals after `step` steps (default zero).
        discarded_tokens: the part of them sampled for groups dropped before training.
        kind: `"state"` (`save_state` only) or `"both"` (and `save_weights_for_sampler`, the
            two submitted before either is awaited).
        ttl_seconds: the backend's retention of what is saved (None: indefinitely).
        rolling: mark the record as a rolling save.

    Returns:
        The record appended to `checkpoints.jsonl`, with the paths as the backend returned
        them (what `load_checkpoints` reads back; see the module docstring for the file).
    """
    # A unique suffix: a run killed between `save_state` and the record below, or resumed from
    # an earlier checkpoint, saves the same step again and must not collide with that state.
    name = f"step_{step:06d}" + ("_final" if final else "") + f"_{time.time_ns():x}"
    state_future = training_client.save_state(name, ttl_seconds=ttl_seconds)
    sampler_future = (
        training_client.save_weights_for_sampler(name, ttl_seconds=ttl_seconds)
        if kind == "both"
        else None
    )
    state = await state_future
    sampler_path = None if sampler_future is None else str((await sampler_future).path)
    record = CheckpointRecord(
        step=step,
        name=checkpoint_name(step, final=final),
        state_path=str(state.path),
        rng_key_data=tuple(int(x) for x in rng_key_data),
        final=final,
        wall_time=time.time(),
        kl_reference_path=kl_reference_path,
        cumulative_tokens=TokenUsage() if cumulative_tokens is None else cumulative_tokens,
        discarded_tokens=TokenUsage() if discarded_tokens is None else discarded_tokens,
        sampler_path=sampler_path,
        rolling=rolling,
    )
    append_checkpoint(log_dir, record)
    return record


@runtime_checkable
class _DeletingRestClient(Protocol):
    def delete_checkpoint_from_tinker_path(self, tinker_path: str) -> Any: ...


_DELETE_ERRORS = (tinker.TinkerError, CheckpointError, ValueError, OSError)
"""What a failed deletion of a rolling state raises (the SDK's errors, the local backend's)."""

_SAVE_ERRORS = (tinker.TinkerError, CheckpointError, OSError)
"""What a failed save raises: the SDK's errors, the local backend's, a full or unwritable disk
(`checkpoints.jsonl`). Only a rolling save's is caught (a warning); others stop the run."""


def live_rolling_state(records: list[CheckpointRecord]) -> str | None:
    """The rolling state a log dir's `records` (oldest first) leave undeleted: the last
    rolling row's, unless a final row (which deletes it) followed; each rolling save deletes
    the one before it, a periodic save none.

    Examples:
        >>> def row(name, rolling=False, final=False):
        ...     return CheckpointRecord(step=0, name=name, state_path=name, rng_key_data=(0,),
        ...         final=final, wall_time=0.0, kl_reference_path=None, rolling=rolling)
        >>> live_rolling_state([row("r1", True), row("r2", True), row("p3")])
        'r2'
        >>> live_rolling_state([row("r1", True), row("final", final=True)]) is None
        True
    """
    for record in reversed(records):
        if record.final:
            return None
        if record.rolling:
            return record.state_path
    return None


class Checkpointer:
    """The periodic, rolling and final saves of one `train` call (the cookbook's
    `CheckpointManager`; see the module docstring for what is saved when).

    Args:
        training_client: the run's training client.
        service_client: its service; its `create_rest_client()` deletes superseded rolling
            states (a service without one, as the fake SDK, leaves them, with a warning).
        log_dir: the run's log directory.
        config: the run's config (`save_every`, `ttl_seconds`, `rolling_save_every`,
            `rolling_ttl_seconds`).
        num_steps: the step count of the run (no periodic or rolling save at it: the final
            save follows).
        resumed_from: the checkpoint the run resumed from; a rolling one is deleted once a
            newer rolling or the final save is recorded.

    Examples:
        >>> import asyncio
        >>> from shell.fakes import FakeServiceClient
        >>> from shell.training._checkpoints import load_checkpoints
        >>> def rows(log_dir):
        ...     return [(r.name, r.rolling, r.sampler_path is not None)
        ...             for r in load_checkpoints(log_dir)]
        >>> async def run(log_dir):
        ...     service = FakeServiceClient()
        ...     client = await service.create_lora_training_client(base_model="m")
        ...     config = TrainConfig(log_dir=log_dir, save_every=2, rolling_save_every=1)
        ...     saves = Checkpointer(client, service_client=service, log_dir=log_dir,
        ...                          config=config, num_steps=3, resumed_from=None)
        ...     for step in (1, 2, 3):
        ...         await saves.save(step, rng_key_data=(0, step), kl_reference_path=None,
        ...                          cumulative_tokens=TokenUsage(),
        ...                          discarded_tokens=TokenUsage(), final=step == 3)
        >>> import tempfile, logging
        >>> logging.disable(logging.WARNING)
        >>> with tempfile.TemporaryDirectory() as log_dir:
        ...     asyncio.run(run(log_dir))
        ...     rows(log_dir)
        [('000001', True, False), ('000002', False, True), ('final', False, True)]
        >>> logging.disable(logging.NOTSET)
    """

    def __init__(
        self,
        training_client: TrainingClient,
        *,
        service_client: ServiceClient,
        log_dir: str | os.PathLike[str],
        config: TrainConfig,
        num_steps: int,
        resumed_from: CheckpointRecord | None,
    ) -> None:
        self._training_client = training_client
        self._service_client = service_client
        self._log_dir = log_dir
        self._config = config
        self._num_steps = num_steps
        self._previous_rolling = (
            None if resumed_from is None else live_rolling_state(load_checkpoints(log_dir))
        )

    def due(self, step: int) -> Literal["periodic", "rolling"] | None:
        """Which save, if any, falls after `step` completed steps (before the last)."""
        if step <= 0 or step >= self._num_steps:
            return None
        config = self._config
        if config.save_every and step % config.save_every == 0:
            return "periodic"
        if config.rolling_save_every and step % config.rolling_save_every == 0:
            return "rolling"
        return None

    async def save(
        self,
        step: int,
        *,
        final: bool = False,
        periodic: bool = False,
        rng_key_data: tuple[int, ...],
        kl_reference_path: str | None,
        cumulative_tokens: TokenUsage,
        discarded_tokens: TokenUsage,
    ) -> CheckpointRecord | None:
        """The save due after `step` completed steps (`final`: the end of the run, always
        saved), recorded; None when none is due.

        Args:
            step: completed training steps.
            final: the run ends here: state and sampler weights, no TTL, then the last
                rolling state is deleted.
            periodic: save a periodic checkpoint whatever the cadence, e.g. the one the
                cookbook's async loop saves at the run's first batch (`do_async_training`
                saves `"000000"` and samples from its `sampler_path`).
            rng_key_data: the loop's PRNG key data after `step` steps.
            kl_reference_path: where the run's KL reference weights are (or None).
            cumulative_tokens: the run's running token totals after `step` steps.
            discarded_tokens: the part of them sampled for groups dropped before training.
        """
        kind = "final" if final else "periodic" if periodic else self.due(step)
        if kind is None:
            return None
        config = self._config
        try:
            record = await save_checkpoint(
                self._training_client,
                log_dir=self._log_dir,
                step=step,
                rng_key_data=rng_key_data,
                final=final,
                kl_reference_path=kl_reference_path,
                cumulative_tokens=cumulative_tokens,
                discarded_tokens=discarded_tokens,
                kind="state" if kind == "rolling" else "both",
                ttl_seconds={
                    "final": None,
                    "periodic": config.ttl_seconds,
                    "rolling": config.rolling_ttl_seconds,
                }[kind],
                rolling=kind == "rolling",
            )
        except _SAVE_ERRORS as error:
            if kind != "rolling":
                raise
            logger.warning(
                "the rolling checkpoint after step %d failed (%s: %s); the run goes on, and a "
                "resume starts from the save before it",
                step,
                type(error).__name__,
                error,
            )
            return None
        if kind != "periodic":
            await self._delete_previous_rolling()
        if kind == "rolling":
            self._previous_rolling = record.state_path
        return record

    async def _delete_previous_rolling(self) -> None:
        path, self._previous_rolling = self._previous_rolling, None
        if path is None:
            return
        make_rest_client = getattr(self._service_client, "create_rest_client", None)
        rest_client = None if make_rest_client is None else make_rest_client()
        if not isinstance(rest_client, _DeletingRestClient):
            logger.warning(
                "cannot delete the superseded rolling checkpoint %s: %s has no REST client "
                "that deletes checkpoints",
                path,
                type(self._service_client).__name__,
            )
            return
        try:
            await rest_client.delete_checkpoint_from_tinker_path(path)
        except _DELETE_ERRORS as error:
            logger.warning(
                "failed to delete the superseded rolling checkpoint %s (%s); its TTL cleans it "
                "up on Tinker",
                path,
                error,
            )
        else:
            logger.info("deleted the superseded rolling checkpoint %s", path)
