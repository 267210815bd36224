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
  `base_model` the resolver accepts) against `transformers` PyTorch loading the same checkpoint
  (the same GGUF) in the same process, when torch is importable (run under `.cbvenv`): prefill
  tokens/s of `--prompts` prompts of `--prompt-len` tokens (ours: `rlpure.model.prefill`;
  torch: one cached forward), sampling and decode tokens/s of `--samples` samples × `--new-tokens`
  tokens each (ours: the sampling client, one prefill per prompt; torch: `generate` with its
  KV cache, `num_return_sequences`; decode = sample − prefill), and LoRA forward+backward
  tokens/s of the `prompts × samples` datums of `prompt-len + new-tokens` tokens under the
  importance-sampling sum loss (ours: `forward_backward` of a rank-`--rank` LoRA client;
  torch: hand-written rank-`--rank` adapters on the same matrices, autograd on them only).
  Ours and torch alternate stage by stage over `--rounds` rounds after a warm-up round, with a
  2048³ `jnp.matmul` each round; it prints the ratios ours/PyTorch, the achieved GFLOP/s of
  each against the matmul (`_model_flops` counts the matrix multiplies), the JAX device,
  torch's thread count (`torch.set_num_threads(cores)`) and the peak RSS of each phase.
  `--prompts 2 --samples 2 --prompt-len 16 --new-tokens 16 --rounds 1` is a quick run.
