"""The local backend's model in one import: the transformer, its sampler and its optimiser.

`shell.local_backend` and its helpers use `rlpure.model` (as `model_lib`) for everything model
side; the code lives in three modules, one job each, and this module re-exports their public
names:

- `rlpure.transformer`: `ModelConfig`, the named `MODEL_CONFIGS`, `init_params`, the causal
  forward pass, `logits` and `target_logprobs` (training logprobs), `bucket_size`.
- `rlpure.sampling`: `sample_tokens` (KV-cached decoding with stop tokens/sequences,
  temperature, top-k/top-p) and its `SampleBatch` / `SampleOutput` records.
- `rlpure.optimizer`: `AdamHyperparams`, `init_optimizer_state`, `apply_adam_update` (clipped
  AdamW).

Conventions (stated in full in each module's docstring): token arrays are right-padded int32
`[B, T]`; position `t` of the input predicts token `t + 1` (Tinker's datum convention); shapes
are bucketed by the caller (`bucket_size`) so a run compiles a handful of times; `config` and
the number of new tokens are static under `jit`, everything else is traced.
"""

from __future__ import annotations

from rlpure.optimizer import AdamHyperparams, apply_adam_update, init_optimizer_state
from rlpure.sampling import SampleBatch, SampleOutput, sample_tokens
from rlpure.transformer import (
    MODEL_CONFIGS,
    ModelConfig,
    Params,
    bucket_size,
    count_params,
    get_model_config,
    init_params,
    logits,
    target_logprobs,
    target_logprobs_fn,
)

__all__ = [
    "MODEL_CONFIGS",
    "AdamHyperparams",
    "ModelConfig",
    "Params",
    "SampleBatch",
    "SampleOutput",
    "apply_adam_update",
    "bucket_size",
    "count_params",
    "get_model_config",
    "init_optimizer_state",
    "init_params",
    "logits",
    "sample_tokens",
    "target_logprobs",
    "target_logprobs_fn",
]
