"""The local backend's sampling client: `sample` and `compute_logprobs` on fixed weights.

Conventions:
- A `sample` call is validated at submission into a `_SampleRequest` (prompt `[T]`, one row of
  key material per sample `[N, K]`, stop conditions), then served: at once outside a running
  event loop, or queued on a `TickBatcher` and served with the other requests of the same
  tick inside one. Rows (one per sample) are padded to power-of-two buckets (rows, prompt
  length, new tokens, stop sequences and their window) and served in order, in chunks of at
  most the runtime's `sampling_rows(...)` rows; a request's samples may span chunks. Within a
  chunk the rows of one prompt share one prefill (`P` distinct prompts, padded to a power of
  two), whether they are the samples of one request or of several requests with the same
  tokens (the cookbook's rollouts send one request per sample of a group): laid out as a
  grid of `P` prompts × `Y = B / P` samples (`SampleBatch.rows_per_prompt`, each prompt's
  cache then read once per decode step for its samples) when no prompt has more than `Y`
  rows in the chunk, else flat (`prompt_index_B`). Prompts that begin alike (a system prompt,
  few-shot examples) have their common prefix computed once when that halves the prefill's
  positions (`shared_prefix_plan`, `rlpure.model.prefill_shared_prefix`). A request's logits
  depend on its batch in their last bits (the layout, grid or flat, the padded row count and
  a shared prefix each change XLA's summation order; logprobs about 1e-6 apart), so a request
  batched with others may, rarely, draw another token than it would alone at a near tie.
- Each request is checked when it is submitted, so a bad one fails alone and never the
  batch it would have joined.
- Random streams: a sample's key material is `(seed, 0, 0, 0, 0, i)` when
  `SamplingParams.seed` is set, else `(service seed, *stream, r, i)`, where `r` counts this
  client's requests, `i` is the sample's index and `stream` is given by the factory that made
  the client. It never depends on the batch, so batching does not change a sample's
  randomness (only the last bits of the logits it is drawn from, above).
- Returned logprobs are the sampled tokens' log-probabilities under the tempered
  distribution `log_softmax(logits / temperature)` (float32; untempered at temperature 0),
  as Tinker's sampler reports them; `compute_logprobs` and prompt logprobs reuse the training
  forward's buckets (`shell.local._train_steps.model_forward_vjp`).
- Stop conditions: `None` is EOS (the byte tokenizer's, or a pretrained tokenizer's
  `eos_token_id`); `[]` is none at all; token ids or strings stop there and at EOS. Stop
  strings are matched, as on Tinker, on the completion's decoded text (prompt excluded;
  special tokens written out; no clean-up of tokenization spaces), however the model spelled
  them: the completion ends with the token that completes the first one
  (`rlpure.model.stop_string_end`, on the host after each sampling call). Inside the jitted
  loop a row also stops early when it emits a stop string's own encoding (its UTF-8 bytes
  for the byte tokenizer, `encode(s, add_special_tokens=False)` otherwise), which is where
  the text check would cut it too; a string spelled with other tokens lets the row run on,
  and the extra tokens are dropped.
- The client reads the seed, the memory budget and the request counter from the
  `LocalRuntime` its factory passes in (`shell.local._runtime`), never from the service.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import jax
import msgspec
import numpy as np
import tinker
from tinker import types
from tinker.types.topk_logprobs import MASK_LOGPROB, TopkLogprobs

from rlpure import model as model_lib
from rlpure.model import ByteTokenizer
from rlpure.packing import plan_grouped_chunks
from shell.errors import ContextLengthError
from shell.local._futures import Batched
from shell.local._inputs import (
    PREFIX_SHARING_FRACTION,
    CheckedData,
    call_groups,
    check_token_range,
    dense_from_csr,
    length_bucket,
    model_input_tokens,
    pack_grouped_chunks,
    prefix_key_weight,
    row_bucket,
    to_float,
)
from shell.local._runtime import LoadedModel, LocalRuntime
from shell.local._train_steps import (
    CHUNKS_PER_CALL,
    lora_logprobs,
    model_forward_vjp,
    stacked,
    stacked_model_inputs,
)

if TYPE_CHECKING:
    from shell.local._runtime import Tokenizer

__all__ = ["LocalSamplingClient", "sampler_params", "score_sequences", "shared_prefix_plan"]

_UINT32 = 1 << 32
# The last key word of a request's prompt alt-token draws, where its samples have their index
# (0, 1, …): no request has 2^32 − 1 samples, so the draws never reuse a sample's stream.
_ALT_TOKENS_TAG = _UINT32 - 1
MOST_ALT_TOKENS = 4096
"""Most `prompt_alt_tokens_k` draws a position (with replacement, so more than the vocabulary
is meaningful; each is a binary search over the position's cumulative mass, and the call's
outputs grow as `T · k`)."""
_Item = TypeVar("_Item")  # what a scoring chunk's rows stand for (a request, a sample's index)


class _SampleRequest(msgspec.Struct, frozen=True, kw_only=True, eq=False):
    """One validated `sample` call: its prompt and per-row settings, before batching.

    `key_material_U_K`: uint32 `[U, K]`, the PRNG key words of each of the request's `U =
    num_samples` rows (`U`, samples of one request, is a letter of this module's own; `K` key
    words, as in `rlpure.model`'s sampler).
    """

    prompt_T: np.ndarray
    num_samples: int
    max_new_tokens: int
    temperature: float
    top_k: int
    top_p: float
    key_material_U_K: np.ndarray
    stop_token_ids: tuple[int, ...]
    stop_strings: tuple[str, ...]
    stop_sequences: tuple[tuple[int, ...], ...]  # the stop strings' encodings
    include_prompt_logprobs: bool
    prompt_logprobs_last_n: int | None  # score only the last N prompt tokens (earlier: NaN)
    topk_prompt_logprobs: int  # the k most likely tokens at each prompt position (0: none)
    topk_sample_logprobs: int  # the k most likely tokens at each sampled position (0: none)
    prompt_alt_tokens_k: int  # draws at each prompt position (0: none)
    alt_key_material_K: np.ndarray  # uint32 key words of those draws
    target_ids_I_K: np.ndarray | None  # ids to score after prompt[: i + 1] (-1: none)
    target_csr: tuple[tuple[int, ...], tuple[int, ...]] | None  # their request's CSR layout
    request_index: int


_merge_lora = jax.jit(model_lib.merge_lora, static_argnames=("config", "lora"))


def sampler_params(
    model: LoadedModel, params: model_lib.Params, lora: model_lib.LoraConfig | None
) -> model_lib.Params:
    """The weights a sampler of a training client's `params` samples from: `params` themselves
    for a toy model (full fine-tuning), the base weights with the LoRA adapters `params`
    merged in (`W + (α / R) A B`, once per sampler) otherwise."""
    if lora is None:
        return params
    assert model.params is not None
    merged: model_lib.Params = _merge_lora(model.params, params, config=model.config, lora=lora)
    return merged


def _whole_number(value: object, least: int, most: int, name: str) -> int:
    """`value` checked at submission: a whole number in `[least, most]` (`2.0` is 2, as the
    SDK's request model makes it), so a bad value fails its own request and never the batch it
    would join.

    Examples:
        >>> _whole_number(2.0, 1, 4, "sample.k"), _whole_number(4, 1, 4, "sample.k")
        (2, 4)
        >>> _whole_number(2.5, 1, 4, "sample.k")
        Traceback (most recent call last):
        ...
        ValueError: sample.k: expected a whole number in [1, 4], got 2.5
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not float(value).is_integer()
        or not least <= value <= most
    ):
        raise ValueError(f"{name}: expected a whole number in [{least}, {most}], got {value!r}")
    return int(value)


def _last_n(value: object, n: int, where: str) -> int | None:
    """`prompt_logprobs_last_n` of an `n`-token prompt: None, or a whole number in
    `[1, n − 1]` (`_whole_number`)."""
    if value is None:
        return None
    return _whole_number(value, 1, n - 1, f"{where}.prompt_logprobs_last_n")


def _target_ids(
    tensor: types.TensorData, n: int, vocab_size: int
) -> tuple[np.ndarray, tuple[tuple[int, ...], tuple[int, ...]] | None]:
    """`target_prompt_logprobs` of an `n`-token prompt checked at submission: (int32 ids
    `[n − 1, K]`, −1 where nothing is asked; the CSR row pointers and column indices when it
    came sparse, else None).

    Raises:
        TypeError, ValueError: naming what is wrong (dtype, shape, an id outside the vocabulary).
    """
    where = "sample.target_prompt_logprobs"
    if not isinstance(tensor, types.TensorData):
        raise TypeError(f"{where}: expected tinker.TensorData, got {type(tensor).__name__}")
    if tensor.dtype != "int64":
        raise TypeError(f"{where}: expected int64 token ids, got dtype {tensor.dtype}")
    shape = tuple(tensor.shape or ())
    if n < 2 or len(shape) != 2 or shape[0] != n - 1 or shape[1] < 1:
        raise ValueError(
            f"{where}: expected shape [len(prompt) - 1, K] = [{n - 1}, K >= 1], got {list(shape)}"
        )
    values = np.asarray(tensor.data, np.int64).reshape(-1)
    csr = None
    if tensor.sparse_crow_indices is not None:
        crow = np.asarray(tensor.sparse_crow_indices, np.int64)
        col = np.asarray(tensor.sparse_col_indices or [], np.int64)
        ids = dense_from_csr(values, crow, col, shape, fill=-1, where=where)
        csr = (tuple(crow.tolist()), tuple(col.tolist()))
    elif values.size == shape[0] * shape[1]:
        ids = values.reshape(shape)
    else:
        raise ValueError(f"{where}: {values.size} values for shape {list(shape)}")
    bad = (ids < -1) | (ids >= vocab_size)
    if bad.any():
        i, j = (int(x) for x in np.argwhere(bad)[0])
        raise ValueError(
            f"{where}: id {int(ids[i, j])} at [{i}, {j}] is outside [-1, {vocab_size})"
        )
    return ids.astype(np.int32), csr


def _like_request(
    values_I_K: np.ndarray, csr: tuple[tuple[int, ...], tuple[int, ...]] | None
) -> types.TensorData:
    """float32 `values_I_K` in the request's layout: dense, or CSR with its indices."""
    if csr is None:
        return types.TensorData.from_numpy(values_I_K)
    crow, col = np.asarray(csr[0]), np.asarray(csr[1])
    rows = np.repeat(np.arange(values_I_K.shape[0]), np.diff(crow))
    return types.TensorData(
        data=values_I_K[rows, col].tolist(),
        dtype="float32",
        shape=list(values_I_K.shape),
        sparse_crow_indices=list(csr[0]),
        sparse_col_indices=list(csr[1]),
    )


class LocalSamplingClient:
    """Samples from a fixed snapshot of weights (the SDK's `SamplingClient`).

    Create it with `LocalTrainingClient.save_weights_and_get_sampling_client()` or
    `LocalServiceClient.create_sampling_client(...)`.
    """

    def __init__(
        self,
        *,
        runtime: LocalRuntime,
        base_model: str,
        config: model_lib.ModelConfig,
        params: model_lib.Params,
        stream: tuple[int, int, int] = (2, 0, 0),
        model: LoadedModel,
    ) -> None:
        """Internal: use the factory methods. `runtime` is the service's shared state;
        `stream` names this client's random stream (see "Random streams" in this module's
        docstring); `params` are the weights sampled from (base with adapters merged, see
        `sampler_params`); `model` is the resolved base model (tokenizer, EOS ids)."""
        self._runtime = runtime
        self._base_model = base_model
        self._config = config
        self._params = params
        self._stream = stream
        self._requests = 0
        self._model = model
        self._tokenizer = model.tokenizer
        self._samples = Batched(self._run_requests)
        self._scores = Batched(self._run_logprob_requests)

    # -- SDK surface --

    def get_tokenizer(self) -> Tokenizer:
        """`ByteTokenizer` for a toy model, the checkpoint's `PreTrainedTokenizerFast` else."""
        return self._tokenizer

    def get_base_model(self) -> str:
        return self._base_model

    async def get_base_model_async(self) -> str:
        return self._base_model

    def sample(
        self,
        prompt: types.ModelInput,
        num_samples: int,
        sampling_params: types.SamplingParams,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        topk_sample_logprobs: int = 0,
        target_prompt_logprobs: types.TensorData | None = None,
        prompt_alt_tokens_k: int = 0,
        prompt_logprobs_last_n: int | None = None,
        *,
        request_number: int | None = None,
    ) -> tinker.APIFuture[types.SampleResponse]:
        """Draws `num_samples` completions of `prompt` (see the module docstring for semantics).

        `request_number` (a local extension of the SDK's signature) keys an unseeded request's
        randomness by that number instead of by its position among this client's requests:
        `rlpure serve` passes the SDK's `seq_id`, which the SDK numbers in call order as this
        client counts, so concurrent requests draw what they would in-process whatever order
        they arrive in.

        Returns:
            An `APIFuture[tinker.SampleResponse]`; each `SampledSequence` carries int tokens,
            float32 tempered logprobs and `stop_reason` `"stop"` or `"length"`.

        Raises:
            TypeError, ValueError: bad prompt, count or sampling parameters (raised here, at
                submission).

        `topk_prompt_logprobs=k` adds the `k` most likely tokens at each prompt position with
        their logprobs (`SampleResponse.topk_prompt_logprobs`: None at position 0 and, with
        `prompt_logprobs_last_n`, before the last N), most likely first.
        `target_prompt_logprobs` (int64 ids `[len(prompt) − 1, K]`, −1 for none, dense or
        sparse CSR) adds the logprob of each id after `prompt[: i + 1]`, in the same layout.
        `topk_sample_logprobs=k` adds to each sequence the `k` most likely tokens at each
        sampled position with their logprobs under the request's temperature, the distribution
        its `logprobs` are reported under (`SampledSequence.topk_logprobs`), from a forward
        pass over prompt and completion: a sampled token among them has its reported logprob
        to float32 rounding (about 1e-5; more on a bfloat16 model, whose forward and cached
        decode round differently). `prompt_alt_tokens_k=k` adds `k` independent
        draws at the request's temperature (greedy at 0) after each `prompt[: i + 1]`, with
        their tempered logprobs (`SampleResponse.prompt_alt_tokens`, `[len(prompt) − 1, k]`),
        reproducible with `SamplingParams.seed` and drawn from a stream of their own (the
        samples are what they would be without them).
        """
        request = self._make_request(
            prompt,
            num_samples,
            sampling_params,
            include_prompt_logprobs=include_prompt_logprobs,
            prompt_logprobs_last_n=prompt_logprobs_last_n,
            topk_prompt_logprobs=topk_prompt_logprobs,
            topk_sample_logprobs=topk_sample_logprobs,
            target_prompt_logprobs=target_prompt_logprobs,
            prompt_alt_tokens_k=prompt_alt_tokens_k,
            request_number=request_number,
        )
        return self._samples.submit(request)

    async def sample_async(
        self,
        prompt: types.ModelInput,
        num_samples: int,
        sampling_params: types.SamplingParams,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        topk_sample_logprobs: int = 0,
        target_prompt_logprobs: types.TensorData | None = None,
        prompt_alt_tokens_k: int = 0,
        prompt_logprobs_last_n: int | None = None,
    ) -> types.SampleResponse:
        """`await sample(...)` (the SDK's deprecated async form; returns the response)."""
        return await self.sample(
            prompt,
            num_samples,
            sampling_params,
            include_prompt_logprobs,
            topk_prompt_logprobs,
            topk_sample_logprobs,
            target_prompt_logprobs,
            prompt_alt_tokens_k,
            prompt_logprobs_last_n,
        ).result_async()

    def compute_logprobs(
        self, prompt: types.ModelInput, prompt_logprobs_last_n: int | None = None
    ) -> tinker.APIFuture[list[float | None]]:
        """Logprob of every prompt token given the ones before it (`None` for the first)."""
        tokens = model_input_tokens(prompt, "compute_logprobs.prompt")
        check_token_range(tokens, self._config.vocab_size, "compute_logprobs.prompt")
        if tokens.size > self._config.max_seq_len:
            raise ValueError(
                f"compute_logprobs.prompt: length {tokens.size} exceeds max_seq_len "
                f"{self._config.max_seq_len}"
            )
        if tokens.size == 0:  # Tinker scores a prompt as a one-token sample request of it
            raise ValueError("compute_logprobs.prompt: empty prompt")
        last_n = _last_n(prompt_logprobs_last_n, int(tokens.size), "compute_logprobs")
        # the SDK sends compute_logprobs as a one-token sample request: count it as one, so the
        # unseeded samples after it draw what they draw through `rlpure serve`
        self._runtime.next_sample_request_index()
        self._requests += 1
        return self._scores.submit((tokens, last_n))

    def _run_logprob_requests(
        self, requests: list[tuple[np.ndarray, int | None]]
    ) -> list[list[float | None]]:
        """Serves `compute_logprobs` requests `(tokens, prompt_logprobs_last_n)` together
        (`_prompt_logprobs_many`)."""
        scored = self._prompt_logprobs_many([tokens for tokens, _ in requests])
        responses = []
        for (tokens, last_n), values in zip(requests, scored, strict=True):
            out: list[float | None] = [None if math.isnan(x) else float(x) for x in values]
            if last_n is not None:
                skipped: list[float | None] = [None] * (tokens.size - last_n)
                out = skipped + out[tokens.size - last_n :]
            responses.append(out)
        return responses

    async def compute_logprobs_async(
        self, prompt: types.ModelInput, prompt_logprobs_last_n: int | None = None
    ) -> list[float | None]:
        return await self.compute_logprobs(prompt, prompt_logprobs_last_n).result_async()

    # -- internals --

    def _make_request(
        self,
        prompt: Any,
        num_samples: Any,
        params: Any,
        *,
        include_prompt_logprobs: bool,
        prompt_logprobs_last_n: int | None = None,
        topk_prompt_logprobs: int = 0,
        topk_sample_logprobs: int = 0,
        target_prompt_logprobs: types.TensorData | None = None,
        prompt_alt_tokens_k: int = 0,
        request_number: int | None = None,
    ) -> _SampleRequest:
        config = self._config
        tokens = model_input_tokens(prompt, "sample.prompt")
        if tokens.size == 0:
            raise ValueError("sample.prompt: empty prompt")
        if prompt_logprobs_last_n is not None and not include_prompt_logprobs:
            raise ValueError("sample.prompt_logprobs_last_n: requires include_prompt_logprobs")
        prompt_logprobs_last_n = _last_n(prompt_logprobs_last_n, int(tokens.size), "sample")
        k = _whole_number(topk_prompt_logprobs, 0, config.vocab_size, "sample.topk_prompt_logprobs")
        k_sampled = _whole_number(
            topk_sample_logprobs, 0, config.vocab_size, "sample.topk_sample_logprobs"
        )
        k_alt = _whole_number(prompt_alt_tokens_k, 0, MOST_ALT_TOKENS, "sample.prompt_alt_tokens_k")
        targets = None
        if target_prompt_logprobs is not None:
            targets = _target_ids(target_prompt_logprobs, int(tokens.size), config.vocab_size)
        check_token_range(tokens, config.vocab_size, "sample.prompt")
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"sample.num_samples: expected an int >= 1, got {num_samples!r}")
        if not isinstance(params, types.SamplingParams):
            raise TypeError(
                f"sample.sampling_params: expected tinker.SamplingParams, got "
                f"{type(params).__name__}"
            )
        room = config.max_seq_len - int(tokens.size)
        if params.max_tokens is None:
            max_new = room
        else:
            max_new = int(params.max_tokens)
            if max_new < 1:
                raise ValueError(f"SamplingParams.max_tokens: expected >= 1, got {max_new}")
        if max_new > room or room < 1:
            raise ContextLengthError(
                f"sample: prompt length {tokens.size} + max_tokens {max_new} exceeds the "
                f"model's context length {config.max_seq_len}; lower max_tokens or shorten the "
                "prompt"
            )
        temperature = to_float(params.temperature, "SamplingParams.temperature")
        if temperature < 0:
            raise ValueError(f"SamplingParams.temperature: expected >= 0, got {temperature}")
        top_p = to_float(params.top_p, "SamplingParams.top_p")
        if not 0 < top_p <= 1:
            raise ValueError(f"SamplingParams.top_p: expected in (0, 1], got {top_p}")
        # `≤ 0` keeps every token and `≥ V` keeps them all too: clamped, any int fits the batch's int32
        top_k = min(max(int(params.top_k), 0), config.vocab_size)
        stop_ids, stop_strings, stop_seqs = self._stop_conditions(params.stop)
        request_index = self._runtime.next_sample_request_index()
        if params.seed is not None:
            material = (int(params.seed), 0, 0, 0, 0)
        else:
            number = self._requests if request_number is None else request_number
            material = (self._runtime.seed, *self._stream, number)
        self._requests += 1
        key_material = np.array(
            [[m % _UINT32 for m in material] + [i] for i in range(num_samples)], np.uint32
        )
        return _SampleRequest(
            prompt_T=tokens.astype(np.int32),
            num_samples=num_samples,
            max_new_tokens=max_new,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            key_material_U_K=key_material,
            stop_token_ids=stop_ids,
            stop_strings=stop_strings,
            stop_sequences=stop_seqs,
            include_prompt_logprobs=bool(include_prompt_logprobs),
            prompt_logprobs_last_n=prompt_logprobs_last_n,
            topk_prompt_logprobs=k,
            topk_sample_logprobs=k_sampled,
            prompt_alt_tokens_k=k_alt,
            alt_key_material_K=np.array(
                [m % _UINT32 for m in (*material, _ALT_TOKENS_TAG)], np.uint32
            ),
            target_ids_I_K=None if targets is None else targets[0],
            target_csr=None if targets is None else targets[1],
            request_index=request_index,
        )

    def _stop_conditions(
        self, stop: Any
    ) -> tuple[tuple[int, ...], tuple[str, ...], tuple[tuple[int, ...], ...]]:
        """(stop token ids, stop strings, the stop strings' encodings) of `SamplingParams.stop`."""
        eos = self._model.eos_token_ids
        if stop is None:
            return eos, (), ()
        if isinstance(stop, str):
            stop = [stop]
        stop = list(stop)
        if not stop:
            return (), (), ()
        if all(isinstance(s, str) for s in stop):
            if not all(stop):
                raise ValueError("SamplingParams.stop: empty stop string")
            return eos, tuple(stop), tuple(tuple(self._encode_stop(s)) for s in stop)
        if all(isinstance(s, int) and not isinstance(s, bool) for s in stop):
            ids = np.asarray(stop, np.int64)
            check_token_range(ids, self._config.vocab_size, "SamplingParams.stop")
            return tuple(sorted({*eos, *map(int, stop)})), (), ()
        raise TypeError("SamplingParams.stop: expected strings or token ids, not a mix")

    def _decode_completion(self, tokens: list[int]) -> str:
        """A completion's text as stop strings see it: special tokens written out, no clean-up
        of tokenization spaces (which would rewrite earlier text as tokens are appended)."""
        if isinstance(self._tokenizer, ByteTokenizer):
            return self._tokenizer.decode(tokens)
        return str(
            self._tokenizer.decode(
                tokens, skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
        )

    def _encode_stop(self, text: str) -> list[int]:
        """A stop string's tokens: its UTF-8 bytes for the byte tokenizer (even where it spells
        a special token's text), the tokenizer's encoding (no special tokens) otherwise."""
        if isinstance(self._tokenizer, ByteTokenizer):
            return list(
                self._tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
            )
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def _prompt_logprobs_many(self, sequences: list[np.ndarray]) -> list[np.ndarray]:
        """`_prompt_logprobs` of each sequence; a pretrained model scores them together, in
        as few jitted calls as the memory budget allows, their common prefixes computed once
        when that saves enough (`score_sequences`), where one call each padded a row bucket of
        8 for one sequence (64 GRPO sequences against a KL reference: 63 s)."""
        if not self._model.pretrained:
            return [self._prompt_logprobs(tokens) for tokens in sequences]
        out = [np.full(tokens.size, np.nan, np.float32) for tokens in sequences]
        scored = [i for i, tokens in enumerate(sequences) if tokens.size >= 2]
        if scored:
            values = score_sequences(
                self._params,
                [sequences[i] for i in scored],
                config=self._config,
                runtime=self._runtime,
            )
            for i, lp in zip(scored, values, strict=True):
                out[i][1:] = lp
        return out

    def _prompt_logprobs(self, tokens: np.ndarray) -> np.ndarray:
        """float32 `[N]`: NaN at 0, then `log p(tokens[i] | tokens[:i])` (the toy models' own
        path, one call per sequence: they keep the training forward's executable and rounding)."""
        n = int(tokens.size)
        out = np.full(n, np.nan, np.float32)
        if n < 2:
            return out
        # The training forward's buckets for one datum (`plan_chunks`), so scoring shares its
        # compiled executable.
        width = length_bucket(n - 1)
        rows = min(self._runtime.training_rows(self._config, width), row_bucket(1))
        inputs = np.zeros((rows, width), np.int32)
        targets = np.zeros_like(inputs)
        inputs[0, : n - 1] = tokens[:-1]
        targets[0, : n - 1] = tokens[1:]
        if self._model.pretrained:  # forward only: the VJP's residuals are ~2 MB a token
            lp = model_lib.target_logprobs(self._params, inputs, targets, config=self._config)
        else:  # the toy models keep the training forward's executable (and its rounding)
            lp, _ = model_forward_vjp(self._params, inputs, targets, config=self._config)
        out[1:] = np.asarray(lp)[0, : n - 1]
        return out

    def _run_requests(self, requests: list[_SampleRequest]) -> list[types.SampleResponse]:
        """Serves `requests` with as few jitted calls as the memory limits allow.

        Rows (one per sample) are served in order, in chunks of at most `sampling_rows` rows;
        a request's samples may span chunks.
        """
        rows = [(r, i) for r in requests for i in range(r.num_samples)]
        prompt_width = row_bucket(max(r.prompt_T.size for r in requests), minimum=16)
        new_width = row_bucket(max(r.max_new_tokens for r in requests), minimum=16)
        per_chunk = self._runtime.sampling_rows(self._config, prompt_width, new_width)
        sequences: list[types.SampledSequence] = []
        for start in range(0, len(rows), per_chunk):
            sequences.extend(self._run_rows(rows[start : start + per_chunk]))
        sequences = self._with_sampled_topk(rows, sequences)
        responses = []
        start = 0
        scored = iter(
            self._prompt_logprobs_many([r.prompt_T for r in requests if r.include_prompt_logprobs])
        )
        topk = self._prompt_topk_many([r for r in requests if r.topk_prompt_logprobs])
        targeted = self._target_logprobs_many([r for r in requests if r.target_ids_I_K is not None])
        alternatives = self._prompt_alt_tokens_many([r for r in requests if r.prompt_alt_tokens_k])
        for r in requests:
            prompt_lp = next(scored) if r.include_prompt_logprobs else None
            if prompt_lp is not None and r.prompt_logprobs_last_n is not None:
                prompt_lp[: prompt_lp.size - r.prompt_logprobs_last_n] = np.nan
            responses.append(
                types.SampleResponse(
                    sequences=sequences[start : start + r.num_samples],
                    prompt_logprobs_np=prompt_lp,
                    topk_prompt_logprobs_np=topk.get(id(r)),
                    target_prompt_logprobs=targeted.get(id(r)),
                    prompt_alt_tokens=alternatives.get(id(r)),
                )
            )
            start += r.num_samples
        return responses

    def _scoring_chunks(
        self, items: list[tuple[_Item, np.ndarray]], k_of: Callable[[_Item], int]
    ) -> Iterator[tuple[int, list[_Item], np.ndarray]]:
        """`items` (each with its int32 tokens `[N]`, `N ≥ 2`) in chunks of one `k_of(item)` (a
        static shape of the call) and one length bucket: `(k, chunk, inputs)`, the int32
        `[rows, width]` inputs holding every item's tokens but the last, right-padded (rows of
        the training forward's memory budget)."""
        groups: dict[tuple[int, int], list[tuple[_Item, np.ndarray]]] = {}
        for item, tokens in items:
            width = length_bucket(max(int(tokens.size) - 1, 1))
            groups.setdefault((k_of(item), width), []).append((item, tokens))
        for (k, width), members in groups.items():
            per_call = self._runtime.training_rows(self._config, width)
            for start in range(0, len(members), per_call):
                chunk = members[start : start + per_call]
                inputs = np.zeros((row_bucket(len(chunk)), width), np.int32)
                for row, (_, tokens) in enumerate(chunk):
                    inputs[row, : tokens.size - 1] = tokens[:-1]
                yield k, [item for item, _ in chunk], inputs

    def _prompt_chunks(
        self, requests: list[_SampleRequest], k_of: Callable[[_SampleRequest], int]
    ) -> Iterator[tuple[int, list[_SampleRequest], np.ndarray]]:
        """`_scoring_chunks` of the requests' prompts."""
        return self._scoring_chunks([(r, r.prompt_T) for r in requests], k_of)

    def _with_sampled_topk(
        self, rows: list[tuple[_SampleRequest, int]], sequences: list[types.SampledSequence]
    ) -> list[types.SampledSequence]:
        """`sequences` (row `j` sampled for `rows[j]`), those of requests with
        `topk_sample_logprobs = k` carrying the `k` most likely tokens at each sampled position
        and their logprobs under the request's temperature (`topk_logprobs_np`, `[n, k]`, row
        `i` the distribution token `i` was drawn from): a forward pass over prompt and
        completion (`rlpure.model.topk_tempered_logprobs`), batched by `k` and length."""
        wanted = [j for j, (r, _) in enumerate(rows) if r.topk_sample_logprobs]
        if not wanted:
            return sequences
        out = list(sequences)
        items = [(j, np.concatenate([rows[j][0].prompt_T, sequences[j].tokens])) for j in wanted]
        for k, chunk, inputs in self._scoring_chunks(
            [(j, tokens.astype(np.int32)) for j, tokens in items],
            lambda j: rows[j][0].topk_sample_logprobs,
        ):
            temperature_B = np.ones(inputs.shape[0], np.float32)
            for row, j in enumerate(chunk):
                temperature_B[row] = rows[j][0].temperature or 1.0  # greedy: untempered
            ids_B_T_K, lp_B_T_K = (
                np.asarray(a)
                for a in model_lib.topk_tempered_logprobs(
                    self._params, inputs, temperature_B, k=k, config=self._config
                )
            )
            for row, j in enumerate(chunk):
                first, n = rows[j][0].prompt_T.size - 1, len(sequences[j].tokens)
                topk = TopkLogprobs(
                    token_ids=ids_B_T_K[row, first : first + n].copy(),
                    logprobs=lp_B_T_K[row, first : first + n].copy(),
                )
                out[j] = dataclasses.replace(sequences[j], topk_logprobs_np=topk)
        return out

    def _prompt_topk_many(self, requests: list[_SampleRequest]) -> dict[int, TopkLogprobs]:
        """Each request's top-k prompt logprobs, by `id(request)`: `[N, k]` token ids and
        logprobs, row `i ≥ 1` the `k` most likely tokens after `prompt[:i]`; row 0, and the
        rows before the last N with `prompt_logprobs_last_n`, the SDK's empty row (id 0,
        logprob −99999). Requests of one `k` and length bucket run as rows of one call."""
        out: dict[int, TopkLogprobs] = {}
        for k, chunk, inputs in self._prompt_chunks(requests, lambda r: r.topk_prompt_logprobs):
            ids_B_T_K, lp_B_T_K = model_lib.topk_logprobs(
                self._params, inputs, k=k, config=self._config
            )
            ids_B_T_K, lp_B_T_K = np.asarray(ids_B_T_K), np.asarray(lp_B_T_K)
            for row, r in enumerate(chunk):
                n = int(r.prompt_T.size)
                first = 1 if r.prompt_logprobs_last_n is None else n - r.prompt_logprobs_last_n
                ids = np.zeros((n, k), np.int32)
                lps = np.full((n, k), MASK_LOGPROB, np.float32)
                ids[first:] = ids_B_T_K[row, first - 1 : n - 1]
                lps[first:] = lp_B_T_K[row, first - 1 : n - 1]
                out[id(r)] = TopkLogprobs(token_ids=ids, logprobs=lps)
        return out

    def _prompt_alt_tokens_many(
        self, requests: list[_SampleRequest]
    ) -> dict[int, types.PromptAltTokens]:
        """Each request's `prompt_alt_tokens`, by `id(request)`: `k` draws at its temperature
        after each `prompt[: i + 1]` (int64 ids and float32 tempered logprobs, `[N − 1, k]`;
        `rlpure.model.prompt_alt_tokens`), keyed by the request's own key words; requests of
        one `k` and length bucket run as rows of one call."""
        out: dict[int, types.PromptAltTokens] = {}
        for r in requests:  # a one-token prompt has no position to draw at
            if r.prompt_T.size < 2:
                out[id(r)] = _alt_tokens(
                    np.zeros((0, r.prompt_alt_tokens_k)), np.zeros((0, r.prompt_alt_tokens_k))
                )
        chunks = self._prompt_chunks(
            [r for r in requests if r.prompt_T.size >= 2], lambda r: r.prompt_alt_tokens_k
        )
        for k, chunk, inputs in chunks:
            temperature_B = np.zeros(inputs.shape[0], np.float32)
            material_B_K = np.zeros((inputs.shape[0], chunk[0].alt_key_material_K.size), np.uint32)
            for row, r in enumerate(chunk):
                temperature_B[row], material_B_K[row] = r.temperature, r.alt_key_material_K
            ids_B_T_K, lp_B_T_K = (
                np.asarray(a)
                for a in model_lib.prompt_alt_tokens(
                    self._params, inputs, temperature_B, material_B_K, k=k, config=self._config
                )
            )
            for row, r in enumerate(chunk):
                n = r.prompt_T.size - 1
                out[id(r)] = _alt_tokens(ids_B_T_K[row, :n], lp_B_T_K[row, :n])
        return out

    def _target_logprobs_many(self, requests: list[_SampleRequest]) -> dict[int, types.TensorData]:
        """Each request's `target_prompt_logprobs`, by `id(request)`: float32 `[N − 1, K]`,
        cell `[i, j]` the logprob of id `[i, j]` after `prompt[: i + 1]`, 0.0 where the id is
        −1; sparse CSR with the request's own indices when it came sparse."""
        out: dict[int, types.TensorData] = {}
        targeted = [(r, r.target_ids_I_K) for r in requests if r.target_ids_I_K is not None]
        ids_of = {id(r): ids_I_K for r, ids_I_K in targeted}
        chunks = self._prompt_chunks([r for r, _ in targeted], lambda r: ids_of[id(r)].shape[1])
        for k, chunk, inputs in chunks:
            ids_B_T_K = np.zeros((*inputs.shape, k), np.int32)
            for row, r in enumerate(chunk):
                ids_B_T_K[row, : r.prompt_T.size - 1] = ids_of[id(r)]
            lp_B_T_K = np.asarray(
                model_lib.ids_logprobs(self._params, inputs, ids_B_T_K, config=self._config)
            )
            for row, r in enumerate(chunk):
                ids_I_K = ids_of[id(r)]
                lp_I_K = np.where(ids_I_K >= 0, lp_B_T_K[row, : ids_I_K.shape[0]], 0.0)
                out[id(r)] = _like_request(lp_I_K.astype(np.float32), r.target_csr)
        return out

    def _run_rows(self, rows: list[tuple[_SampleRequest, int]]) -> list[types.SampledSequence]:
        """One jitted `sample_tokens` call for `rows` (request, sample index), padded to buckets."""
        batch, slot_of_row = _sample_batch(rows, vocab_size=self._config.vocab_size)
        m = row_bucket(max(r.max_new_tokens for r, _ in rows), minimum=16)
        out = model_lib.sample_tokens(self._params, batch, config=self._config, max_new_tokens=m)
        return self._sampled_sequences(rows, slot_of_row, out)

    def _sampled_sequences(
        self,
        rows: list[tuple[_SampleRequest, int]],
        slot_of_row: list[int],
        out: model_lib.SampleOutput,
    ) -> list[types.SampledSequence]:
        """The SDK's sequences of `rows` (row `k` at batch row `slot_of_row[k]`) from
        `sample_tokens`' output, cut at stop strings."""
        tokens_B_M = np.asarray(out.tokens_B_M)
        logprobs_B_M = np.asarray(out.logprobs_B_M)
        num_B = np.asarray(out.num_tokens_B)
        stopped_B = np.asarray(out.stopped_B)
        sequences = []
        for row, (r, i) in zip(slot_of_row, rows, strict=True):
            n, stopped = int(num_B[row]), bool(stopped_B[row])
            if r.stop_strings:  # cut at the first stop string of the decoded text
                end = model_lib.stop_string_end(
                    tokens_B_M[row, :n].tolist(), r.stop_strings, self._decode_completion
                )
                if end is not None:
                    n, stopped = end, True
            sequences.append(
                types.SampledSequence(
                    stop_reason="stop" if stopped else "length",
                    sequence_id=f"local-{r.request_index}-{i}",
                    tokens_np=tokens_B_M[row, :n].copy(),
                    logprobs_np=logprobs_B_M[row, :n].copy(),
                )
            )
        return sequences


def score_sequences(
    params: model_lib.Params,
    sequences: list[np.ndarray],
    *,
    config: model_lib.ModelConfig,
    runtime: LocalRuntime,
) -> list[np.ndarray]:
    """float32 `[N − 1]` per sequence (each `N ≥ 2` tokens): `log p(tokens[i] | tokens[:i])`
    for `i ≥ 1`, under `params` alone (a sampler's weights).

    The sequences are scored as datums of the training `forward`: grouped by shared prefixes,
    each prefix computed once (`plan_grouped_chunks`), when that computes at most
    `PREFIX_SHARING_FRACTION` of their tokens, else right-padded rows of the memory budget
    (`plan_chunks`); chunks of one shape loop in one jitted call (`lora_logprobs` without
    adapters). The same values as one sequence at a time up to float32 reassociation.
    """
    checked = CheckedData(
        tokens_D=tuple(tokens[:-1].astype(np.int64) for tokens in sequences),
        inputs_D=tuple({"target_tokens": tokens[1:].astype(np.int64)} for tokens in sequences),
        keys=("target_tokens",),
    )
    grouped = plan_grouped_chunks(
        checked.tokens_D,
        positions_for_keys=partial(runtime.training_positions, config),
        key_weight=prefix_key_weight(config),
    )
    packs = None  # the grouped chunks when they share enough, else rows (`call_groups`)
    if grouped is not None and grouped.positions <= PREFIX_SHARING_FRACTION * int(
        checked.length_D.sum()
    ):
        packs = pack_grouped_chunks(checked, grouped)
    calls = call_groups(
        checked,
        packs,
        rows_for_width=partial(runtime.training_rows, config),
        per_call=CHUNKS_PER_CALL,
    )
    out: list[np.ndarray] = [np.empty(0, np.float32)] * len(sequences)
    for call in calls:
        lp_X_D_T = np.asarray(
            lora_logprobs(
                None,
                params,
                stacked_model_inputs(call),
                stacked([packed.inputs["target_tokens"] for packed in call]),
                np.int32(len(call)),
                config=config,
                lora=None,
            ),
            np.float32,
        )
        for x, packed in enumerate(call):
            for row, (d, n) in enumerate(zip(packed.index_D, packed.length_D, strict=True)):
                out[d] = lp_X_D_T[x, row, :n].copy()
    return out


def _alt_tokens(ids_I_K: np.ndarray, lp_I_K: np.ndarray) -> types.PromptAltTokens:
    """The SDK's `PromptAltTokens` of int ids and float logprobs `[N − 1, k]`."""
    return types.PromptAltTokens(
        tokens=types.TensorData.from_numpy(ids_I_K.astype(np.int64)),
        logprobs=types.TensorData.from_numpy(lp_I_K.astype(np.float32)),
    )


def _sample_batch(
    rows: list[tuple[_SampleRequest, int]], *, vocab_size: int
) -> tuple[model_lib.SampleBatch, list[int]]:
    """The padded `SampleBatch` of `rows` (request, sample index), `B`, `P`, `T`, `Q`, `W`
    bucketed, and the batch row of each of `rows`.

    One prefill per distinct prompt: the rows of every request with the same prompt tokens
    share it (a GRPO group sent as one request per sample, as the cookbook's rollouts send it,
    is prefilled once, not once per sample). The rows are bucketed (`B`, a power of two) and
    so are the prompts (`P`); when some prompt has several rows and none more than `Y = B /
    P`, rows go on a grid of `P` prompts × `Y` rows (`rows_per_prompt = Y`, a function of the
    two buckets, so no new compile: each prompt's cache is read once per decode step for its
    rows); otherwise they are laid out flat in order, each copying its prompt's cache
    (`prompt_index_B`).
    """
    requests = [r for r, _ in rows]
    prompt_of_row: list[int] = []
    sample_of_row: list[int] = []
    prompts: list[np.ndarray] = []
    index_of_prompt: dict[bytes, int] = {}  # the tokens (int32) of each distinct prompt
    rows_of_prompt: list[int] = []
    for r, _ in rows:
        q = index_of_prompt.setdefault(r.prompt_T.tobytes(), len(prompts))
        if q == len(prompts):
            prompts.append(r.prompt_T)
            rows_of_prompt.append(0)
        prompt_of_row.append(q)
        sample_of_row.append(rows_of_prompt[q])
        rows_of_prompt[q] += 1
    b = row_bucket(len(rows))
    # prompt rows bucket from 1: the prefill's cost is per prompt row (quadratic in `T`)
    p = min(b, row_bucket(len(prompts), minimum=1))
    y = b // p  # both powers of two: the grid keeps the flat bucket's row count
    grid = 1 < max(sample_of_row) + 1 <= y
    if grid:
        slot_of_row = [q * y + k for q, k in zip(prompt_of_row, sample_of_row, strict=True)]
    else:
        slot_of_row = list(range(len(rows)))
    t = row_bucket(max(r.prompt_T.size for r in requests), minimum=16)
    prompt_P_T = np.zeros((p, t), np.int32)
    length_P = np.ones(p, np.int32)
    for index, prompt in enumerate(prompts):
        prompt_P_T[index, : prompt.size] = prompt
        length_P[index] = prompt.size
    prompt_index_B = np.zeros(b, np.int32)
    prompt_index_B[: len(rows)] = prompt_of_row
    plan = shared_prefix_plan(prompts, t=t, p=p)
    return model_lib.SampleBatch(
        prompt_tokens_B_T=prompt_P_T,
        prompt_length_B=length_P,
        prompt_index_B=None if grid else prompt_index_B,
        rows_per_prompt=y if grid else 1,
        shared_prefix_length=None if plan is None else np.asarray(plan[0], np.int32),
        prefix_widths=(0, 0) if plan is None else plan[1:],
        **_row_fields(rows, slot_of_row, b=b, vocab_size=vocab_size),
    ), slot_of_row


def shared_prefix_plan(prompts: list[np.ndarray], *, t: int, p: int) -> tuple[int, int, int] | None:
    """`(shared, S, U)` for prefilling `prompts`' common first tokens once
    (`rlpure.model.prefill_shared_prefix`: a prefix row of `S` positions and `p` suffix rows of
    `U`), or None when that would not halve the prefill's `p · t` positions.

    `shared` is the prompts' longest common prefix, short of the shortest prompt's last token
    (each prompt keeps at least one token of its own) and shortened until `shared + U ≤ t`;
    `S` and `U` are power-of-two buckets (from 16), so a new prefix length of the same buckets
    reuses the compile.

    Examples:
        >>> system = np.arange(100)
        >>> questions = [np.r_[system, np.arange(1 + i % 3) + 200 * i] for i in range(8)]
        >>> shared_prefix_plan(questions, t=128, p=8)
        (100, 128, 16)
        >>> shared_prefix_plan(questions[:2], t=128, p=2) is None  # 160 of 256 positions
        True
        >>> shared_prefix_plan([np.arange(5), np.arange(6)], t=16, p=2) is None  # too short
        True
    """
    if len(prompts) < 2:
        return None
    shared = min(x.size for x in prompts) - 1
    for x in prompts[1:]:
        differ = np.flatnonzero(prompts[0][:shared] != x[:shared])
        if differ.size:
            shared = int(differ[0])
    longest = max(x.size for x in prompts)
    u = t
    while shared >= 1:
        u = row_bucket(longest - shared, minimum=16)
        if shared + u <= t:
            break
        shared = t - u
    if shared < 1:
        return None
    s = row_bucket(shared, minimum=16)
    if 2 * (s + p * u) > p * t:
        return None
    return shared, s, u


def _row_fields(
    rows: list[tuple[_SampleRequest, int]], slot_of_row: list[int], *, b: int, vocab_size: int
) -> dict[str, Any]:
    """The per-row `SampleBatch` fields of `rows` at their batch rows `slot_of_row` (`b` rows;
    the others pad: no new tokens, greedy, no stops)."""
    requests = [r for r, _ in rows]
    n_seqs = row_bucket(max(len(r.stop_sequences) for r in requests), minimum=4)
    window = row_bucket(max([1, *(len(s) for r in requests for s in r.stop_sequences)]), minimum=8)
    max_new_B = np.zeros(b, np.int32)
    temperature_B = np.zeros(b, np.float32)
    top_k_B = np.zeros(b, np.int32)
    top_p_B = np.ones(b, np.float32)
    key_material_B_K = np.zeros((b, requests[0].key_material_U_K.shape[1]), np.uint32)
    stop_mask_B_V = np.zeros((b, vocab_size), bool)
    stop_seqs_B_Q_W = np.full((b, n_seqs, window), -1, np.int32)
    stop_valid_B_Q = np.zeros((b, n_seqs), bool)
    for row, (r, i) in zip(slot_of_row, rows, strict=True):
        max_new_B[row] = r.max_new_tokens
        temperature_B[row] = r.temperature
        top_k_B[row] = r.top_k
        top_p_B[row] = r.top_p
        key_material_B_K[row] = r.key_material_U_K[i]
        stop_mask_B_V[row, list(r.stop_token_ids)] = True
        for s, seq in enumerate(r.stop_sequences):
            stop_seqs_B_Q_W[row, s, window - len(seq) :] = seq
            stop_valid_B_Q[row, s] = True
    return {
        "max_new_tokens_B": max_new_B,
        "temperature_B": temperature_B,
        "top_k_B": top_k_B,
        "top_p_B": top_p_B,
        "key_material_B_K": key_material_B_K,
        "stop_token_mask_B_V": stop_mask_B_V,
        "stop_seqs_B_Q_W": stop_seqs_B_Q_W,
        "stop_seq_valid_B_Q": stop_valid_B_Q,
    }
