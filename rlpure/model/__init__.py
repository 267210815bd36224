"""The local backend's model maths: a small pre-LN transformer, its sampler, its optimiser and
its byte tokenizer (pure JAX; `shell.local` runs them behind the Tinker client interface).

- `_transformer`: `ModelConfig`, the named `MODEL_CONFIGS`, `init_params`, the causal forward
  pass, `logits` and `target_logprobs` (training logprobs).
- `_sampling`: `sample_tokens` (KV-cached decoding with stop tokens/sequences, temperature,
  top-k/top-p) and its `SampleBatch` / `SampleOutput` records.
- `_optimizer`: `AdamHyperparams`, `init_optimizer_state`, `apply_adam_update` (clipped AdamW)
  and its `AdamUpdate` result.
- `_tokenizer`: `ByteTokenizer` (256 bytes + BOS/EOS/PAD) and its special ids.

Conventions (stated in full in each module's docstring): token arrays are right-padded int32
`[B, T]`; position `t` of the input predicts token `t + 1` (Tinker's datum convention); shapes
are bucketed by the caller (`rlpure.buckets.bucket_size`, powers of two) so a run compiles a
handful of times; `config` and the number of new tokens are static under `jit`, everything else
is traced.
"""

from __future__ import annotations

from rlpure.model._optimizer import (
    AdamHyperparams,
    AdamUpdate,
    apply_adam_update,
    init_optimizer_state,
)
from rlpure.model._sampling import SampleBatch, SampleOutput, sample_tokens
from rlpure.model._tokenizer import BOS_ID, EOS_ID, NUM_BYTES, PAD_ID, VOCAB_SIZE, ByteTokenizer
from rlpure.model._transformer import (
    MODEL_CONFIGS,
    ModelConfig,
    Params,
    count_params,
    get_model_config,
    init_params,
    logits,
    target_logprobs,
    target_logprobs_fn,
)

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "MODEL_CONFIGS",
    "NUM_BYTES",
    "PAD_ID",
    "VOCAB_SIZE",
    "AdamHyperparams",
    "AdamUpdate",
    "ByteTokenizer",
    "ModelConfig",
    "Params",
    "SampleBatch",
    "SampleOutput",
    "apply_adam_update",
    "count_params",
    "get_model_config",
    "init_optimizer_state",
    "init_params",
    "logits",
    "sample_tokens",
    "target_logprobs",
    "target_logprobs_fn",
]
