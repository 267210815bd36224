"""Restoring a run's training client: from a checkpoint, from given weights, or fresh.

Conventions (the client contract): `open_training_client(config, service_client, resume)` opens
the run's training client — restored from the checkpoint `resume` with its optimizer state
(`create_training_client_from_state_with_optimizer`, the SDK 0.38 way), or for a fresh run the
weights at `config.load_checkpoint_path` with a fresh optimizer, or a new LoRA client — and
returns it as an `OpenedTrainingClient` naming that checkpoint. `train(training_client=...)`
takes such a client only when it was opened from `log_dir`'s last checkpoint (or from none, for
a fresh run), so a run never continues a checkpoint's step and PRNG key with other weights; a
bare client is taken for a fresh run only (its weights are the run's start, whatever they are),
see `callers_training_client`.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from shell.clients import ServiceClient, TrainingClient
from shell.config import TrainConfig
from shell.errors import ConfigError
from shell.training._checkpoints import CheckpointRecord

__all__ = [
    "OpenedTrainingClient",
    "callers_training_client",
    "open_training_client",
    "restore_training_client",
]


async def restore_training_client(
    service_client: ServiceClient, record: CheckpointRecord
) -> TrainingClient:
    """A training client with the weights and optimizer state of `record`."""
    return await service_client.create_training_client_from_state_with_optimizer(record.state_path)


class OpenedTrainingClient(msgspec.Struct, frozen=True, kw_only=True):
    """A training client and the checkpoint it was restored from (what `train` accepts).

    Attributes:
        client: the training client (a `shell.clients.TrainingClient`).
        resumed_from: the checkpoint whose weights and optimizer state it holds; None for a
            fresh run's client (a new LoRA client, or `config.load_checkpoint_path`'s weights).
    """

    client: TrainingClient
    resumed_from: CheckpointRecord | None


async def open_training_client(
    config: TrainConfig, service_client: ServiceClient, resume: CheckpointRecord | None
) -> OpenedTrainingClient:
    """The run's training client: restored from `resume` when given (weights and optimizer
    state); else, with `config.load_checkpoint_path`, a client with those weights and a fresh
    optimizer (`create_training_client_from_state`, as the cookbook's `main`); else a new LoRA
    client on `config.base_model`.

    Pass `resume=last_checkpoint(config.log_dir)` to open the client `train` would open itself;
    the result can then be handed to `train(training_client=...)`, which checks that `resume`
    is still the log directory's last checkpoint.
    """
    client: TrainingClient
    if resume is not None:
        client = await restore_training_client(service_client, resume)
    elif config.load_checkpoint_path is not None:
        client = await service_client.create_training_client_from_state(config.load_checkpoint_path)
    else:
        client = await service_client.create_lora_training_client(
            base_model=config.base_model, rank=config.lora_rank
        )
    return OpenedTrainingClient(client=client, resumed_from=resume)


def _describe(checkpoint: CheckpointRecord | None) -> str:
    if checkpoint is None:
        return "no checkpoint (a fresh run)"
    return f"the step-{checkpoint.step} checkpoint {checkpoint.state_path}"


def callers_training_client(
    training_client: OpenedTrainingClient | TrainingClient,
    *,
    resume: CheckpointRecord | None,
    log_dir: Path,
) -> TrainingClient:
    """The client inside the caller's `training_client`, once it is known to fit `resume`.

    Args:
        training_client: what the caller passed as `train(training_client=...)`: an
            `OpenedTrainingClient` or a bare client.
        resume: `log_dir`'s last checkpoint (None for a fresh run).
        log_dir: the run's log directory (named in the error).

    Raises:
        ConfigError: an `OpenedTrainingClient` restored from another checkpoint than `resume`
            (or from one when `resume` is None), or a bare client while resuming.
    """
    if isinstance(training_client, OpenedTrainingClient):
        opened = training_client.resumed_from
        if (None if opened is None else opened.state_path) != (
            None if resume is None else resume.state_path
        ):
            raise ConfigError(
                f"{log_dir}: the training_client passed to train() was opened from "
                f"{_describe(opened)}, but the run starts from {_describe(resume)}. Open it "
                "with open_training_client(config, service_client, last_checkpoint(log_dir))."
            )
        return training_client.client
    if resume is not None:
        raise ConfigError(
            f"{log_dir}: resuming from {_describe(resume)}, but the training_client passed to "
            "train() is a bare client whose state is unknown. Pass the OpenedTrainingClient "
            "of open_training_client(config, service_client, last_checkpoint(log_dir)), or "
            "no client."
        )
    return training_client
