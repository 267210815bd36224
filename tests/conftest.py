"""Suite-wide checks.

Tests on the real GSM8K files skip when `../shared/data/gsm8k` is absent (a contributor's
checkout without it). In CI (`CI` set) the folder must be there: a missing folder fails the run
instead of silently skipping what the issues require.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

GSM8K_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gsm8k"


def pytest_sessionstart(session: pytest.Session) -> None:
    if os.environ.get("CI") and not (GSM8K_DIR / "train.jsonl").exists():
        raise pytest.UsageError(
            f"CI run without the GSM8K data at {GSM8K_DIR}: the real-data tests would skip"
        )
