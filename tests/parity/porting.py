"""The port rule, as tests apply it: a cookbook file with `tinker_cookbook` → `shell.cookbook` in its imports.

`ported_module("recipes/math_rl/arithmetic_env.py")` reads that file from the installed
tinker-cookbook 0.6.1, rewrites the package name in its `import` / `from` statements and nothing
else, and imports the result as a fresh module (`ported.<path>`), so a test exercises the
cookbook's own env code against the `shell` facade. A recipe importing a sibling recipe
reads, after the rule, `shell.cookbook.recipes.<...>`, which the facade does not have: inside
`serve_ported_recipes()` the finder `PortedRecipes` serves those names from the installed
cookbook's `recipes/`, each file ported on the fly. `port_coverage` imports every file of
`recipes/` and `rl/` that way, each in its own forked child, and says why each that fails
fails (`test_port_coverage.py` runs it as `python -m tests.parity.porting OUT.json`). Tests
that use this module need the cookbook installed (`make parity`); `require_cookbook()` skips
them with the reason otherwise.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import re
import select
import signal
import sys
import time
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

import msgspec
import pytest

_IMPORT_PREFIX = re.compile(r"^(\s*)(from|import)(\s+)tinker_cookbook\b", re.MULTILINE)
_SURVIVING_IMPORT = re.compile(r"^\s*(from|import)\s+tinker_cookbook\b", re.MULTILINE)
FACADE = "shell.cookbook"
"""The facade package the port rule points imports at."""
RECIPES = FACADE + ".recipes"
"""What the port rule makes of `tinker_cookbook.recipes`; `PortedRecipes` serves it."""


@functools.cache
def _cookbook_dir() -> Path | None:
    spec = importlib.util.find_spec("tinker_cookbook")
    return None if spec is None or spec.origin is None else Path(spec.origin).parent


def require_cookbook() -> Path:
    """The installed `tinker_cookbook` package directory; skips the test when it is absent."""
    cookbook = _cookbook_dir()  # looked up once: `port_coverage` then refuses the package
    if cookbook is None:
        pytest.skip(
            "needs tinker-cookbook 0.6.1 (make parity builds .cbvenv with it)",
            allow_module_level=True,  # also usable at a test module's top level
        )
    return cookbook


def ported_source(source: str) -> str:
    """`source` with the package name `tinker_cookbook` replaced by `shell.cookbook` in its imports."""
    return _IMPORT_PREFIX.sub(r"\1\2\3shell.cookbook", source)


def _checked_port(source: str, where: str) -> str:
    ported = ported_source(source)
    if _SURVIVING_IMPORT.search(ported):
        raise AssertionError(f"{where}: an import of tinker_cookbook survived the port")
    return ported


def ported_module(relative_path: str) -> types.ModuleType:
    """Imports the cookbook file at `relative_path` (inside the package) after the port rule."""
    ported = _checked_port((require_cookbook() / relative_path).read_text(), relative_path)
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


# --- sibling recipes, served ported ---------------------------------------------------------------


def _facade_dir() -> Path:
    spec = importlib.util.find_spec(FACADE)
    assert spec is not None and spec.submodule_search_locations is not None, FACADE
    return Path(next(iter(spec.submodule_search_locations)))


def _defines(root: Path, module: str, name: str) -> bool:
    """Whether the cookbook module `module` (dotted, under `root`) binds `name` at top level."""
    base = root / Path(*module.split("."))
    path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
    if not module or not path.is_file():
        return False
    bound: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.Assign):
            bound.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            bound.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
    return name in bound


def _has_module(root: Path, relative: Path) -> bool:
    """Whether the package directory `root` holds the module or package `relative`."""
    return (root / relative).is_dir() or (root / relative).with_suffix(".py").is_file()


class PortedRecipes(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves each `shell.cookbook.recipes[.<...>]` the facade lacks from the cookbook, ported.

    A name `shell.cookbook.recipes.a.b` maps to the installed cookbook's `recipes/a/b`: a folder
    with `__init__.py` is a package running that file, a `b.py` a module, a folder without
    `__init__.py` an empty package (as Python treats a namespace package). The file is read,
    put through the port rule and run with `__file__` at the cookbook's file (recipes read
    their assets next to it). A name the facade has on disk is left to the normal import.

    Args:
        cookbook: the installed `tinker_cookbook` package directory.
        facade: the `shell/cookbook` package directory.
    """

    def __init__(self, *, cookbook: Path, facade: Path) -> None:
        self.cookbook = cookbook
        self.facade = facade

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != RECIPES and not fullname.startswith(RECIPES + "."):
            return None
        relative = Path(*fullname.split(".")[2:])
        if _has_module(self.facade, relative):
            return None
        where = self.cookbook / relative
        if (where / "__init__.py").is_file() or (
            where.is_dir() and not where.with_suffix(".py").is_file()
        ):
            spec = importlib.machinery.ModuleSpec(
                fullname, self, origin=str(where / "__init__.py"), is_package=True
            )
            spec.submodule_search_locations = [str(where)]
            return spec
        if where.with_suffix(".py").is_file():
            return importlib.machinery.ModuleSpec(fullname, self, origin=str(where) + ".py")
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module

    def exec_module(self, module: types.ModuleType) -> None:
        assert module.__spec__ is not None and module.__spec__.origin is not None
        origin = Path(module.__spec__.origin)
        module.__file__ = str(origin)
        source = origin.read_text() if origin.is_file() else ""  # a namespace folder
        exec(compile(_checked_port(source, str(origin)), str(origin), "exec"), module.__dict__)


