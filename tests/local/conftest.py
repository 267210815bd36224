"""Fixtures shared by the local backend's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlpure import model as model_lib
from shell.local._checkpoints import write_checkpoint
from tests.local.micro import MICRO, MICRO_NAME, micro_params


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A valid `"state"` checkpoint of the micro model (copied, never modified, by tests)."""
    params = micro_params()
    directory = tmp_path_factory.mktemp("pristine") / "ckpt"
    write_checkpoint(
        directory,
        base_model=MICRO_NAME,
        config=MICRO,
        params=params,
        opt_state=model_lib.init_optimizer_state(params),
        optim_steps=3,
        kind="state",
        user_metadata={"note": "pristine"},
    )
    return directory
