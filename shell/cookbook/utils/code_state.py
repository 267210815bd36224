"""`tinker_cookbook.utils.code_state`: the code a run ran, over `shell.source_state`.

Deliberate difference: the default module is `shell` (the code that runs here), where the
cookbook's is `tinker_cookbook`.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

from shell.source_state import source_state

__all__ = ["code_state"]


def code_state(modules: Sequence[str | ModuleType] = ("shell",)) -> str:
    """Each module's repository, commit and uncommitted diff, in `code.diff`'s format."""
    return source_state(modules)
