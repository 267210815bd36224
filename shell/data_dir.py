"""Where rlpure keeps what outlives a process: the user's data directory.

Conventions:
- The data directory is `$RLPURE_HOME` when set and non-empty (made absolute against the
  current directory), else `$XDG_DATA_HOME/rlpure` when `XDG_DATA_HOME` is set and absolute,
  else `~/.local/share/rlpure` (the XDG Base Directory spec: a relative `XDG_DATA_HOME` is
  invalid and ignored).
- Checkpoints live in its `checkpoints/` folder, `<checkpoint dir>/<training run id>/...`:
  the default of an in-process `shell.local.LocalServiceClient()` and, under
  `rlpure serve --state-dir` (default: the data directory), of the server, so in-process and
  served runs share one store.
- Pure path computation: nothing here creates, reads or checks a folder; the writer creates
  the folders it writes into.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["default_checkpoint_dir", "rlpure_data_dir"]


def rlpure_data_dir() -> Path:
    """The rlpure data directory, read from the environment now (see the module docstring).

    Examples:
        >>> rlpure_data_dir().is_absolute()
        True
        >>> default_checkpoint_dir() == rlpure_data_dir() / "checkpoints"
        True
    """
    home = os.environ.get("RLPURE_HOME")
    if home:
        return Path(os.path.abspath(os.path.expanduser(home)))
    xdg = os.environ.get("XDG_DATA_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "rlpure"
    return Path.home() / ".local" / "share" / "rlpure"


def default_checkpoint_dir() -> Path:
    """The default checkpoint directory: `rlpure_data_dir() / "checkpoints"`."""
    return rlpure_data_dir() / "checkpoints"
