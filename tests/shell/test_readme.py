"""The README's Python examples run as written."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def _run_blocks() -> list[dict]:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert blocks, "the README has no Python example"
    namespaces = []
    for i, block in enumerate(blocks):
        # a real module: chz and dataclasses look the defining module up in sys.modules
        module = types.ModuleType(f"readme_example_{i}")
        sys.modules[module.__name__] = module
        try:
            exec(compile(block, str(README), "exec"), module.__dict__)
        finally:
            del sys.modules[module.__name__]
        namespaces.append(module.__dict__)
    return namespaces


def test_readme_python_blocks_run():
    by_name = {name: ns for ns in _run_blocks() for name in ns}
    # The quick example's promised values.
    quick = by_name["datums"]
    assert quick["advantages_P_G"].tolist() == [[0.5, -0.5]]
    assert len(quick["datums"]) == 2
    assert set(quick["datums"][0].loss_fn_inputs) == {"target_tokens", "logprobs", "advantages"}
    # The corrections example's promised values (its comments).
    corrections = by_name["is_w"]
    assert corrections["length_penalty_G"].tolist() == [0.0, -0.5]
    assert corrections["advantages_P_G"].tolist() == [[0.25, -0.25]]
    assert corrections["is_w"].weights_D_T[1].tolist() == [0.0] * 4
    assert corrections["is_w"].weights_D_T[0].tolist() == [1.0] * 4
    assert (corrections["kl"].kl_D_T >= 0).all()
    # The porting example trained its 2 steps through shell.cookbook.rl.train.main, and is resumable.
    ported = by_name["SayHiDatasetBuilder"]
    assert ported["result"].end_step == 2
    assert 0.0 <= ported["result"].last_metrics["env/all/said_hi"] <= 1.0
    assert (Path(ported["log_path"]) / "local_states").is_dir()
