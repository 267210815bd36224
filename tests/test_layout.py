"""The layout the style guide asks for, checked from the source.

- No import cycle among the project's modules, counting imports inside functions and under
  `TYPE_CHECKING` (the graph is built from the AST; an import names a module edge, or its
  package when the name imported is not a submodule, plus the parent packages whose
  `__init__.py` runs first).
- No three sibling modules share a `prefix_` (they would be a subpackage).
- Every package facade's `__all__` lists exactly the public names it binds, each one documented;
  `rlpure.__all__` is the RL core (at most 60 names, no model, tokenizer or task names).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import itertools
import pkgutil
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

import rlpure
import shell

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rlpure", "shell")


def _modules() -> dict[str, Path]:
    """Every module of the project: dotted name → source file."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The project modules `name` imports anywhere in its source (functions and
    `TYPE_CHECKING` blocks included)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.add(sub if sub in MODULES else base)
    # Importing `a.b._c` first runs `a/b/__init__.py`: an edge to each parent package too, except
    # the importer's own ancestors and the top-level packages (whose facades import everything).
    ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    for target in list(targets):
        parts = target.split(".")
        for i in range(2, len(parts)):
            parent = ".".join(parts[:i])
            if parent not in ancestors and parent != name:
                targets.add(parent)
    return {t for t in targets if t in MODULES and t != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles_counting_type_checking_and_local_imports() -> None:
    graph = {name: _imports(name, path) for name, path in MODULES.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# The package that mirrors tinker-cookbook's module names, so cookbook code ports by an import-prefix
# rewrite (STYLE.md): its names are the cookbook's (`rl/rollout_strategy.py`, ...), not ours.
COOKBOOK_MIRROR = "shell.cookbook"

# tinker-cookbook 0.6.1's top-level modules and packages (`ls tinker_cookbook/`).
COOKBOOK_TOP_LEVEL = frozenset(
    {
        "audio_processing_utils", "capture", "chat_app", "checkpoint_utils", "cli_utils",
        "completers", "display", "distillation", "eval", "example_data", "exceptions",
        "hyperparam_utils", "image_processing_utils", "inference", "model_info", "preference",
        "recipes", "renderers", "rl", "sandbox", "scripts", "stores", "supervised",
        "third_party", "tokenizer_utils", "tool_use", "utils", "weights", "xmux",
    }
)  # fmt: skip


def _in_mirror(name: str) -> bool:
    return name == COOKBOOK_MIRROR or name.startswith(COOKBOOK_MIRROR + ".")


def test_shell_top_level_names_no_cookbook_module() -> None:
    top = {path.stem if path.suffix == ".py" else path.name for path in (ROOT / "shell").iterdir()}
    assert sorted(top & COOKBOOK_TOP_LEVEL) == []


def test_nothing_outside_the_cookbook_mirror_imports_it() -> None:
    leaks = {
        name: sorted(t for t in _imports(name, path) if _in_mirror(t))
        for name, path in MODULES.items()
        if not _in_mirror(name)
    }
    assert {name: found for name, found in leaks.items() if found} == {}


# The two product features built on the scripted stand-ins: `--backend fake` (the backend
# factory) and the `toy` recipe (scripted envs, so it runs on any backend).
SCRIPTED_BY_DESIGN = frozenset({"shell.clients", "shell.jobs.toy"})


def test_production_code_imports_no_test_double() -> None:
    leaks = {
        name: sorted(t for t in _imports(name, path) if t.startswith("shell.fakes"))
        for name, path in MODULES.items()
        if not name.startswith("shell.fakes") and name not in SCRIPTED_BY_DESIGN
    }
    assert {name: found for name, found in leaks.items() if found} == {}


def test_no_three_sibling_modules_share_a_prefix() -> None:
    siblings: dict[Path, Counter[str]] = {}
    for path in MODULES.values():
        if path.parent.relative_to(ROOT).as_posix().startswith("shell/cookbook"):
            continue
        stem = path.stem.lstrip("_")
        if path.name != "__init__.py" and "_" in stem:
            siblings.setdefault(path.parent, Counter())[stem.split("_")[0]] += 1
        if path.name == "__init__.py" and path.parent.parent != ROOT:
            dirname = path.parent.name
            if "_" in dirname:
                siblings.setdefault(path.parent.parent, Counter())[dirname.split("_")[0]] += 1
    crowded = {
        f"{folder.relative_to(ROOT)}/{prefix}_*": count
        for folder, counts in siblings.items()
        for prefix, count in counts.items()
        if count >= 3
    }
    assert crowded == {}


FACADES = sorted(
    name
    for name, path in MODULES.items()
    if path.name == "__init__.py" and ast.get_docstring(ast.parse(path.read_text())) is not None
)


def _bound_public_names(module: ModuleType, path: Path) -> set[str]:
    """Public names the facade binds from its own package (imports from its parts, definitions,
    assignments); names it imports from elsewhere (`Path`, another package's API) are its own
    business."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        own = module.__name__ if not _in_mirror(module.__name__) else ""  # a mirror re-exports
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(own):
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    submodules = {m.name for m in pkgutil.iter_modules(module.__path__)}
    public = {n for n in names if not n.startswith("_") or n == "__version__"}
    return {n for n in public if n not in submodules}


def _has_docstring(module: ModuleType, name: str) -> bool:
    """Functions and classes by their own `__doc__`; other values by the string literal that
    follows their assignment in the module that defines them."""
    value = getattr(module, name)
    if inspect.isfunction(value) or inspect.isclass(value) or inspect.ismodule(value):
        return bool(value.__doc__ and value.__doc__.strip())
    doc = getattr(value, "__doc__", None)
    if callable(value) and doc and doc != type(value).__doc__:  # a jitted function keeps its doc
        return bool(doc.strip())
    if getattr(value, "__module__", None) == "typing" or hasattr(value, "__origin__"):
        homes = [m for m in MODULES if name in vars(importlib.import_module(m))]
    else:
        homes = [m for m in MODULES if vars(importlib.import_module(m)).get(name) is value]
    for home in homes:
        body = ast.parse(MODULES[home].read_text(encoding="utf-8")).body
        for node, nxt in itertools.pairwise(body):
            targets = (
                [t.id for t in node.targets if isinstance(t, ast.Name)]
                if isinstance(node, ast.Assign)
                else [node.target.id]
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                else []
            )
            if (
                name in targets
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
            ):
                return isinstance(nxt.value.value, str)
    return False


@pytest.mark.parametrize("name", FACADES)
def test_each_facade_exports_what_it_binds_and_documents_it(name: str) -> None:
    module = importlib.import_module(name)
    exported = set(getattr(module, "__all__", ()))
    assert exported == _bound_public_names(module, MODULES[name])
    assert all(hasattr(module, n) for n in exported)
    undocumented = sorted(n for n in exported if not _has_docstring(module, n))
    assert undocumented == []


def test_the_rl_core_api_is_small_and_only_rl() -> None:
    assert len(rlpure.__all__) <= 60
    model_or_task = {"logits", "init_params", "ByteTokenizer", "gsm8k_question", "BOS_ID"}
    assert not model_or_task & set(rlpure.__all__)
    assert "LocalServiceClient" in shell.__all__
