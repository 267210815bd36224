"""The local backend's model maths: decoder-only transformers (the toy `rlpure` family and the
Llama / Qwen2 / Qwen3 open-weight families), LoRA, their sampler, optimiser and byte tokenizer
(pure JAX; `shell.local` runs them behind the Tinker client interface).

- `_config`: `ModelConfig` (every family), `RopeScaling` (and
  `llama3_rope_scaling_from_factors`, recovering it from per-frequency divisors), the named
  `MODEL_CONFIGS`.
- `_transformer`: `init_params`, the causal `forward` pass, the KV-cached `prefill` and
  `decode_step`, `logits`, `target_logprobs` (training logprobs), each with optional LoRA
  adapters, `topk_logprobs` (the most likely next tokens) and `ids_logprobs` (chosen
  ones), for the sampler's prompt-logprob options.
- `_layers`: the transformer's norms, RoPE (`rope_inv_freq`), linear maps, attention, MLPs,
  embedding and unembedding.
- `_prefix_forward`: `prefix_target_logprobs_fn`, training logprobs of datums packed as
  prefix tries (`PrefixRows`, `prefix_attention_mask`): each shared prefix computed once.
- `_grouped_forward`: `grouped_target_logprobs_fn`, the same for datums grouped by a shared
  prefix (`GroupedRows`, `suffix_attention_mask`): a prefix row per group, a suffix row per
  datum reading it (attention over exactly the keys a datum's token may see).
- `_lora_kernels`: the LoRA terms' hand-written VJPs (unmerged `(x A) B`, the merged
  unembedding).
- `_lora`: `LoraConfig` (Tinker's `rank`, `train_attn`, `train_mlp`, `train_unembed`; scale
  `α / R` with `α = 32`), `init_lora` (B = 0), `merge_lora`.
- `_hf_names`: `config_from_hf` and `params_from_hf`, Hugging Face `config.json` and
  state-dict names to ours (pure; the shell reads the files).
- `_sampling`: `sample_tokens` (KV-cached decoding with stop tokens/sequences, temperature,
  top-k/top-p) and its `SampleBatch` / `SampleOutput` records; `stop_string_end`, where a
  stop string ends a completion's decoded text (host side); `topk_tempered_logprobs`, the
  most likely next tokens under a row's sampling temperature (top-k sampled logprobs), and
  `prompt_alt_tokens`, draws from it at each prompt position.
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

from rlpure.model._config import (
    MODEL_CONFIGS,
    ModelConfig,
    RopeScaling,
    get_model_config,
    llama3_rope_scaling_from_factors,
)
from rlpure.model._grouped_forward import (
    GroupedRows,
    grouped_target_logprobs_fn,
    prefill_shared_prefix,
    suffix_attention_mask,
)
from rlpure.model._hf_names import config_from_hf, params_from_hf
from rlpure.model._layers import rope_inv_freq
from rlpure.model._lora import LoraConfig, count_lora_params, init_lora, merge_lora
from rlpure.model._optimizer import (
    AdamHyperparams,
    AdamUpdate,
    apply_adam_update,
    init_optimizer_state,
)
from rlpure.model._prefix_forward import (
    PrefixRows,
    prefix_attention_mask,
    prefix_target_logprobs_fn,
)
from rlpure.model._sampling import (
    SampleBatch,
    SampleOutput,
    prompt_alt_tokens,
    sample_tokens,
    stop_string_end,
    topk_tempered_logprobs,
)
from rlpure.model._tokenizer import BOS_ID, EOS_ID, NUM_BYTES, PAD_ID, VOCAB_SIZE, ByteTokenizer
from rlpure.model._transformer import (
    DecodeOutput,
    ForwardOutput,
    KVCache,
    Params,
    PrefillOutput,
    count_params,
    decode_step,
    forward,
    ids_logprobs,
    init_params,
    logits,
    prefill,
    target_logprobs,
    target_logprobs_fn,
    topk_logprobs,
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
    "DecodeOutput",
    "ForwardOutput",
    "GroupedRows",
    "KVCache",
    "LoraConfig",
    "ModelConfig",
    "Params",
    "PrefillOutput",
    "PrefixRows",
    "RopeScaling",
    "SampleBatch",
    "SampleOutput",
    "apply_adam_update",
    "config_from_hf",
    "count_lora_params",
    "count_params",
    "decode_step",
    "forward",
    "get_model_config",
    "grouped_target_logprobs_fn",
    "ids_logprobs",
    "init_lora",
    "init_optimizer_state",
    "init_params",
    "llama3_rope_scaling_from_factors",
    "logits",
    "merge_lora",
    "params_from_hf",
    "prefill",
    "prefill_shared_prefix",
    "prefix_attention_mask",
    "prefix_target_logprobs_fn",
    "prompt_alt_tokens",
    "rope_inv_freq",
    "sample_tokens",
    "stop_string_end",
    "suffix_attention_mask",
    "target_logprobs",
    "target_logprobs_fn",
    "topk_logprobs",
    "topk_tempered_logprobs",
]
