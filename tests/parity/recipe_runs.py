"""Runs a cookbook recipe's entry point, ported, as `python -m` runs it, in this process.

`run_ported_main("recipes/math_rl/train.py", ["model_name=rlpure/tiny", ...])` reads the
installed cookbook's file, applies the port rule (`tinker_cookbook` → `shell.cookbook` in its
imports, nothing else) and executes it as `__main__` with `sys.argv` set to the file and the
given `key=value` arguments: its `if __name__ == "__main__":` block runs as written
(`chz.entrypoint(CLIConfig)` parses the arguments, the recipe builds its `Config` and calls
the facade's `main`). As `runpy` does, the module is `sys.modules["__main__"]` while it runs
(chz resolves the recipe's annotations through it). Sibling recipes it imports come from
`serve_ported_recipes()`, ported the same way.

The recipes open `tinker.ServiceClient()` themselves; `offline_sdk_env(server)` is what points
them, offline, at an `rlpure serve` started by `tests.serve.server.running_server`.
"""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.parity.porting import ported_source, require_cookbook, serve_ported_recipes
from tests.serve.server import Server, sdk_env

OFFLINE_HUB = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
"""Hugging Face offline: a recipe that reaches the hub fails instead of downloading."""


def offline_sdk_env(server: Server) -> dict[str, str]:
    """The SDK's variables for `server` (base URL, a `tml-` key, no telemetry), hub offline."""
    return {**sdk_env(server), **OFFLINE_HUB}


def run_ported_main(
    relative_path: str, argv: Sequence[str], *, monkeypatch: pytest.MonkeyPatch
) -> types.ModuleType:
    """Runs the cookbook file `relative_path`, ported, as `__main__` with `argv`.

    Args:
        relative_path: the file inside the cookbook package (`recipes/math_rl/train.py`).
        argv: the command-line arguments after the program name (`key=value`, chz's syntax).
        monkeypatch: restores `sys.argv` and `sys.modules["__main__"]` after the test.

    Returns:
        The module the file ran in (its globals: `CLIConfig`, ...).

    Raises:
        AssertionError: an import of `tinker_cookbook` survived the port rule.
    """
    path = require_cookbook() / relative_path
    source = ported_source(path.read_text())
    if "import tinker_cookbook" in source or "from tinker_cookbook" in source:
        raise AssertionError(f"{relative_path}: an import of tinker_cookbook survived the port")
    module = types.ModuleType("__main__")
    module.__file__ = str(path)
    monkeypatch.setattr(sys, "argv", [str(path), *argv])
    monkeypatch.setitem(sys.modules, "__main__", module)
    with serve_ported_recipes():
        exec(compile(source, str(path), "exec"), module.__dict__)
    return module


def jsonl_rows(path: Path) -> list[dict[str, Any]]:
    """The JSON object on each line of `path`."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
