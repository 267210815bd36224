"""Local backend speed: toy-model training and sampling against the old paths, and a model's
prefill, decode and LoRA training throughput against `transformers` PyTorch and a matmul.

Every figure is a ratio against a baseline measured in the same process (STYLE: benchmarks
print ratios), after a warm-up call (compile time is reported apart), with CPU time next to
wall time (on a shared machine wall time is noise; CPU time is what the work costs).

Sections (`--sections`, default all):

- `toy-train`: `forward_backward` of `--datums` datums of lengths drawn in `[--min-len,
  --max-len]` on `rlpure/tiny`, through `LocalTrainingClient` (datums sorted by length, each
  chunk padded to its own length bucket, no padding-only chunks) against the previous path,
  rebuilt here: the whole batch padded to a power-of-two `[D, T]` and cut into row chunks
  over all `D` rows, padding rows included. Same stage functions, same weights.
- `toy-sample`: one multi-turn-style `sample` (2 samples of a long prompt) through
  `LocalSamplingClient` (one prefill per request, its prompt rows bucketed from 1) against
  the previous layout (one prefill per sample row, rows padded to 8).
- `model`: a pretrained model (`--model`, default the packaged SmolLM2-135M-Instruct; any
  `base_model` the resolver accepts): prefill and decode tokens/s of `--prompts` prompts ×
  `--samples` samples, `--prompt-len` + `--new-tokens` tokens, and LoRA forward+backward
  tokens/s; against `transformers` (`generate` with its KV cache; autograd on LoRA adapters)
  when torch is importable (run under `.cbvenv`), and the achieved GFLOP/s against a large
  `jnp.matmul`. Prints the JAX device.

Run: `.venv/bin/python benchmarks/bench_local_model.py --sections toy-train toy-sample`
or, with torch, `.cbvenv/bin/python benchmarks/bench_local_model.py --sections model`.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tinker import types

from rlpure import model as model_lib
from shell.local import LocalServiceClient
from shell.local._inputs import check_data, loss_config_key, row_bucket
from shell.local._train_steps import (
    loss_and_logprob_grad,
    model_backward,
    model_forward_vjp,
    zeros_like_tree,
)

_ATTENTION_ELEMENTS = 1 << 25  # the runtime's budget (shell.local._runtime)


def _timed(fn: Callable[[], Any], reps: int) -> tuple[float, float, float]:
    """(first-call wall seconds, then mean wall and CPU seconds over `reps` calls)."""
    start = time.perf_counter()
    jax.block_until_ready(fn())  # type: ignore[no-untyped-call]
    first = time.perf_counter() - start
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(reps):
        jax.block_until_ready(fn())  # type: ignore[no-untyped-call]
    return first, (time.perf_counter() - wall) / reps, (time.process_time() - cpu) / reps


def _rl_datum(rng: np.random.Generator, n: int) -> types.Datum:
    tokens = rng.integers(0, 256, n + 1)
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1].tolist()),
        loss_fn_inputs={
            "target_tokens": types.TensorData.from_numpy(tokens[1:].astype(np.int64)),
            "logprobs": types.TensorData.from_numpy(np.full(n, -5.0, np.float32)),
            "advantages": types.TensorData.from_numpy(rng.normal(size=n).astype(np.float32)),
        },
    )


def _old_forward_backward(params: Any, config: model_lib.ModelConfig, data: list[Any]) -> Any:
    """The previous `forward_backward`: one power-of-two `[D, T]` pad, row chunks over all D."""
    checked = check_data(data, "importance_sampling", config)
    n_d = row_bucket(len(data))
    n_t = row_bucket(int(checked.length_D.max()), minimum=16)
    inputs = {
        k: np.zeros((n_d, n_t), np.int32 if k == "target_tokens" else np.float32)
        for k in checked.keys
    }
    input_D_T = np.zeros((n_d, n_t), np.int32)
    valid_D_T = np.zeros((n_d, n_t), np.float32)
    for d, tokens in enumerate(checked.tokens_D):
        input_D_T[d, : tokens.size] = tokens
        valid_D_T[d, : tokens.size] = 1.0
        for k, arr in checked.inputs_D[d].items():
            inputs[k][d, : tokens.size] = arr
    budget = min(16_384 // n_t, _ATTENTION_ELEMENTS // (config.n_heads * n_t * n_t))
    rows = min(n_d, 1 << (max(1, budget).bit_length() - 1))
    grads = zeros_like_tree(params)
    for start in range(0, n_d, rows):
        part = slice(start, start + rows)
        lp, vjp = model_forward_vjp(
            params, input_D_T[part], inputs["target_tokens"][part], config=config
        )
        _, dlp = loss_and_logprob_grad(
            lp,
            {k: v[part] for k, v in inputs.items()},
            valid_D_T[part],
            loss_fn="importance_sampling",
            loss_config=loss_config_key(None),
            with_grad=True,
        )
        grads = model_backward(vjp, dlp, grads)
    return grads


def bench_toy_train(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(args.min_len, args.max_len + 1, args.datums)
    data = [_rl_datum(rng, int(n)) for n in lengths]
    trainer = LocalServiceClient(seed=0).create_lora_training_client("rlpure/tiny").result()
    params, config = trainer.params, trainer.config

    def new() -> Any:
        trainer.forward_backward(data, "importance_sampling").result()
        grads = trainer._grads
        trainer._grads = None  # keep the weights fixed: time forward_backward alone
        return grads

    old_first, old_wall, old_cpu = _timed(lambda: _old_forward_backward(params, config, data), 1)
    new_first, new_wall, new_cpu = _timed(new, 1)
    tokens = int(lengths.sum())
    print(
        f"toy-train: {args.datums} datums, lengths {args.min_len}-{args.max_len} "
        f"({tokens:,} tokens), rlpure/tiny"
    )
    for name, first, wall, cpu in (
        ("old path", old_first, old_wall, old_cpu),
        ("new path", new_first, new_wall, new_cpu),
    ):
        print(
            f"  {name}: first call {first:6.1f}s; then {wall:6.2f}s wall, {cpu:6.2f}s CPU "
            f"({tokens / cpu:,.0f} tokens per CPU-second)"
        )
    print(f"  speed-up: {old_cpu / new_cpu:.2f}x CPU, {old_wall / new_wall:.2f}x wall")


def bench_toy_sample(args: argparse.Namespace) -> None:
    sampler = LocalServiceClient(seed=0).create_sampling_client(base_model="rlpure/tiny").result()
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, 256, args.prompt_len_toy).tolist()
    params = types.SamplingParams(max_tokens=8, temperature=1.0, seed=3)

    def new() -> Any:
        return sampler.sample(types.ModelInput.from_ints(prompt), 2, params).result()

    def old() -> Any:  # the previous layout: one prefill per sample row, 8 rows
        config = sampler._config
        b, t, m = 8, row_bucket(len(prompt), minimum=16), 16
        prompt_B_T = np.zeros((b, t), np.int32)
        prompt_B_T[:2, : len(prompt)] = prompt
        length_B = np.full(b, len(prompt), np.int32)
        batch = model_lib.SampleBatch(
            prompt_tokens_B_T=prompt_B_T,
            prompt_length_B=length_B,
            max_new_tokens_B=np.array([8, 8] + [0] * 6, np.int32),
            temperature_B=np.ones(b, np.float32),
            top_k_B=np.zeros(b, np.int32),
            top_p_B=np.ones(b, np.float32),
            key_material_B_K=np.arange(2 * b, dtype=np.uint32).reshape(b, 2),
            stop_token_mask_B_V=np.zeros((b, config.vocab_size), bool),
            stop_seqs_B_Q_W=np.full((b, 4, 8), -1, np.int32),
            stop_seq_valid_B_Q=np.zeros((b, 4), bool),
        )
        return model_lib.sample_tokens(sampler._params, batch, config=config, max_new_tokens=m)

    old_first, old_wall, old_cpu = _timed(old, 2)
    new_first, new_wall, new_cpu = _timed(new, 2)
    print(f"toy-sample: 2 samples × 8 tokens of a {len(prompt)}-token prompt, rlpure/tiny")
    print(f"  old layout: first {old_first:.1f}s; then {old_wall:.3f}s wall, {old_cpu:.3f}s CPU")
    print(f"  new layout: first {new_first:.1f}s; then {new_wall:.3f}s wall, {new_cpu:.3f}s CPU")
    print(f"  speed-up: {old_cpu / new_cpu:.2f}x CPU, {old_wall / new_wall:.2f}x wall")


def _matmul_gflops(n: int = 2048) -> float:
    a = jnp.ones((n, n), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    _, wall, _ = _timed(lambda: f(a), 3)
    return 2 * n**3 / wall / 1e9


def bench_model(args: argparse.Namespace) -> None:
    service = LocalServiceClient(seed=0)
    trainer = service.create_lora_training_client(args.model, rank=32).result()
    config, base = trainer.config, trainer.base_params
    assert base is not None
    n_params = model_lib.count_params(base)
    sampler = trainer.save_weights_and_get_sampling_client().result()
    rng = np.random.default_rng(0)
    vocab = config.vocab_size
    prompts = [rng.integers(0, vocab, args.prompt_len).tolist() for _ in range(args.prompts)]
    params = types.SamplingParams(max_tokens=args.new_tokens, temperature=1.0, stop=[])

    def sample_all() -> Any:
        async def go() -> Any:
            import asyncio

            return await asyncio.gather(
                *[
                    sampler.sample_async(types.ModelInput.from_ints(p), args.samples, params)
                    for p in prompts
                ]
            )

        import asyncio

        return asyncio.run(go())

    first, wall, _ = _timed(sample_all, 1)
    gen_tokens = args.prompts * args.samples * args.new_tokens
    data = [
        _rl_datum_vocab(rng, args.prompt_len + args.new_tokens, vocab)
        for _ in range(args.prompts * args.samples)
    ]

    def train() -> Any:
        trainer.forward_backward(data, "importance_sampling").result()
        grads = trainer._grads
        trainer._grads = None
        return grads

    tfirst, twall, _ = _timed(train, 1)
    train_tokens = len(data) * (args.prompt_len + args.new_tokens)
    gflops = 6 * n_params * train_tokens / twall / 1e9  # dense-model estimate, no attention
    peak = _matmul_gflops()
    print(f"model {args.model}: {n_params / 1e6:.1f}M params, device {jax.devices()[0]}")
    print(
        f"  sample {args.prompts}×{args.samples}, {args.prompt_len}+{args.new_tokens}: "
        f"first {first:.1f}s; then {wall:.2f}s ({gen_tokens / wall:,.0f} sampled tokens/s)"
    )
    print(
        f"  LoRA forward+backward {train_tokens:,} tokens: first {tfirst:.1f}s; then "
        f"{twall:.2f}s ({train_tokens / twall:,.0f} tokens/s, ~{gflops:.1f} GFLOP/s = "
        f"{gflops / peak:.0%} of a 2048² matmul's {peak:.1f} GFLOP/s)"
    )


def _rl_datum_vocab(rng: np.random.Generator, n: int, vocab: int) -> types.Datum:
    tokens = rng.integers(0, vocab, n + 1)
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1].tolist()),
        loss_fn_inputs={
            "target_tokens": types.TensorData.from_numpy(tokens[1:].astype(np.int64)),
            "logprobs": types.TensorData.from_numpy(np.full(n, -5.0, np.float32)),
            "advantages": types.TensorData.from_numpy(rng.normal(size=n).astype(np.float32)),
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sections", nargs="+", default=["toy-train", "toy-sample", "model"])
    parser.add_argument("--datums", type=int, default=80)
    parser.add_argument("--min-len", type=int, default=100)
    parser.add_argument("--max-len", type=int, default=1000)
    parser.add_argument("--prompt-len-toy", type=int, default=1900)
    parser.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    print(f"JAX {jax.__version__}, device {jax.devices()[0]}")
    for section in args.sections:
        {"toy-train": bench_toy_train, "toy-sample": bench_toy_sample, "model": bench_model}[
            section
        ](args)


if __name__ == "__main__":
    main()
