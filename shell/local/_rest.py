"""The local backend's REST client: training runs and checkpoints, read from the checkpoint files.

The SDK's `RestClient` (from `ServiceClient.create_rest_client()`) queries the Tinker server
about training runs and their checkpoints. Here every answer comes from the service's
`LocalRuntime` (the training runs its clients opened), the runs' `run.json` records and the
checkpoint directories' manifests (`shell.local._checkpoints`), so it also answers for runs of
other and earlier processes sharing the checkpoint directory (by default the user's store,
`shell.data_dir.default_checkpoint_dir()`).

Conventions:
- A *tinker path* is what `save_state` / `save_weights_for_sampler` returned: the checkpoint
  directory's filesystem path (`<checkpoint_dir>/<training run id>/<state|sampler>/<name>`). A
  checkpoint's id is the SDK's `"weights/<name>"` / `"sampler_weights/<name>"` (an earlier
  rlpure's `"state/<name>"` / `"sampler/<name>"` is still accepted by `delete_checkpoint`), its
  type `"training"` or `"sampler"`.
- A training run is known if this service opened it, if its folder under the service's
  checkpoint directory holds its `run.json` (written when it was opened, so a run with no
  checkpoint yet is known to every process) or if the folder holds checkpoints of it (runs of an
  earlier rlpure, which wrote no `run.json`). `TrainingRun.user_metadata` is the `user_metadata`
  its training client was created with (recorded in `run.json` and in every checkpoint it
  saved), as on Tinker; the cookbook's resume reads the renderer name from it
  (`check_renderer_name_for_checkpoint_async`). `is_lora` is whether the run trains LoRA
  adapters (a pretrained model; a toy model trains every weight), `lora_rank` the `rank` it
  was created with (a LoRA checkpoint's own rank where the run has no `run.json`).
- Listings are newest first and paged by `offset` and `limit`, with a `Cursor` whose
  `total_count` counts every item: `list_training_runs` orders runs by creation time (an
  earlier rlpure's run: its oldest checkpoint's), `list_user_checkpoints` every run's
  checkpoints by the time they were saved. Every process of the user shares the default
  checkpoint directory, so they list each other's runs.
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
# the SDK's checkpoint id prefixes (`ParsedCheckpointTinkerPath`): `weights/<name>`,
# `sampler_weights/<name>`
_KIND_TO_ID: Mapping[str, str] = {"state": "weights", "sampler": "sampler_weights"}
_OWNER = "local"


class LocalLookupError(CheckpointError, ValueError):
    """A training run or checkpoint the local backend does not know (or a non-checkpoint path)."""


def _timestamp(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, tz=dt.UTC)


def _check_page(limit: object, offset: object, where: str) -> None:
    """Refuses a `limit` or `offset` that is not an int >= 0, naming it."""
    for name, value in (("limit", limit), ("offset", offset)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{where}.{name}: expected an int >= 0, got {value!r}")


def _checkpoint_id(info: CheckpointInfo) -> str:
    """The SDK's id of a checkpoint: `weights/<name>` or `sampler_weights/<name>`."""
    return f"{_KIND_TO_ID[info.kind]}/{info.name}"


