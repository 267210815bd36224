"""Suite-wide checks.

- JAX's implicit rank promotion is an error in every test: this module sets
  `jax_numpy_rank_promotion = "raise"` when pytest imports it, before any test module runs, so
  `x_B_T_E * scale_E` must be written `x_B_T_E * scale_E[None, None, :]` (broadcasts are
  explicit, as STYLE asks; a silent `[B]` against `[B, 1]` mix-up fails instead of
  broadcasting).
- Tests on the real GSM8K files skip when `../shared/data/gsm8k` is absent (a contributor's
  checkout without it). In CI (`CI` set) the folder must be there: a missing folder fails the
  run instead of silently skipping what the issues require.
- The suite never writes into the user's data directory: `pytest_configure` points
  `RLPURE_HOME` at a fresh temporary directory for the session (before any test makes a
  `LocalServiceClient()`, whose default checkpoint directory is `$RLPURE_HOME/checkpoints`);
  subprocesses the tests start inherit it, and it is removed when the session ends.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import jax
import pytest

jax.config.update("jax_numpy_rank_promotion", "raise")

GSM8K_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gsm8k"


_SAVED_HOME_KEY = pytest.StashKey[tuple[str | None, str]]()


def pytest_configure(config: pytest.Config) -> None:
    saved = os.environ.get("RLPURE_HOME")
    home = tempfile.mkdtemp(prefix="rlpure-test-home-")
    os.environ["RLPURE_HOME"] = home
    config.stash[_SAVED_HOME_KEY] = (saved, home)


def pytest_unconfigure(config: pytest.Config) -> None:
    saved, home = config.stash.get(_SAVED_HOME_KEY, (None, ""))
    if not home:
        return
    if saved is None:
        os.environ.pop("RLPURE_HOME", None)
    else:
        os.environ["RLPURE_HOME"] = saved
    shutil.rmtree(home, ignore_errors=True)


def pytest_sessionstart(session: pytest.Session) -> None:
    if os.environ.get("CI") and not (GSM8K_DIR / "train.jsonl").exists():
        raise pytest.UsageError(
            f"CI run without the GSM8K data at {GSM8K_DIR}: the real-data tests would skip"
        )
