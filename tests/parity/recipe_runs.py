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
them, offline, at an `rlpure serve` started by `tests.serve.server.running_server`. A recipe
that loads a hub dataset by name (`load_dataset("openai/gsm8k", name="main", split=...)`) reads
a local folder of that name instead when run from the folder above it, as a user without the
hub would do it: `write_local_dataset` writes one (JSON-lines files and a README whose
`configs` name them).
"""

from __future__ import annotations

import gc
import json
import shutil
import sys
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from tinker.lib.internal_client_holder import InternalClientHolder

from tests.parity.porting import _checked_port, require_cookbook, serve_ported_recipes
from tests.serve.server import Server, sdk_env

OFFLINE_HUB = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
"""Hugging Face offline: a recipe that reaches the hub fails instead of downloading."""


def offline_sdk_env(server: Server) -> dict[str, str]:
    """The SDK's variables for `server` (base URL, a `tml-` key, no telemetry), hub offline."""
    return {**sdk_env(server), **OFFLINE_HUB}


def point_sdk_at(server: Server, patch: pytest.MonkeyPatch) -> None:
    """Sets `offline_sdk_env(server)` in this process (undone with `patch`): what a user sets
    to run Tinker code against `server`."""
    for name, value in offline_sdk_env(server).items():
        patch.setenv(name, value)


def final_checkpoint(log_path: Path) -> dict[str, Any]:
    """The one `final` row of a run's `checkpoints.jsonl`, asserted to name a `tinker://` state."""
    (final,) = [row for row in jsonl_rows(log_path / "checkpoints.jsonl") if row["name"] == "final"]
    assert final["state_path"].startswith("tinker://"), final
    return final


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
    source = _checked_port(path.read_text(), relative_path)  # the rule, and no import left
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


def write_local_dataset(
    root: Path, repo: str, configs: Mapping[str, Mapping[str, Path | Sequence[Mapping[str, Any]]]]
) -> Path:
    """A local folder `root / repo` that `datasets.load_dataset(repo, name=..., split=...)` reads
    when the working directory is `root` (the hub offline): for each config name, each split's
    rows, as a JSON-lines file to copy or as rows to write, listed in the README's `configs`.

    Returns:
        The folder.
    """
    folder = root / repo
    lines = ["---", "configs:"]
    for name, splits in configs.items():
        lines += [f"- config_name: {name}", "  data_files:"]
        (folder / name).mkdir(parents=True, exist_ok=True)
        for split, rows in splits.items():
            target = folder / name / f"{split}.jsonl"
            if isinstance(rows, Path):
                shutil.copyfile(rows, target)
            else:
                target.write_text("".join(json.dumps(dict(row)) + "\n" for row in rows))
            lines += [f"  - split: {split}", f"    path: {name}/{split}.jsonl"]
    (folder / "README.md").write_text("\n".join([*lines, "---", ""]))
    return folder


def close_sdk_sessions() -> None:
    """Closes every SDK client holder still open in this process. The cookbook's trainers open
    a `tinker.ServiceClient` they never close; its session heartbeat outlives the test's
    server and, two minutes on, logs failures (at the worker's exit, to a closed stream)."""
    for holder in [o for o in gc.get_objects() if type(o) is InternalClientHolder]:
        holder.close()
