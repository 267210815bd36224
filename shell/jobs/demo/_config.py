"""The offline demo's recipe (`DemoConfig`) and the seed's per-stage keys (`demo_keys`).

Part of `rlpure demo` (see `shell.jobs.demo` for the whole recipe). `DemoConfig` validates its
fields once, in `__post_init__` (counts `>= 1`, `pretrain_steps >= 0`, learning rates finite
and `> 0`), raising `shell.errors.ConfigError` (a `ValueError`).
`demo_keys(seed)` splits `jax.random.key(seed)` into the three keys of the run, one per stage:
`split` (train/test problems), `corpus` (the base model's pretraining corpus) and `rl` (GRPO
batches); every stage draws from its own key, so changing one stage leaves the others' draws unchanged.
"""

from __future__ import annotations

import math

import jax
import msgspec

from shell.errors import ConfigError

__all__ = ["DemoConfig", "demo_keys"]


class DemoConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The demo's recipe (defaults: the benchmarked one).

    Attributes:
        base_model: local model config (`rlpure.model.MODEL_CONFIGS`).
        max_operand: operands lie in `[0, max_operand]`.
        num_test: held-out test problems.
        p_correct: probability that the pretraining corpus answers right (careful style).
        p_high: probability that it guesses `sum + 1` (else `sum − 1`).
        pretrain_steps: cross-entropy steps of the base-model stage.
        pretrain_batch: documents per pretraining step.
        pretrain_lr: Adam learning rate of the pretraining stage.
        rl_steps: GRPO steps.
        groups_per_batch: problems per GRPO step (`P`).
        group_size: samples per problem (`G`).
        rl_lr: Adam learning rate of GRPO.
        max_tokens: sampled tokens per answer.
        eval_every: greedy test evaluation every N GRPO steps (and always at 0 and the end).
        format_coef: reward penalty of a malformed answer.
    """

    base_model: str = "rlpure/tiny"
    max_operand: int = 9
    num_test: int = 20
    p_correct: float = 0.3
    p_high: float = 0.7
    pretrain_steps: int = 600
    pretrain_batch: int = 64
    pretrain_lr: float = 3e-3
    rl_steps: int = 40
    groups_per_batch: int = 16
    group_size: int = 8
    rl_lr: float = 3e-4
    max_tokens: int = 16
    eval_every: int = 5
    format_coef: float = 0.1

    def __post_init__(self) -> None:
        # ConfigError (a ValueError): the CLI reports it as one line with exit code 2.
        for name in (
            "max_operand",
            "num_test",
            "pretrain_batch",
            "rl_steps",
            "groups_per_batch",
            "group_size",
            "max_tokens",
            "eval_every",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"DemoConfig.{name}: expected >= 1, got {getattr(self, name)}")
        if self.pretrain_steps < 0:
            raise ConfigError(
                f"DemoConfig.pretrain_steps: expected >= 0, got {self.pretrain_steps}"
            )
        for name in ("pretrain_lr", "rl_lr"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"DemoConfig.{name}: expected a finite value > 0, got {value}")
        for name in ("p_correct", "p_high"):
            if not 0 <= getattr(self, name) <= 1:
                raise ConfigError(
                    f"DemoConfig.{name}: expected in [0, 1], got {getattr(self, name)}"
                )
        if not (math.isfinite(self.format_coef) and self.format_coef >= 0):
            raise ConfigError(
                f"DemoConfig.format_coef: expected a finite value >= 0, got {self.format_coef}"
            )


def demo_keys(seed: int) -> dict[str, jax.Array]:
    """The run's per-stage keys `split`, `corpus` and `rl`, split from `jax.random.key(seed)`."""
    split, corpus, rl = jax.random.split(jax.random.key(seed), 3)
    return {"split": split, "corpus": corpus, "rl": rl}
