"""The local backend's persistent compilation cache (`shell.local._compile_cache`).

Each case runs in a fresh interpreter: JAX reads its cache directory once per process, so only
a new process shows what a service sets up and what a later run reads back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# A service, then one jitted program (cached whatever its compile time: the threshold is 0 here).
_SCRIPT = """
import json, sys
import jax, jax.numpy as jnp
from jax import monitoring
hits = []
monitoring.register_event_listener(
    lambda event, **kw: hits.append(event) if event.endswith("cache_hits") else None
)
from shell.local import LocalServiceClient
LocalServiceClient(seed=0)
value = float(jax.jit(lambda x: (jnp.sin(x) * 3.0).sum() + x @ x)(jnp.arange(4.0)))
print(json.dumps({"dir": jax.config.jax_compilation_cache_dir, "hits": len(hits), "value": value}))
"""


def _run(env: dict[str, str]) -> dict[str, object]:
    full = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "RLPURE_"))},
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        **env,
    }
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], env=full, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.slow
def test_a_later_process_reads_back_what_an_earlier_one_compiled(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = _run({"RLPURE_COMPILATION_CACHE": str(cache)})
    assert first["dir"] == str(cache) and first["hits"] == 0
    written = sorted(p.name for p in cache.iterdir() if not p.name.startswith("."))
    assert any(name.endswith("-cache") for name in written), written
    second = _run({"RLPURE_COMPILATION_CACHE": str(cache)})
    assert (
        isinstance(second["hits"], int)
        and second["hits"] >= 1
        and second["value"] == first["value"]
    )


@pytest.mark.slow
def test_off_and_a_directory_chosen_by_the_process_are_respected(tmp_path: Path) -> None:
    home = tmp_path / "xdg"
    off = _run({"RLPURE_COMPILATION_CACHE": "off", "XDG_CACHE_HOME": str(home)})
    assert off["dir"] is None and not home.exists()
    own = tmp_path / "own"
    chosen = _run({"JAX_COMPILATION_CACHE_DIR": str(own), "XDG_CACHE_HOME": str(home)})
    assert chosen["dir"] == str(own) and not home.exists()
    default = _run({"XDG_CACHE_HOME": str(home)})
    assert default["dir"] == str(home / "rlpure" / "jax")


def test_an_unwritable_cache_directory_leaves_the_cache_off(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code = (
        "import logging, jax; logging.basicConfig(level=logging.WARNING);"
        "from shell.local._compile_cache import enable_compilation_cache;"
        "print(enable_compilation_cache(), jax.config.jax_compilation_cache_dir)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "RLPURE_"))}
    env["RLPURE_COMPILATION_CACHE"] = str(blocker / "cache")
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["None", "None"]
    assert "compilation cache off: cannot create" in done.stderr
    assert "RLPURE_COMPILATION_CACHE" in done.stderr
