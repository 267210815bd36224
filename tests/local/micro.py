"""A micro model config (a few thousand weights) and its service, for tests that need real
checkpoints and clients but hardly any compilation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import msgspec
import numpy as np

from rlpure import model as model_lib
from rlpure.model import VOCAB_SIZE
from shell.local import LocalServiceClient, LocalTrainingClient

MICRO = model_lib.ModelConfig(
    vocab_size=VOCAB_SIZE, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=64
)
MICRO_NAME = "test/micro"
MICRO_BUILTINS = msgspec.to_builtins(MICRO)  # the config as a manifest holds it


def micro_service(tmp_path: Path | None = None, seed: int = 0) -> LocalServiceClient:
    """A service that knows `MICRO` as `MICRO_NAME`, checkpointing under `tmp_path`."""
    return LocalServiceClient(seed=seed, checkpoint_dir=tmp_path, model_configs={MICRO_NAME: MICRO})


def micro_trainer(tmp_path: Path) -> LocalTrainingClient:
    """A fresh training client on the micro model."""
    return micro_service(tmp_path).create_lora_training_client(base_model=MICRO_NAME).result()


def params_equal(a: Any, b: Any) -> bool:
    """Whether two weight pytrees hold exactly the same arrays."""
    return all(
        np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True)
    )


def micro_params() -> model_lib.Params:
    """The micro model's weights from key 0."""
    return model_lib.init_params(jax.random.key(0), MICRO)