- `grpo`: one GRPO step's LoRA `forward_backward` on `--prompts` prompts × `--samples`
  completions (`--grpo-prompt-len` + `--grpo-new-tokens` tokens, default 16 × 8 of 128 + 32;
  `--grpo-completions 1..32` draws each completion's length uniformly instead) of `--model`:
  the prefix-shared route (each prompt computed once; the layout the client picks, tries or
  prefix and suffix rows, printed) against the unshared route
  (`prefix_sharing_fraction = 0`) and PyTorch (as in `model`, on the datums right-padded with
  advantage 0), alternating; it prints the positions the shared route computes against the
  unique tokens, unique tokens/s (each prompt and completion counted once), the ratios, and
  the FLOP rate against the matmul measured in the same run.

Run: `.venv/bin/python benchmarks/bench_local_model.py --sections toy-train toy-sample`
or, with torch, `.cbvenv/bin/python benchmarks/bench_local_model.py --sections model`.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import math
import os
import resource
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from rlpure_launch import ALLOCATOR_ENVIRON, start_with_allocator_environ

if __name__ == "__main__":  # restart as `rlpure` runs (rlpure_launch), before JAX is imported
    start_with_allocator_environ()  # RLPURE_MALLOC=default: glibc's defaults

import jax  # after the restart, so imported once
import jax.numpy as jnp
import numpy as np
from tinker import types

from rlpure import model as model_lib
from rlpure.packing import GroupedPlan, plan_grouped_chunks, prefix_tree_size
from shell.local import LocalServiceClient
from shell.local._inputs import (
    check_data,
    length_bucket,
    loss_config_key,
    plan_prefix_chunks,
    prefix_key_weight,
    row_bucket,
)
from shell.local._models import resolve_base_model
from shell.local._train_steps import (
    CHUNKS_PER_CALL,
    loss_and_logprob_grad,
    model_backward,
    model_forward_vjp,
    zeros_like_tree,
)
from shell.timing import matmul_seconds

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


class _RssWatch:
    """Samples this process's resident memory (`/proc/self/status`) every 50 ms, per phase."""

    def __init__(self) -> None:
        self.phase = "load"
        self.peak_gb: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def rss_gb() -> float:
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1e6
        except OSError:
            pass
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            rss = self.rss_gb()
            self.peak_gb[self.phase] = max(self.peak_gb.get(self.phase, 0.0), rss)

    def set(self, phase: str) -> None:
        self.phase = phase
        print(
            f"  [{time.strftime('%H:%M:%S')}] {phase}: RSS now {self.rss_gb():.1f} GB", flush=True
        )

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        return self.peak_gb


def _lora_matrices(config: model_lib.ModelConfig) -> list[tuple[int, int]]:
    """(fan_in, fan_out) of every matrix `create_lora_training_client` adapts by default."""
    e, q, kv, f = (
        config.d_model,
        config.n_heads * config.head_dim,
        config.kv_heads * config.head_dim,
        config.d_ff,
    )
    per_layer = [(e, q), (e, kv), (e, kv), (q, e), (e, f), (e, f), (f, e)]
    return per_layer * config.n_layers + [(e, config.vocab_size)]


def _model_flops(
    config: model_lib.ModelConfig, rank: int, rows: int, width: int
) -> dict[str, float]:
    """Matrix-multiply FLOPs of one forward, and of a LoRA forward+backward, over `rows × width`.

    Forward: `2·I·O` per token per base matrix (the unembedding included), plus causal
    attention `2·2·H·C·(t+1)` at position `t`, plus LoRA `2·R·(I+O)` per adapted matrix.
    LoRA backward: the activation gradient costs what the forward costs (`2·I·O` per frozen
    matrix, twice the attention), the adapters `2·` their forward (gradients of A, B and of the
    input); frozen weights get no gradient (this is why LoRA training is ~2×, not 3×, a forward).
    """
    mats = _lora_matrices(config)
    base = sum(2 * i * o for i, o in mats)
    adapters = sum(2 * rank * (i + o) for i, o in mats)
    positions = rows * width
    attn = config.n_layers * 4 * config.n_heads * config.head_dim * rows * width * (width + 1) / 2
    forward = base * positions + attn
    lora_fwd = adapters * positions
    return {
        "forward": forward,
        "train": 2 * base * positions + 3 * attn + 3 * lora_fwd,
    }


def _grouped_flops(config: model_lib.ModelConfig, rank: int, plan: GroupedPlan) -> float:
    """`_model_flops`' LoRA forward+backward FLOPs of the grouped route's executed rows: the
    prefix rows (causal over `S`), then the suffix rows (causal over their own `U` keys) plus
    their reads of all `S` prefix keys."""
    n = len(plan.chunks)
    prefix = _model_flops(config, rank, n * plan.prefix_rows, plan.prefix_width)["train"]
    suffix = _model_flops(config, rank, n * plan.datums, plan.suffix_width)["train"]
    per_key = config.n_layers * 4 * config.n_heads * config.head_dim
    return prefix + suffix + 3 * per_key * n * plan.datums * plan.suffix_width * plan.prefix_width


def _sampling_flops(
    config: model_lib.ModelConfig, prompts: int, samples: int, prompt_len: int, new_tokens: int
) -> float:
    """Matrix-multiply FLOPs of sampling `samples` completions of `new_tokens` tokens from each
    of `prompts` prompts of `prompt_len` tokens: one forward of each prompt (`_model_flops`),
    then per new token `2·I·O` per matrix (the unembedding included) and attention over the
    `t + 1` positions so far, `2·2·H·C·(t+1)` at position `t`."""
    prefill = _model_flops(config, 0, prompts, prompt_len)["forward"]
    base = sum(2 * i * o for i, o in _lora_matrices(config))
    positions = sum(prompt_len + i + 1 for i in range(new_tokens))  # attended, per row
    attn = config.n_layers * 4 * config.n_heads * config.head_dim * positions
    return prefill + prompts * samples * (base * new_tokens + attn)


class _TorchLora:
    """Hand-written LoRA for the PyTorch baseline (no peft here): `base(x) + s·(x A) B` on the
    matrices ours adapts (attention q/k/v/o, MLP gate/up/down, the unembedding), frozen base,
    `A ~ U(±1/√fan_in)`, `B = 0`, `s = α / R` with `α = 32` (as `rlpure.model.LoraConfig`)."""

    def __init__(self, model: Any, rank: int) -> None:
        import torch

        self.torch = torch
        self.enabled = True
        self.params: list[Any] = []
        gen = torch.Generator().manual_seed(0)
        for p in model.parameters():
            p.requires_grad_(False)
        owner = self
        scale = 32.0 / rank

        class Wrapped(torch.nn.Module):  # type: ignore[misc]
            def __init__(self, base: Any) -> None:
                super().__init__()
                self.base = base
                bound = 1.0 / math.sqrt(base.in_features)
                a = torch.empty(base.in_features, rank).uniform_(-bound, bound, generator=gen)
                self.a = torch.nn.Parameter(a)
                self.b = torch.nn.Parameter(torch.zeros(rank, base.out_features))
                owner.params += [self.a, self.b]

            def forward(self, x: Any) -> Any:
                y = self.base(x)
                return y + scale * ((x @ self.a) @ self.b) if owner.enabled else y

        for layer in model.model.layers:
            for holder, names in (
                (layer.self_attn, ("q_proj", "k_proj", "v_proj", "o_proj")),
                (layer.mlp, ("gate_proj", "up_proj", "down_proj")),
            ):
                for name in names:
                    setattr(holder, name, Wrapped(getattr(holder, name)))
        model.lm_head = Wrapped(model.lm_head)


def _torch_model(source: str, kind: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    path = Path(source)
    if kind == "gguf":
        model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        )
    else:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    return model.eval()  # type: ignore[no-untyped-call]


def _torch_baseline(
    args: argparse.Namespace,
    *,
    cores: int,
    rows_per_chunk: int,
    prompts_P_T: np.ndarray,
    tokens_D_W: np.ndarray,
    advantages_D_W: np.ndarray,
    old_lp: float,
) -> tuple[dict[str, Callable[[], Any]], str]:
    """The PyTorch side: `transformers` on the same checkpoint, same batch, same loss form."""
    if args.no_torch or importlib.util.find_spec("torch") is None:
        return {}, "torch not importable (run under .cbvenv): no PyTorch baseline"
    import torch

    torch.set_num_threads(cores)
    g, m = args.samples, args.new_tokens
    resolved = resolve_base_model(args.model)
    tmodel = _torch_model(resolved.source, resolved.kind)
    lora = _TorchLora(tmodel, args.rank)
    torch_rows = min(rows_per_chunk, args.torch_train_rows)
    torch_note = (
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, "
        f"training {torch_rows} rows per backward call"
    )
    ids_P_T = torch.tensor(prompts_P_T)
    ids_D_W = torch.tensor(tokens_D_W[:, :-1])
    tgt_D_W = torch.tensor(tokens_D_W[:, 1:])
    adv_D_W = torch.tensor(advantages_D_W)

    def torch_prefill() -> Any:
        lora.enabled = False  # B = 0: the sampler's merged weights are the base
        with torch.no_grad():
            return tmodel(input_ids=ids_P_T, use_cache=True, logits_to_keep=1).logits

    def torch_sample() -> Any:
        lora.enabled = False
        torch.manual_seed(0)
        with torch.no_grad():
            return tmodel.generate(
                input_ids=ids_P_T,
                attention_mask=torch.ones_like(ids_P_T),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=m,
                min_new_tokens=m,
                num_return_sequences=g,
                pad_token_id=0,
            )

    def torch_train() -> Any:
        lora.enabled = True
        for q in lora.params:
            q.grad = None
        for start in range(0, ids_D_W.shape[0], torch_rows):
            part = slice(start, start + torch_rows)
            logits = tmodel(input_ids=ids_D_W[part]).logits
            lp = torch.log_softmax(logits, -1).gather(-1, tgt_D_W[part, :, None])[..., 0]
            loss = -(torch.exp(lp - old_lp) * adv_D_W[part]).sum()
            loss.backward()
        return lora.params[0].grad

    fns = {"prefill": torch_prefill, "sample": torch_sample, "train": torch_train}
    return fns, torch_note


def bench_model(args: argparse.Namespace) -> None:
    """Prefill, decode and LoRA training of ours against `transformers` PyTorch, alternating."""
    watch = _RssWatch()
    cores = len(os.sched_getaffinity(0))
    service = LocalServiceClient(seed=0)
    trainer = service.create_lora_training_client(args.model, rank=args.rank).result()
    config, base = trainer.config, trainer.base_params
    assert base is not None
    n_params = model_lib.count_params(base)
    sampler = trainer.save_weights_and_get_sampling_client().result()
    rng = np.random.default_rng(0)
    vocab = config.vocab_size
    p, g, t, m = args.prompts, args.samples, args.prompt_len, args.new_tokens
    prompts_P_T = rng.integers(0, vocab, (p, t))
    params = types.SamplingParams(max_tokens=m, temperature=1.0, stop=[])
    width = t + m
    tokens_D_W = rng.integers(0, vocab, (p * g, width + 1))
    advantages_D_W = rng.normal(size=(p * g, width)).astype(np.float32)
    old_lp = -11.0  # about log(1 / V): ratios near 1, as on-policy
    data = [
        types.Datum(
            model_input=types.ModelInput.from_ints(row[:-1].tolist()),
            loss_fn_inputs={
                "target_tokens": types.TensorData.from_numpy(row[1:].astype(np.int64)),
                "logprobs": types.TensorData.from_numpy(np.full(width, old_lp, np.float32)),
                "advantages": types.TensorData.from_numpy(adv),
            },
        )
        for row, adv in zip(tokens_D_W, advantages_D_W, strict=True)
    ]
    rows_per_chunk = trainer._runtime.training_rows(config, length_bucket(width))

    def ours_prefill() -> Any:
        return model_lib.prefill(
            sampler._params,
            jnp.asarray(prompts_P_T, jnp.int32),
            jnp.full((p,), t, jnp.int32),
            config=config,
            cache_len=t + m,
        ).logits_B_V

    def ours_sample() -> Any:
        async def go() -> Any:
            return await asyncio.gather(
                *[
                    sampler.sample_async(types.ModelInput.from_ints(row.tolist()), g, params)
                    for row in prompts_P_T
                ]
            )

        return asyncio.run(go())

    def ours_train() -> Any:
        trainer.forward_backward(data, "importance_sampling").result()
        grads = trainer._grads
        trainer._grads = None  # keep the adapters fixed: time forward_backward alone
        return grads

    watch.set("torch load")
    torch_fns, torch_note = _torch_baseline(
        args,
        cores=cores,
        rows_per_chunk=rows_per_chunk,
        prompts_P_T=prompts_P_T,
        tokens_D_W=tokens_D_W,
        advantages_D_W=advantages_D_W,
        old_lp=old_lp,
    )
    ours_fns = {"prefill": ours_prefill, "sample": ours_sample, "train": ours_train}
    times: dict[str, dict[str, list[float]]] = {"ours": {}, "torch": {}}
    first: dict[str, float] = {}
    matmul_s: list[float] = []
    stages = [s for s in ("prefill", "sample", "train") if s in args.stages]
    for round_ in range(args.rounds + 1):  # round 0 is the warm-up (compile), not counted
        for stage in stages:
            for who, fns in (("ours", ours_fns), ("torch", torch_fns)):
                if stage not in fns:
                    continue
                watch.set(f"{who} {stage}")
                start = time.perf_counter()
                jax.block_until_ready(fns[stage]())  # type: ignore[no-untyped-call]
                seconds = time.perf_counter() - start
                if round_ == 0:
                    first[f"{who} {stage}"] = seconds
                else:
                    times[who].setdefault(stage, []).append(seconds)
        watch.set("matmul")
        matmul_s.append(matmul_seconds())
    peaks = watch.stop()

    peak = 2 * 2048**3 / min(matmul_s) / 1e9
    flops_prefill = _model_flops(config, args.rank, p, t)["forward"]
    flops_sample = _sampling_flops(config, p, g, t, m)
    flops_train = _model_flops(config, args.rank, p * g, width)["train"]
    gen_tokens = p * g * m
    print(
        f"model {args.model}: {n_params / 1e6:.1f}M params, JAX device {jax.devices()[0]} "
        f"({jax.default_backend()}), {cores} cores; {torch_note}"
    )
    print(
        f"  GRPO batch: {p} prompts × {g} samples, {t} prompt + {m} sampled tokens; LoRA rank "
        f"{args.rank}; training {len(data)} datums × {width} tokens, {rows_per_chunk} rows per "
        f"chunk, up to {CHUNKS_PER_CALL} chunks per jitted call; best of {args.rounds} "
        "alternating rounds (round 0 = warm-up)"
    )
    print(f"  jnp.matmul 2048³: {peak:.1f} GFLOP/s (best of the rounds)")
    # glibc's allocator settings move both sides' times (benchmarks/README.md, "Local backend speed"): say which ran.
    print(f"  GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '(unset)')}")
    print(
        "  first call (compile included): " + ", ".join(f"{k} {v:.1f}s" for k, v in first.items())
    )

    def best(who: str, stage: str) -> float | None:
        values = times[who].get(stage)
        return min(values) if values else None

    rates: dict[str, dict[str, float]] = {"ours": {}, "torch": {}}
    for who in ("ours", "torch"):
        pre, smp, trn = best(who, "prefill"), best(who, "sample"), best(who, "train")
        if pre is not None:
            rates[who]["prefill tokens/s"] = p * t / pre
        if smp is not None:
            rates[who]["sample tokens/s"] = gen_tokens / smp
            if pre is not None and smp > pre:
                rates[who]["decode tokens/s"] = gen_tokens / (smp - pre)
        if trn is not None:
            rates[who]["LoRA fwd+bwd tokens/s"] = len(data) * width / trn
    for who in ("ours", "torch"):
        if not rates[who]:
            continue
        line = ", ".join(f"{k} {v:,.1f}" for k, v in rates[who].items())
        print(f"  {who}: {line}")
        runs = "; ".join(
            f"{stage} " + "/".join(f"{s:.2f}" for s in values) + "s"
            for stage, values in times[who].items()
        )
        print(f"    seconds per round: {runs}")
    for key in rates["ours"]:
        if key in rates["torch"]:
            print(f"  ratio ours/PyTorch, {key}: {rates['ours'][key] / rates['torch'][key]:.2f}")
    for who in ("ours", "torch"):
        pre, smp, trn = best(who, "prefill"), best(who, "sample"), best(who, "train")
        parts = []
        if pre is not None:
            gf = flops_prefill / pre / 1e9
            parts.append(f"prefill {gf:.1f} GFLOP/s = {gf / peak:.0%}")
        if smp is not None:  # prefill included, as the sample stage times it
            gf = flops_sample / smp / 1e9
            parts.append(f"sampling {gf:.1f} GFLOP/s = {gf / peak:.0%}")
        if trn is not None:
            gf = flops_train / trn / 1e9
            parts.append(f"LoRA fwd+bwd {gf:.1f} GFLOP/s = {gf / peak:.0%}")
        if parts:
            print(f"  {who} vs the JAX matmul: " + ", ".join(parts))
    print("  peak RSS by phase (GB): " + ", ".join(f"{k} {v:.1f}" for k, v in peaks.items()))


def _grpo_batch(
    args: argparse.Namespace, vocab: int, old_lp: float
) -> tuple[list[types.Datum], np.ndarray, np.ndarray]:
    """The `grpo` section's batch: `--prompts` prompts of `--grpo-prompt-len` tokens, each with
    `--samples` completions of `--grpo-new-tokens` (or of lengths drawn uniformly from
    `--grpo-completions LO..HI`); advantages per completion, 0 on the prompt. Returns the datums
    and, for PyTorch, their tokens `[D, W + 1]` and advantages `[D, W]`, right-padded (token
    0, advantage 0) to the longest."""
    rng = np.random.default_rng(0)
    p, g, t, m = args.prompts, args.samples, args.grpo_prompt_len, args.grpo_new_tokens
    low, high = _completion_range(args.grpo_completions, m)
    lengths_D = rng.integers(low, high + 1, p * g)
    prompts_P_T = rng.integers(0, vocab, (p, t))
    completions_D_M = rng.integers(0, vocab, (p * g, high))
    tokens_D_W = np.concatenate([np.repeat(prompts_P_T, g, axis=0), completions_D_M], axis=1)
    advantages_D_W = np.zeros((p * g, t + high - 1), np.float32)
    advantages_D_W[:, t - 1 :] = rng.normal(size=(p * g, 1))
    for d, n in enumerate(lengths_D):
        tokens_D_W[d, t + n :] = 0
        advantages_D_W[d, t + n - 1 :] = 0.0
    data = [
        types.Datum(
            model_input=types.ModelInput.from_ints(row[: t + n - 1].tolist()),
            loss_fn_inputs={
                "target_tokens": types.TensorData.from_numpy(row[1 : t + n].astype(np.int64)),
                "logprobs": types.TensorData.from_numpy(np.full(t + n - 1, old_lp, np.float32)),
                "advantages": types.TensorData.from_numpy(adv[: t + n - 1]),
            },
        )
        for row, adv, n in zip(tokens_D_W, advantages_D_W, lengths_D, strict=True)
    ]
    return data, tokens_D_W, advantages_D_W


def _completion_range(spec: str | None, fixed: int) -> tuple[int, int]:
    """`--grpo-completions`: `LO..HI` as `(LO, HI)`, or `(fixed, fixed)` when not given."""
    if spec is None:
        return fixed, fixed
    low, sep, high = spec.partition("..")
    if not sep or not low.isdigit() or not high.isdigit() or not 1 <= int(low) <= int(high):
        raise SystemExit(f"--grpo-completions: expected LO..HI with 1 <= LO <= HI, got {spec!r}")
    return int(low), int(high)


def bench_grpo(args: argparse.Namespace) -> None:
    """One GRPO step's LoRA `forward_backward`: prefix-shared against unshared against PyTorch.

    The three alternate over `--rounds` rounds after a warm-up round, with a 2048³ matmul each
    round. Rates are per unique token (the batch's trie nodes: each prompt once, each
    completion once), so the shared route's rate is what a GRPO step costs per token that
    differs; the matmul fraction counts the FLOPs of the unshared batch (the same work done
    once per datum), and for the shared route also those of the rows it executes.
    """
    cores = len(os.sched_getaffinity(0))
    service = LocalServiceClient(seed=0)
    trainer = service.create_lora_training_client(args.model, rank=args.rank).result()
    config = trainer.config
    old_lp = -11.0
    data, tokens_D_W, advantages_D_W = _grpo_batch(args, config.vocab_size, old_lp)
    checked = check_data(data, "importance_sampling", config)
    width = int(checked.length_D.max())
    rows_for_width = partial(trainer._runtime.training_rows, config)
    plan = plan_prefix_chunks(checked.tokens_D, rows_for_width=rows_for_width)
    assert plan is not None, "the grpo batch shares too little for the prefix-shared route"
    grouped = plan_grouped_chunks(
        checked.tokens_D,
        positions_for_keys=partial(trainer._runtime.training_positions, config),
        key_weight=prefix_key_weight(config),
    )
    assert grouped is not None
    takes_groups = isinstance(trainer._packed_groups(checked)[0][0].prefix, model_lib.GroupedRows)
    unique, total = prefix_tree_size(checked.tokens_D), int(checked.length_D.sum())

    def ours(fraction: float) -> Callable[[], Any]:
        def run() -> Any:
            trainer.prefix_sharing_fraction = fraction
            trainer.forward_backward(data, "importance_sampling").result()
            grads = trainer._grads
            trainer._grads = None  # keep the adapters fixed: time forward_backward alone
            return grads

        return run

    fns: dict[str, Callable[[], Any]] = {"shared": ours(1.0), "unshared": ours(0.0)}
    torch_fns, torch_note = _torch_baseline(
        args,
        cores=cores,
        rows_per_chunk=rows_for_width(length_bucket(width)),
        prompts_P_T=tokens_D_W[:: args.samples, : args.grpo_prompt_len],
        tokens_D_W=tokens_D_W,
        advantages_D_W=advantages_D_W,
        old_lp=old_lp,
    )
    if "train" in torch_fns:
        fns["PyTorch"] = torch_fns["train"]
    times: dict[str, list[float]] = {name: [] for name in fns}
    first: dict[str, float] = {}
    matmul_s = []
    for round_ in range(args.rounds + 1):  # round 0 is the warm-up (compile), not counted
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn())  # type: ignore[no-untyped-call]
            seconds = time.perf_counter() - start
            if round_ == 0:
                first[name] = seconds
            else:
                times[name].append(seconds)
            print(
                f"  [{time.strftime('%H:%M:%S')}] round {round_} {name}: {seconds:.1f}s", flush=True
            )
        matmul_s.append(matmul_seconds())
    peak = 2 * 2048**3 / min(matmul_s) / 1e9
    work = _model_flops(config, args.rank, len(data), width)["train"]
    if takes_groups:
        executed = _grouped_flops(config, args.rank, grouped)
        computed = grouped.positions
        layout = (
            f"grouped, {len(grouped.chunks)} chunks of {grouped.prefix_rows} prefix rows × "
            f"{grouped.prefix_width} + {grouped.datums} suffix rows × {grouped.suffix_width}"
        )
    else:
        executed = _model_flops(config, args.rank, plan.rows * len(plan.chunks), plan.width)[
            "train"
        ]
        computed = len(plan.chunks) * plan.rows * plan.width
        layout = (
            f"tries, {len(plan.chunks)} chunks of {plan.rows} rows × {plan.width} "
            f"({plan.nodes:,} nodes), {plan.datums} datum rows × {plan.length}"
        )
    print(
        f"grpo: {args.model}, LoRA rank {args.rank}, {args.prompts} prompts × {args.samples} "
        f"samples, {args.grpo_prompt_len}-token prompts, "
        f"{args.grpo_completions or args.grpo_new_tokens}-token "
        f"completions: {len(data)} datums of {width} tokens = {total:,} tokens, {unique:,} unique "
        f"({total / unique:.2f}×); JAX {jax.default_backend()}, {cores} cores; {torch_note}"
    )
    print(
        f"  shared route ({layout}); best of {args.rounds} alternating rounds (round 0 = warm-up)"
    )
    print(
        f"  computed positions: {computed:,} = {computed / unique:.2f}× the {unique:,} unique "
        f"tokens (completions {args.grpo_completions or args.grpo_new_tokens})"
    )
    print(f"  jnp.matmul 2048³: {peak:.1f} GFLOP/s (best of the rounds)")
    print(
        "  first call (compile included): " + ", ".join(f"{k} {v:.1f}s" for k, v in first.items())
    )
    best = {name: min(values) for name, values in times.items() if values}
    for name, seconds in best.items():
        gf = work / seconds / 1e9
        extra = ""
        if name == "shared":
            ex = executed / seconds / 1e9
            extra = f"; executed rows {ex:.1f} GFLOP/s = {ex / peak:.0%}"
        print(
            f"  {name}: {seconds:.2f}s, {unique / seconds:,.1f} unique tokens/s "
            f"({total / seconds:,.1f} datum tokens/s); the unshared work at {gf:.1f} GFLOP/s = "
            f"{gf / peak:.0%} of the matmul{extra}"
        )
        print("    seconds per round: " + "/".join(f"{s:.2f}" for s in times[name]))
    for name in best:
        if name != "shared":
            print(f"  ratio shared / {name} (per unique token): {best[name] / best['shared']:.2f}×")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--sections", nargs="+", default=["toy-train", "toy-sample", "model", "grpo"]
    )
    parser.add_argument("--datums", type=int, default=80)
    parser.add_argument("--min-len", type=int, default=100)
    parser.add_argument("--max-len", type=int, default=1000)
    parser.add_argument("--prompt-len-toy", type=int, default=1900)
    parser.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds after the warm-up")
    parser.add_argument("--stages", nargs="+", default=["prefill", "sample", "train"])
    parser.add_argument("--torch-train-rows", type=int, default=16)
    parser.add_argument("--grpo-prompt-len", type=int, default=128)
    parser.add_argument("--grpo-new-tokens", type=int, default=32)
    parser.add_argument(
        "--grpo-completions",
        metavar="LO..HI",
        help="grpo: completion lengths drawn uniformly from LO..HI (default all --grpo-new-tokens)",
    )
    parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch baseline")
    args = parser.parse_args()
    malloc = " ".join(f"{name}={os.environ.get(name, '(unset)')}" for name in ALLOCATOR_ENVIRON)
    print(f"JAX {jax.__version__}, device {jax.devices()[0]}; glibc malloc: {malloc}")
    for section in args.sections:
        {
            "toy-train": bench_toy_train,
            "toy-sample": bench_toy_sample,
            "model": bench_model,
            "grpo": bench_grpo,
        }[section](args)


if __name__ == "__main__":
    main()
