"""The cookbook's `tinker_cookbook.display`: datums and trajectories as terminal text.

A thin facade over `shell.terminal` (`to_ints` is `chunk_tokens`); colours follow termcolor's
rule without needing termcolor.
"""

from __future__ import annotations

from shell.terminal import (
    chunk_tokens as to_ints,
)
from shell.terminal import (
    colorize_example,
    format_colorized,
    format_trajectory,
)

__all__ = ["colorize_example", "format_colorized", "format_trajectory", "to_ints"]