@contextlib.contextmanager
def serve_ported_recipes() -> Iterator[PortedRecipes]:
    """Installs a `PortedRecipes` first on `sys.meta_path`; on exit removes it and its modules."""
    finder = PortedRecipes(cookbook=require_cookbook(), facade=_facade_dir())
    sys.meta_path.insert(0, finder)
    try:
        yield finder
    finally:
        sys.meta_path.remove(finder)
        served = [n for n, m in sys.modules.items() if getattr(m, "__loader__", None) is finder]
        for name in sorted(served, reverse=True):  # children before their package
            module = sys.modules.pop(name)
            parent, _, leaf = name.rpartition(".")
            if getattr(sys.modules.get(parent), leaf, None) is module:
                delattr(sys.modules[parent], leaf)


# --- coverage: every file of recipes/ and rl/, ported and imported -------------------------------

Category = Literal["imports", "third-party", "cookbook", "other", "entry point"]
_OURS = frozenset({"shell", "rlpure", "tests", "ported"})
_CANNOT_IMPORT_NAME = re.compile(r"cannot import name '(\w+)' from '([\w.]+)'")
_LOCATION = re.compile(r" \((/[^)]*|unknown location)\)$")
_OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


class ImportOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What importing one ported cookbook file gave.

    Attributes:
        path: the file inside the cookbook package (`recipes/math_rl/train.py`).
        category: `imports`; `third-party`, a package that is not installed (`detail` names the
            module); `cookbook`, a cookbook module the facade lacks (`detail` names it inside
            the package: `supervised.types`); `other` (`detail` is the exception's first line);
            `entry point`, a `__main__.py`, not imported (`detail` says why).
        detail: as `category` says; empty when the file imports.
    """

    path: str
    category: Category
    detail: str = ""


def cookbook_files(cookbook: Path, *, folders: Sequence[str] = ("recipes", "rl")) -> list[str]:
    """Every `.py` file under `folders` of the cookbook package, relative to it, sorted."""
    return sorted(
        p.relative_to(cookbook).as_posix() for f in folders for p in (cookbook / f).rglob("*.py")
    )


def import_ported(relative_path: str) -> types.ModuleType:
    """Imports a cookbook file by the port rule: a `recipes/` file by its facade name.

    A `recipes/` file is imported as `shell.cookbook.recipes.<...>` (so its package and its
    relative imports work as in the cookbook; needs `serve_ported_recipes()`), any other file by
    `ported_module`.
    """
    if relative_path.startswith("recipes/"):
        dotted = relative_path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        return importlib.import_module(f"{FACADE}.{dotted}")
    return ported_module(relative_path)


def _missing_module(error: BaseException) -> str | None:
    """The module a failed import could not find, following an `ImportError`'s causes."""
    seen: BaseException | None = error
    while isinstance(seen, ImportError):
        if isinstance(seen, ModuleNotFoundError) and seen.name:
            return seen.name
        seen = seen.__cause__ or seen.__context__
    return None


def classify_import_error(error: BaseException, *, cookbook: Path) -> tuple[Category, str]:
    """Why importing a ported file raised `error`: a category and the module or first line."""
    missing = _missing_module(error)
    if missing is None and isinstance(error, ImportError):
        match = _CANNOT_IMPORT_NAME.search(str(error))  # `from pkg import mod`, mod absent
        if match and match[2].split(".")[:2] == FACADE.split("."):
            missing = f"{match[2]}.{match[1]}"  # a cookbook module only if the cookbook has it
            module = match[2].removeprefix(FACADE).removeprefix(".")
            if not _has_module(cookbook, Path(*missing.split(".")[2:])) and _defines(
                cookbook, module, match[1]
            ):  # a name of a cookbook module the facade has without it
                return "cookbook", f"{module}.{match[1]}"
    if missing is not None and missing.split(".")[:2] == FACADE.split("."):
        module = missing.removeprefix(FACADE).removeprefix(".")
        if module and _has_module(cookbook, Path(*module.split("."))):
            return "cookbook", module
    elif missing is not None and missing.split(".")[0] not in _OURS:
        return "third-party", missing
    lines = str(error).strip().splitlines()
    return "other", f"{type(error).__name__}: {_LOCATION.sub('', lines[0] if lines else '')}"


class _NoRealCookbook(importlib.abc.MetaPathFinder):
    """Refuses `tinker_cookbook`: a ported file that reaches the real cookbook is no port."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: types.ModuleType | None = None,
    ) -> None:
        if fullname.partition(".")[0] == "tinker_cookbook":
            raise ImportError(f"a ported file imported the real cookbook: {fullname}")
        return None


def _module_level_imports(source: str) -> set[str]:
    """The absolute module names `source` imports at module level (in `if`/`try` blocks too)."""
    names: set[str] = set()
    stack: list[ast.stmt] = list(ast.parse(source).body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
        elif isinstance(node, ast.If):
            stack.extend(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            stack.extend(node.body + node.orelse + node.finalbody)
            stack.extend(s for handler in node.handlers for s in handler.body)
    return names


def _preload(cookbook: Path, paths: Sequence[str]) -> None:
    """Imports, once, what the files import besides recipes, so each child need not.

    Third-party packages and facade modules behave the same whichever process imported them
    first; one that fails here fails again, the same way, in the child that needs it.
    """
    names: set[str] = set()
    for path in paths:
        names |= _module_level_imports(ported_source((cookbook / path).read_text()))
    for name in sorted(names):
        if name == "__future__" or name == RECIPES or name.startswith(RECIPES + "."):
            continue
        with contextlib.suppress(Exception, SystemExit):
            importlib.import_module(name)


def _child_outcome(path: str, *, cookbook: Path) -> ImportOutcome:
    """Runs in the forked child: imports `path` with stdin, stdout and stderr on /dev/null."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    sys.argv = [str(cookbook / path)]
    try:
        import_ported(path)
    except BaseException as error:  # SystemExit too: a file that exits at import fails
        category, detail = classify_import_error(error, cookbook=cookbook)
        return ImportOutcome(path=path, category=category, detail=detail)
    return ImportOutcome(path=path, category="imports")


def _read_before(fd: int, deadline: float) -> bytes | None:
    """All `fd` gives until end of file, or None when `deadline` (monotonic) passes first."""
    chunks: list[bytes] = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _outcome_in_fork(path: str, *, cookbook: Path, timeout_s: float) -> ImportOutcome:
    """Imports `path` in a forked child of this process, so nothing it does outlives it."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then exit without the parent's cleanups
        os.close(read_end)
        try:
            with os.fdopen(write_end, "wb") as pipe:
                pipe.write(msgspec.json.encode(_child_outcome(path, cookbook=cookbook)))
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        data = _read_before(read_end, time.monotonic() + timeout_s)
    finally:
        os.close(read_end)
    if data is None:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if data is None:
        return ImportOutcome(
            path=path, category="other", detail=f"TimeoutError: no import in {timeout_s:g} s"
        )
    if not data:
        return ImportOutcome(
            path=path, category="other", detail=f"the import process died (wait status {status})"
        )
    return msgspec.json.decode(data, type=ImportOutcome)


def port_coverage(paths: Sequence[str], *, timeout_s: float = 60.0) -> list[ImportOutcome]:
    """Imports each cookbook file of `paths` by the port rule, each in its own forked child.

    Meant for a fresh process (`python -m tests.parity.porting`): it sets the Hugging Face
    offline variables, refuses imports of the real `tinker_cookbook`, serves sibling recipes
    (`serve_ported_recipes`) and imports the files' other module-level imports once before forking.
    A `__main__.py` is an entry point (it may parse `sys.argv` at import) and is not imported.

    Args:
        paths: files inside the cookbook package (`rl/rollouts.py`).
        timeout_s: how long one file may take to import before it counts as failed.
    """
    cookbook = require_cookbook()
    os.environ.update(_OFFLINE)
    importable = [p for p in paths if not p.endswith("__main__.py")]
    outcomes: dict[str, ImportOutcome] = {
        p: ImportOutcome(path=p, category="entry point", detail="__main__.py: run, not imported")
        for p in paths
        if p not in importable
    }
    with serve_ported_recipes():
        blocker = _NoRealCookbook()
        sys.meta_path.insert(0, blocker)
        try:
            _preload(cookbook, importable)
            for path in importable:
                outcomes[path] = _outcome_in_fork(path, cookbook=cookbook, timeout_s=timeout_s)
        finally:
            sys.meta_path.remove(blocker)
    return [outcomes[p] for p in paths]


def _main(argv: Sequence[str]) -> int:
    """`python -m tests.parity.porting OUT.json [PATH...]`: `port_coverage` of the paths (every
    file of `recipes/` and `rl/` by default) written to OUT.json."""
    if not argv:
        print(_main.__doc__, file=sys.stderr)
        return 2
    paths = list(argv[1:]) or cookbook_files(require_cookbook())
    Path(argv[0]).write_bytes(msgspec.json.encode(port_coverage(paths)))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
