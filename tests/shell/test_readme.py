"""The README's Python examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert blocks, "the README has no Python example"
    for block in blocks:
        namespace: dict = {}
        exec(compile(block, str(README), "exec"), namespace)
    # The quick example's promised values.
    assert namespace["advantages_P_G"].tolist() == [[0.5, -0.5]]
    assert len(namespace["datums"]) == 2
    assert set(namespace["datums"][0].loss_fn_inputs) == {"target_tokens", "logprobs", "advantages"}
