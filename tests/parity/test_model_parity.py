"""Differential tests of `rlpure.model`'s open-weight families against `transformers` PyTorch.

Random small `LlamaForCausalLM`, `Qwen2ForCausalLM` and `Qwen3ForCausalLM` models (grouped-query
attention; Llama also with Llama 3.1 RoPE scaling and with tied embeddings) are converted with
`config_from_hf(model.config.to_dict())` and `params_from_hf(config, state_dict)`; our float32
logits must match PyTorch's within 1e-4. Norm weights and biases are randomised (they start at
1 and 0) so a mis-mapped one shows. Skips without torch (run with `.cbvenv/bin/pytest`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rlpure import model as M  # noqa: E402

COMMON: dict[str, Any] = {
    "vocab_size": 97,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1000.0,
}

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", {}),
    "llama-tied": ("LlamaConfig", {"tie_word_embeddings": True, "num_key_value_heads": 1}),
    "llama3-rope-scaling": (
        "LlamaConfig",
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
            "rope_theta": 500000.0,
        },
    ),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {"head_dim": 32}),
}


def _hf_model(case: str) -> Any:
    config_cls, extra = CASES[case]
    config = getattr(transformers, config_cls)(**{**COMMON, **extra})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = getattr(transformers, config_cls.replace("Config", "ForCausalLM"))(config).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if name.endswith("norm.weight"):
                tensor.copy_(1.0 + 0.2 * torch.randn(tensor.shape, generator=generator))
            elif name.endswith(".bias"):
                tensor.copy_(0.2 * torch.randn(tensor.shape, generator=generator))
            else:  # larger weights than the 0.02 init, so the logits are far from uniform
                tensor.mul_(5.0)
    return model


def _ours(model: Any) -> tuple[M.ModelConfig, M.Params]:
    config = M.config_from_hf(model.config.to_dict())
    tensors = {name: t.detach().numpy() for name, t in model.state_dict().items()}
    return config, M.params_from_hf(config, tensors)


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers_float32(case: str) -> None:
    model = _hf_model(case)
    config, params = _ours(model)
    assert (
        config.family
        == {"Llama": "llama", "Qwen2": "qwen2", "Qwen3": "qwen3"}[
            type(model).__name__.removesuffix("ForCausalLM")
        ]
    )
    assert config.tie_embeddings == (case == "llama-tied")
    assert ("unembed_E_V" in params) == (case != "llama-tied")
    tokens = np.random.default_rng(0).integers(0, COMMON["vocab_size"], (2, 40)).astype(np.int32)
    with torch.no_grad():
        want = model(torch.from_numpy(tokens.astype(np.int64))).logits.numpy()
    got = np.asarray(M.logits(params, tokens, config=config))
    assert np.abs(want).max() > 1.0  # a non-trivial model
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def test_llama3_rope_frequencies_match_transformers() -> None:
    model = _hf_model("llama3-rope-scaling")
    config, _ = _ours(model)
    want = model.model.rotary_emb.inv_freq.numpy()
    np.testing.assert_allclose(M.rope_inv_freq(config), want, rtol=1e-6)
    assert config.rope_scaling is not None and config.rope_scaling.factor == 8.0


def test_lora_with_zero_b_equals_the_transformers_base() -> None:
    model = _hf_model("qwen3")
    config, params = _ours(model)
    lora = M.LoraConfig(rank=4)
    import jax

    adapters = M.init_lora(jax.random.key(0), config, lora)
    tokens = np.random.default_rng(2).integers(0, COMMON["vocab_size"], (1, 24)).astype(np.int32)
    with torch.no_grad():
        want = model(torch.from_numpy(tokens.astype(np.int64))).logits.numpy()
    got = np.asarray(M.logits(params, tokens, config=config, adapters=adapters, lora=lora))
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def test_greedy_decoding_matches_transformers_generate() -> None:
    model = _hf_model("llama")
    config, params = _ours(model)
    prompt = np.random.default_rng(3).integers(0, COMMON["vocab_size"], 7).astype(np.int64)
    with torch.no_grad():
        out = model.generate(
            torch.from_numpy(prompt)[None],
            max_new_tokens=8,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
        )
    want = out[0, len(prompt) :].tolist()
    b, t, m, v = 2, 8, 8, COMMON["vocab_size"]
    prompts = np.zeros((b, t), np.int32)
    prompts[0, : len(prompt)] = prompt
    batch = M.SampleBatch(
        prompt_tokens_B_T=prompts,
        prompt_length_B=np.array([len(prompt), 1], np.int32),
        max_new_tokens_B=np.array([m, 0], np.int32),
        temperature_B=np.zeros(b, np.float32),
        top_k_B=np.zeros(b, np.int32),
        top_p_B=np.ones(b, np.float32),
        key_material_B_K=np.zeros((b, 1), np.uint32),
        stop_token_mask_B_V=np.zeros((b, v), bool),
        stop_seqs_B_Q_W=np.full((b, 1, 1), -1, np.int32),
        stop_seq_valid_B_Q=np.zeros((b, 1), bool),
    )
    got = M.sample_tokens(params, batch, config=config, max_new_tokens=m)
    assert np.asarray(got.tokens_B_M)[0].tolist() == want


def test_hf_config_errors_name_the_field() -> None:
    base = {**COMMON, "architectures": ["LlamaForCausalLM"]}
    with pytest.raises(ValueError, match=r"unsupported architectures.*GPT2LMHeadModel"):
        M.config_from_hf({**base, "architectures": ["GPT2LMHeadModel"]})
    with pytest.raises(ValueError, match=r"'rope_scaling'.*'yarn'"):
        M.config_from_hf({**base, "rope_scaling": {"rope_type": "yarn", "factor": 2.0}})
    missing = dict(base)
    del missing["hidden_size"]
    with pytest.raises(ValueError, match="missing field 'hidden_size'"):
        M.config_from_hf(missing)
    model = _hf_model("qwen2")
    config, _ = _ours(model)
    tensors = {name: t.detach().numpy() for name, t in model.state_dict().items()}
    del tensors["model.layers.1.self_attn.k_proj.bias"]
    tensors["model.extra.weight"] = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match=r"missing tensors \['model.layers.1.self_attn.k_proj"):
        M.params_from_hf(config, tensors)
    tensors = {name: t.detach().numpy() for name, t in model.state_dict().items()}
    tensors["model.layers.0.mlp.up_proj.weight"] = np.zeros((96, 65), np.float32)
    with pytest.raises(
        ValueError, match=r"up_proj.weight: expected shape \(96, 64\), got \(96, 65\)"
    ):
        M.params_from_hf(config, tensors)
