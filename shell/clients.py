"""The backends behind `--backend`: which service client a run talks to.

`make_service_client(config)` opens Tinker's `ServiceClient`, the local JAX backend
(`shell.local.LocalServiceClient`) or the scripted fake (`shell.fakes.FakeServiceClient`);
all three speak the SDK's client interface.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from shell.config import TrainConfig
from shell.errors import ConfigError

__all__ = ["make_service_client"]


def make_service_client(config: TrainConfig) -> Any:
    """The service client of `config.backend` (duck-typed like `tinker.ServiceClient`).

    - `tinker`: `tinker.ServiceClient()`; the SDK reads `TINKER_API_KEY` from the environment.
    - `local`: `LocalServiceClient(seed=config.seed)` with states under `<log_dir>/local_states`
      (so a restarted run finds them).
    - `fake`: `FakeServiceClient` with states in `<log_dir>/fake_states.json`.

    Raises:
        ConfigError: `tinker` without `TINKER_API_KEY` in the environment.
    """
    log_dir = Path(config.log_dir)
    if config.backend == "tinker":
        if not os.environ.get("TINKER_API_KEY"):
            raise ConfigError(
                "backend 'tinker' needs the TINKER_API_KEY environment variable "
                "(export TINKER_API_KEY=...; it is never written to logs or configs)"
            )
        import tinker

        return tinker.ServiceClient()
    if config.backend == "local":
        from shell.local import LocalServiceClient

        return LocalServiceClient(seed=config.seed, checkpoint_dir=log_dir / "local_states")
    from shell.fakes import FakeCheckpointStore, FakeServiceClient

    log_dir.mkdir(parents=True, exist_ok=True)
    return FakeServiceClient(
        store=FakeCheckpointStore(log_dir / "fake_states.json"), seed=config.seed
    )
