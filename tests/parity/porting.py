"""The port rule, as tests apply it: a cookbook file with `tinker_cookbook` → `shell.cookbook` in its imports.

`ported_module("recipes/math_rl/arithmetic_env.py")` reads that file from the installed
tinker-cookbook 0.6.1, rewrites the package name in its `import` / `from` statements and nothing
else, and imports the result as a fresh module (`ported.<path>`), so a test exercises the
cookbook's own env code against the `shell` facade. Tests that use it need the cookbook
installed (`make parity`); `require_cookbook()` skips them with the reason otherwise.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import types
from pathlib import Path

import pytest

_IMPORT_PREFIX = re.compile(r"^(\s*)(from|import)(\s+)tinker_cookbook\b", re.MULTILINE)


def require_cookbook() -> Path:
    """The installed `tinker_cookbook` package directory; skips the test when it is absent."""
    spec = importlib.util.find_spec("tinker_cookbook")
    if spec is None or spec.origin is None:
        pytest.skip(
            "needs tinker-cookbook 0.6.1 (make parity builds .cbvenv with it)",
            allow_module_level=True,  # also usable at a test module's top level
        )
    return Path(spec.origin).parent


def ported_source(source: str) -> str:
    """`source` with the package name `tinker_cookbook` replaced by `shell.cookbook` in its imports."""
    return _IMPORT_PREFIX.sub(r"\1\2\3shell.cookbook", source)


def ported_module(relative_path: str) -> types.ModuleType:
    """Imports the cookbook file at `relative_path` (inside the package) after the port rule."""
    source = (require_cookbook() / relative_path).read_text()
    ported = ported_source(source)
    if re.search(r"^\s*(from|import)\s+tinker_cookbook\b", ported, re.MULTILINE):
        raise AssertionError(f"{relative_path}: an import of tinker_cookbook survived the port")
    name = "ported." + relative_path.removesuffix(".py").replace("/", ".")
    module = types.ModuleType(name)
    module.__file__ = f"<ported {relative_path}>"
    sys.modules[name] = module  # dataclasses and chz look their module up while the body runs
    try:
        exec(compile(ported, module.__file__, "exec"), module.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    return module
