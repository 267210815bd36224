"""The pure core stays pure: an AST scan of every module under `rlpure/`.

Forbidden: importing effectful packages (asyncio, tinker, returns, the shell, network and process
libraries, file-system helpers) and calling IO builtins (`open`, `input`, `print`, `exec`, `eval`).
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

RLPURE = Path(__file__).resolve().parents[2] / "rlpure"

FORBIDDEN_MODULES = {
    "asyncio",
    "tinker",
    "returns",
    "shell",
    "socket",
    "ssl",
    "http",
    "urllib",
    "requests",
    "httpx",
    "aiohttp",
    "subprocess",
    "multiprocessing",
    "threading",
    "shutil",
    "tempfile",
    "glob",
    "pathlib",
    "io",
    "pickle",
    "datasets",
    "matplotlib",
    "rich",
    "logging",
}
FORBIDDEN_CALLS = {"open", "input", "print", "exec", "eval", "breakpoint", "__import__"}
FORBIDDEN_ATTRIBUTE_CALLS = {
    ("os", "system"),
    ("os", "popen"),
    ("os", "remove"),
    ("os", "makedirs"),
    ("os", "listdir"),
    ("os", "getenv"),
    ("np", "load"),
    ("np", "save"),
    ("np", "savez"),
    ("np", "loadtxt"),
    ("np", "fromfile"),
    ("jnp", "load"),
    ("jnp", "save"),
}


def _modules() -> list[Path]:
    return sorted(RLPURE.rglob("*.py"))


def _violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            if name.split(".")[0] in FORBIDDEN_MODULES or name == "os.path":
                found.append(f"{path.name}:{getattr(node, 'lineno', '?')} imports {name}")
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in FORBIDDEN_CALLS:
                found.append(f"{path.name}:{node.lineno} calls {func.id}()")
            if (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and (func.value.id, func.attr) in FORBIDDEN_ATTRIBUTE_CALLS
            ):
                found.append(f"{path.name}:{node.lineno} calls {func.value.id}.{func.attr}()")
    return found


def test_rlpure_has_modules_to_scan():
    assert len(_modules()) >= 5


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.name)
def test_module_is_pure(path):
    assert _violations(path) == []


def test_the_scanner_catches_violations(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import asyncio\nfrom tinker import Datum\nimport shell.env\n"
        "def f():\n    open('x')\n    np.save('y', 1)\n"
    )
    assert len(_violations(bad)) == 5


def test_importing_rlpure_loads_no_effectful_package():
    code = (
        "import sys, rlpure; "
        "bad = sorted(m for m in ('asyncio', 'tinker', 'returns', 'shell', 'datasets') "
        "if m in sys.modules); print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
