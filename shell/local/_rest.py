"""The local backend's REST client: training runs and checkpoints, read from the checkpoint files.

The SDK's `RestClient` (from `ServiceClient.create_rest_client()`) queries the Tinker server
about training runs and their checkpoints. Here every answer comes from the service's
`LocalRuntime` (the training runs its clients opened) and from the checkpoint directories'
manifests (`shell.local._checkpoints`), so it also answers for runs of earlier processes whose
checkpoints are on disk.

Conventions:
- A *tinker path* is what `save_state` / `save_weights_for_sampler` returned: the checkpoint
  directory's filesystem path (`<checkpoint_dir>/<training run id>/<state|sampler>/<name>`). A
  checkpoint's id is `"<kind>/<name>"` (the SDK's `"weights/<name>"` /
  `"sampler_weights/<name>"`), its type `"training"` or `"sampler"`.
- A training run is known if this service opened it or if its folder exists under the service's
  checkpoint directory. `TrainingRun.user_metadata` is the `user_metadata` its training client
  was created with (recorded in every checkpoint it saved), as on Tinker; the cookbook's resume
  reads the renderer name from it (`check_renderer_name_for_checkpoint_async`).
- Every method returns a ready `APIFuture` (await it or `.result()` it), as the SDK's do.
- An unknown run or a path that is not a local checkpoint raises `LocalLookupError`, a
  `CheckpointError` that is also a `ValueError`: the SDK raises `ValueError` for a path it
  cannot parse, and the cookbook catches `(tinker.TinkerError, ValueError)` around these calls,
  so a missing checkpoint is logged as a warning there, as on Tinker.
- Checkpoints never expire locally (`ttl_seconds` is accepted and ignored by the saves), so
  `Checkpoint.expires_at` is `None`; deletion (`delete_checkpoint*`) removes the directory, and
  refuses anything that is not a local checkpoint.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import tinker
from tinker import types

from shell.errors import CheckpointError
from shell.local._checkpoints import (
    CheckpointInfo,
    checkpoint_name,
    delete_checkpoint,
    read_checkpoint_info,
)
from shell.local._futures import ReadyFuture
from shell.local._runtime import LocalRuntime, TrainingRunRecord

__all__ = ["LocalLookupError", "LocalRestClient"]

_KIND_TO_TYPE: Mapping[str, types.CheckpointType] = {"state": "training", "sampler": "sampler"}
_OWNER = "local"


class LocalLookupError(CheckpointError, ValueError):
    """A training run or checkpoint the local backend does not know (or a non-checkpoint path)."""


def _timestamp(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, tz=dt.UTC)


def _as_checkpoint(info: CheckpointInfo) -> types.Checkpoint:
    return types.Checkpoint(
        checkpoint_id=f"{info.kind}/{info.name}",
        checkpoint_type=_KIND_TO_TYPE[info.kind],
        time=_timestamp(info.saved_at),
        tinker_path=info.path,
        size_bytes=info.size_bytes,
        user_metadata=info.user_metadata or None,
        expires_at=None,
    )


class LocalRestClient:
    """The SDK's `RestClient` calls the cookbook makes, answered from local checkpoints.

    Internal: get one from `LocalServiceClient.create_rest_client()`.
    """

    def __init__(self, runtime: LocalRuntime) -> None:
        self._runtime = runtime

    # -- lookups --

    def _info(self, tinker_path: str) -> CheckpointInfo:
        if not isinstance(tinker_path, str) or not tinker_path:
            raise LocalLookupError(f"expected a local checkpoint path, got {tinker_path!r}")
        try:
            return read_checkpoint_info(tinker_path)
        except LocalLookupError:
            raise
        except CheckpointError as err:
            raise LocalLookupError(f"not a local checkpoint: {err}") from err

    def _run_directory(self, training_run_id: str) -> Path | None:
        root = self._runtime.checkpoint_root
        if root is None:
            return None
        try:
            checkpoint_name(training_run_id)
        except ValueError:
            return None
        directory = root / training_run_id
        return directory if directory.is_dir() else None

    def _checkpoints(self, training_run_id: str) -> list[CheckpointInfo]:
        """The run's readable checkpoints on disk, oldest first (unreadable ones skipped)."""
        directory = self._run_directory(training_run_id)
        if directory is None:
            return []
        found = []
        for kind in ("state", "sampler"):
            folder = directory / kind
            if not folder.is_dir():
                continue
            for entry in sorted(folder.iterdir()):
                if entry.name.startswith(".") or not entry.is_dir():
                    continue  # staging and aside copies of interrupted writes
                try:
                    found.append(read_checkpoint_info(os.path.abspath(entry)))
                except CheckpointError:
                    continue
        return sorted(found, key=lambda info: (info.saved_at, info.path))

    def _training_run(self, training_run_id: str) -> types.TrainingRun:
        record: TrainingRunRecord | None = self._runtime.training_runs.get(training_run_id)
        checkpoints = self._checkpoints(training_run_id)
        if record is None and not checkpoints:
            raise LocalLookupError(
                f"unknown local training run {training_run_id!r} (not opened by this service and "
                f"no checkpoints of it under {self._runtime.checkpoint_root})"
            )
        states = [info for info in checkpoints if info.kind == "state"]
        samplers = [info for info in checkpoints if info.kind == "sampler"]
        if record is not None:
            base_model, lora_rank = record.base_model, record.lora_rank
            metadata, last_time = record.user_metadata, record.created_at
        else:
            newest = checkpoints[-1]
            base_model, lora_rank, metadata = newest.base_model, None, newest.run_metadata
            last_time = newest.saved_at
        if checkpoints:
            last_time = max(last_time, checkpoints[-1].saved_at)
        return types.TrainingRun(
            training_run_id=training_run_id,
            base_model=base_model,
            model_owner=_OWNER,
            is_lora=False,
            lora_rank=lora_rank,
            last_request_time=_timestamp(last_time),
            last_checkpoint=_as_checkpoint(states[-1]) if states else None,
            last_sampler_checkpoint=_as_checkpoint(samplers[-1]) if samplers else None,
            user_metadata=dict(metadata) or None,
        )

    # -- SDK surface --

    def get_server_capabilities(self) -> tinker.APIFuture[types.GetServerCapabilitiesResponse]:
        """The local models, all trainable and sampleable."""
        return ReadyFuture(self._runtime.server_capabilities())

    def get_training_run(
        self,
        training_run_id: types.ModelID,
        access_scope: Literal["owned", "accessible"] = "owned",
    ) -> tinker.APIFuture[types.TrainingRun]:
        """The training run `training_run_id` (a training client's `model_id`).

        Raises:
            LocalLookupError: neither opened by this service nor found on disk.
        """
        return ReadyFuture(self._training_run(training_run_id))

    def get_training_run_by_tinker_path(
        self, tinker_path: str, access_scope: Literal["owned", "accessible"] = "owned"
    ) -> tinker.APIFuture[types.TrainingRun]:
        """The training run that saved the checkpoint at `tinker_path`; its `user_metadata` is
        the run's (recorded in the checkpoint), even when the run was another process's.

        Raises:
            LocalLookupError: `tinker_path` is not a readable local checkpoint.
        """
        info = self._info(tinker_path)
        try:
            run = self._training_run(info.training_run_id)
        except LocalLookupError:  # a checkpoint moved out of its run's folder: its own manifest
            run = types.TrainingRun(
                training_run_id=info.training_run_id,
                base_model=info.base_model,
                model_owner=_OWNER,
                is_lora=False,
                last_request_time=_timestamp(info.saved_at),
                user_metadata=dict(info.run_metadata) or None,
            )
        if run.user_metadata is None and info.run_metadata:
            run = run.model_copy(update={"user_metadata": dict(info.run_metadata)})
        return ReadyFuture(run)

    def get_weights_info_by_tinker_path(
        self, tinker_path: str
    ) -> tinker.APIFuture[types.WeightsInfoResponse]:
        """The base model of the checkpoint at `tinker_path` (full weights: `is_lora=False`).

        Raises:
            LocalLookupError: `tinker_path` is not a readable local checkpoint.
        """
        info = self._info(tinker_path)
        return ReadyFuture(types.WeightsInfoResponse(base_model=info.base_model, is_lora=False))

    def list_checkpoints(
        self, training_run_id: types.ModelID
    ) -> tinker.APIFuture[types.CheckpointsListResponse]:
        """The run's checkpoints on disk, state and sampler, oldest first.

        Raises:
            LocalLookupError: the run is unknown.
        """
        self._training_run(training_run_id)
        return ReadyFuture(
            types.CheckpointsListResponse(
                checkpoints=[_as_checkpoint(info) for info in self._checkpoints(training_run_id)]
            )
        )

    def delete_checkpoint(
        self, training_run_id: types.ModelID, checkpoint_id: str
    ) -> tinker.APIFuture[None]:
        """Deletes checkpoint `checkpoint_id` (`"state/<name>"` or `"sampler/<name>"`) of a run.

        Raises:
            LocalLookupError: no such checkpoint.
        """
        for info in self._checkpoints(training_run_id):
            if f"{info.kind}/{info.name}" == checkpoint_id:
                delete_checkpoint(info.path)
                return ReadyFuture(None)
        raise LocalLookupError(
            f"training run {training_run_id!r} has no checkpoint {checkpoint_id!r}"
        )

    def delete_checkpoint_from_tinker_path(self, tinker_path: str) -> tinker.APIFuture[None]:
        """Deletes the checkpoint at `tinker_path` (only a local checkpoint directory).

        Raises:
            LocalLookupError: `tinker_path` is not a readable local checkpoint (nothing deleted).
        """
        self._info(tinker_path)
        delete_checkpoint(tinker_path)
        return ReadyFuture(None)
