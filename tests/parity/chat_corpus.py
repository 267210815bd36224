"""A small chat corpus for the cookbook's supervised, preference and distillation trainers,
written as the cookbook's file builders read it (JSON lines), offline.

Sixteen one-turn chats, each a sum and its answer (`"3+17="` → `"20"`): `write_sum_chats`
writes them as `FromConversationFileBuilder`'s `{"messages": [...]}` rows,
`write_sum_comparisons` as `ComparisonBuilderFromJsonl`'s labelled comparisons (the right sum
against one off by one, the right one `A` or `B` in turn). `common_config` is the builders'
shared config for a local model directory and the `role_colon` renderer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

__all__ = ["SUMS", "common_config", "write_sum_chats", "write_sum_comparisons"]

SUMS = tuple(zip(range(3, 19), range(17, 1, -1), strict=True))
"""The corpus's sixteen `(a, b)` pairs."""


def _turns(a: int, b: int, answer: int) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    prompt = [{"role": "user", "content": f"{a}+{b}="}]
    return prompt, [{"role": "assistant", "content": str(answer)}]


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_sum_chats(path: Path) -> Path:
    """The corpus as chats, one `{"messages": [user, assistant]}` a line."""
    rows = []
    for a, b in SUMS:
        prompt, answer = _turns(a, b, a + b)
        rows.append({"messages": prompt + answer})
    return _write(path, rows)


def write_sum_comparisons(path: Path) -> Path:
    """The corpus as labelled comparisons: the right sum preferred to one off by one."""
    rows = []
    for index, (a, b) in enumerate(SUMS):
        prompt, right = _turns(a, b, a + b)
        _, wrong = _turns(a, b, a + b + 1)
        first, second, label = (right, wrong, "A") if index % 2 == 0 else (wrong, right, "B")
        comparison = {"prompt_conversation": prompt, "completion_A": first, "completion_B": second}
        rows.append({"comparison": comparison, "label": label})
    return _write(path, rows)


def common_config(model: str, *, batch_size: int) -> ChatDatasetBuilderCommonConfig:
    """The builders' config: `model`'s tokenizer (a local directory), `role_colon`."""
    return ChatDatasetBuilderCommonConfig(
        model_name_for_tokenizer=model,
        renderer_name="role_colon",
        max_length=128,
        batch_size=batch_size,
    )