def _as_checkpoint(info: CheckpointInfo) -> types.Checkpoint:
    return types.Checkpoint(
        checkpoint_id=_checkpoint_id(info),
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
        record: TrainingRunRecord | None = self._runtime.training_run(training_run_id)
        checkpoints = self._checkpoints(training_run_id)
        if record is None and not checkpoints:
            raise LocalLookupError(
                f"unknown local training run {training_run_id!r} (not opened by this service, "
                f"no run.json and no checkpoints of it under {self._runtime.checkpoint_root})"
            )
        states = [info for info in checkpoints if info.kind == "state"]
        samplers = [info for info in checkpoints if info.kind == "sampler"]
        lora_rank: int | None
        if record is not None:
            base_model, is_lora, lora_rank = record.base_model, record.is_lora, record.lora_rank
            metadata, last_time = record.user_metadata, record.created_at
        else:  # an earlier rlpure's run: what its newest checkpoint says
            newest = checkpoints[-1]
            lora = newest.lora
            base_model, metadata = newest.base_model, newest.run_metadata
            is_lora, lora_rank = lora is not None, lora.rank if lora is not None else None
            last_time = newest.saved_at
        if checkpoints:
            last_time = max(last_time, checkpoints[-1].saved_at)
        return types.TrainingRun(
            training_run_id=training_run_id,
            base_model=base_model,
            model_owner=_OWNER,
            is_lora=is_lora,
            lora_rank=lora_rank,
            last_request_time=_timestamp(last_time),
            last_checkpoint=_as_checkpoint(states[-1]) if states else None,
            last_sampler_checkpoint=_as_checkpoint(samplers[-1]) if samplers else None,
            user_metadata=dict(metadata) or None,
        )

    def _run_ids_newest_first(self) -> list[str]:
        """The ids of every run under the checkpoint directory (with a `run.json` or
        checkpoints), newest first: by creation time (without `run.json`, the oldest
        checkpoint's time), then by id."""
        root = self._runtime.checkpoint_root
        if root is None or not root.is_dir():
            return []
        created: list[tuple[float, str]] = []
        for entry in os.scandir(root):
            if not entry.is_dir():
                continue
            record = self._runtime.training_run(entry.name)
            if record is not None:
                created.append((record.created_at, entry.name))
                continue
            checkpoints = self._checkpoints(entry.name)
            if checkpoints:
                created.append((checkpoints[0].saved_at, entry.name))
        return [run_id for _, run_id in sorted(created, reverse=True)]

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
            lora = info.lora
            run = types.TrainingRun(
                training_run_id=info.training_run_id,
                base_model=info.base_model,
                model_owner=_OWNER,
                is_lora=lora is not None,
                lora_rank=lora.rank if lora is not None else None,
                last_request_time=_timestamp(info.saved_at),
                user_metadata=dict(info.run_metadata) or None,
            )
        if run.user_metadata is None and info.run_metadata:
            run = run.model_copy(update={"user_metadata": dict(info.run_metadata)})
        return ReadyFuture(run)

    def get_weights_info_by_tinker_path(
        self, tinker_path: str
    ) -> tinker.APIFuture[types.WeightsInfoResponse]:
        """The base model of the checkpoint at `tinker_path` and, for LoRA adapters, their
        rank and matrices (full weights of a toy model: `is_lora=False`).

        Raises:
            LocalLookupError: `tinker_path` is not a readable local checkpoint.
        """
        info = self._info(tinker_path)
        lora = info.lora
        if lora is None:
            return ReadyFuture(types.WeightsInfoResponse(base_model=info.base_model, is_lora=False))
        return ReadyFuture(
            types.WeightsInfoResponse(
                base_model=info.base_model,
                is_lora=True,
                lora_rank=lora.rank,
                train_unembed=lora.train_unembed,
                train_mlp=lora.train_mlp,
                train_attn=lora.train_attn,
            )
        )

    def list_training_runs(
        self,
        limit: int = 20,
        offset: int = 0,
        access_scope: Literal["owned", "accessible"] = "owned",
        project_id: str | None = None,
    ) -> tinker.APIFuture[types.TrainingRunsResponse]:
        """The training runs under the checkpoint directory, newest first, `limit` of them
        from `offset` on (`cursor.total_count`: all of them).

        `access_scope` and `project_id` are accepted and ignored: every local run is the
        user's, and runs record no project.

        Raises:
            ValueError: `limit` or `offset` is not an int >= 0.
        """
        _check_page(limit, offset, "list_training_runs")
        run_ids = self._run_ids_newest_first()
        return ReadyFuture(
            types.TrainingRunsResponse(
                training_runs=[
                    self._training_run(run_id) for run_id in run_ids[offset : offset + limit]
                ],
                cursor=types.Cursor(offset=offset, limit=limit, total_count=len(run_ids)),
            )
        )

    def list_user_checkpoints(
        self, limit: int = 100, offset: int = 0
    ) -> tinker.APIFuture[types.CheckpointsListResponse]:
        """Every run's checkpoints, state and sampler, newest first, `limit` of them from
        `offset` on (`cursor.total_count`: all of them).

        Raises:
            ValueError: `limit` or `offset` is not an int >= 0.
        """
        _check_page(limit, offset, "list_user_checkpoints")
        found = [
            info for run_id in self._run_ids_newest_first() for info in self._checkpoints(run_id)
        ]
        found.sort(key=lambda info: (info.saved_at, info.path), reverse=True)
        return ReadyFuture(
            types.CheckpointsListResponse(
                checkpoints=[_as_checkpoint(info) for info in found[offset : offset + limit]],
                cursor=types.Cursor(offset=offset, limit=limit, total_count=len(found)),
            )
        )

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
        """Deletes checkpoint `checkpoint_id` (the SDK's `"weights/<name>"` or
        `"sampler_weights/<name>"`; an earlier rlpure's `"state/<name>"` or `"sampler/<name>"`
        too) of a run.

        Raises:
            LocalLookupError: no such checkpoint.
        """
        for info in self._checkpoints(training_run_id):
            if checkpoint_id in (_checkpoint_id(info), f"{info.kind}/{info.name}"):
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
