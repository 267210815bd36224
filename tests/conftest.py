"""Suite-wide checks.

- JAX's implicit rank promotion is an error in every test: this module sets
  `jax_numpy_rank_promotion = "raise"` when pytest imports it, before any test module runs, so
  `x_B_T_E * scale_E` must be written `x_B_T_E * scale_E[None, None, :]` (broadcasts are
  explicit, as STYLE asks; a silent `[B]` against `[B, 1]` mix-up fails instead of
  broadcasting).
- Tests on the real GSM8K files skip when `../shared/data/gsm8k` is absent (a contributor's
  checkout without it). In CI (`CI` set) the folder must be there: a missing folder fails the
  run instead of silently skipping what the issues require.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax
import pytest

jax.config.update("jax_numpy_rank_promotion", "raise")

GSM8K_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gsm8k"


def pytest_sessionstart(session: pytest.Session) -> None:
    if os.environ.get("CI") and not (GSM8K_DIR / "train.jsonl").exists():
        raise pytest.UsageError(
            f"CI run without the GSM8K data at {GSM8K_DIR}: the real-data tests would skip"
        )
