"""A local, offline stand-in for the Tinker service: the SDK's clients over `rlpure.model`.

Swap `tinker.ServiceClient()` for `LocalServiceClient(seed=...)` and Tinker code runs on the CPU
with a small JAX transformer, deterministically, with no API key. The clients accept and return
the real `tinker` types (`ModelInput`, `Datum`, `TensorData`, `SamplingParams`, `AdamParams`,
`SampleResponse`, `ForwardBackwardOutput`, `OptimStepResponse`, ...), with the SDK 0.38.0
method names, signatures and return conventions:

- `forward_backward`, `optim_step`, `sample`, `save_state`, ... return an `APIFuture`
  (a `tinker.APIFuture`: `await f`, `await f.result_async()`, `f.result()`, `f.future()`).
  The deprecated `*_async` variants are `async def`s that return what the SDK's do:
  `await forward_backward_async(...)` gives the `APIFuture`; `await sample_async(...)` gives
  the `SampleResponse`; `await create_lora_training_client_async(...)` gives the client.
- `create_lora_training_client`, `create_sampling_client` and
  `save_weights_and_get_sampling_client` return a future of the client that can be awaited,
  `.result()`-ed, or (deprecated, as in the SDK) used as the client directly.

Standing in for `tinker.ServiceClient`: `LocalServiceClient` takes every keyword of the SDK's
constructor (`user_metadata`, `project_id`, `display_name` kept; `base_url`, `api_key`,
`default_headers_overrides` accepted and ignored: nothing is contacted), then its own options
(`seed`, `checkpoint_dir`, `temporary_checkpoints`, ...); an unknown keyword is a `TypeError`
(the SDK only warns). It is a context manager, and `create_rest_client()` answers the REST calls
of the cookbook's `checkpoint_utils` (run metadata for the renderer-name check on resume,
deleting rolling checkpoints) and lists runs and checkpoints (`list_training_runs`,
`list_user_checkpoints`). So the cookbook's `rl.train.main` runs unchanged with
`tinker.ServiceClient = LocalServiceClient`, and resumes in another process with no extra
argument (checkpoints are durable by default, below); to keep them elsewhere, bind a directory:
`tinker.ServiceClient = functools.partial(LocalServiceClient, checkpoint_dir=...)`. The training
client factories take one local extension, `training_run_id=` (keyword-only), for a host that
names its runs (`rlpure serve`: `{session_id}:train:{n}`, as Tinker).

Semantics and decisions:
- **Models.** `base_model` is resolved once per service (`shell.local._models.
  resolve_base_model`): a config of `rlpure.model.MODEL_CONFIGS` (`"rlpure/tiny"`,
  `"rlpure/small"`) or of the service's `model_configs` is a *toy* model; a local Hugging Face
  checkpoint directory or `.gguf` file, `"HuggingFaceTB/SmolLM2-135M-Instruct"` (the packaged
  GGUF) or a repo id in the offline Hugging Face cache is a *pretrained* one (Llama, Qwen2,
  Qwen3); anything else is a `ConfigError` listing what is available. Pretrained weights are
  read once per service and shared by every client; `get_tokenizer()` returns the checkpoint's
  `transformers` fast tokenizer (toy models: the byte tokenizer).
- **LoRA for pretrained models, full fine-tuning for toy ones.** A pretrained model trains
  adapters of `rank` on the matrices `train_attn`/`train_mlp`/`train_unembed` name
  (`rlpure.model.LoraConfig`: Tinker's `α / R` scaling, `α = 32`; `B = 0`, so step 0 is the
  base model; drawn from `seed`); gradients, Adam state and `save_state` hold adapters only
  (the checkpoint records the base model and refuses another), and samplers sample base +
  adapters (merged once per sampler). A toy model trains every weight (`rank` and the flags
  are recorded only); it has no pretrained weights: its *base model* is
  `init_params(key(service seed))` and, as LoRA clients on Tinker all start from the same base
  function, every training client and `create_sampling_client(base_model=...)` of the service
  starts from those weights, unless `seed` is passed to `create_lora_training_client` (then
  `init_params(key(seed))`); checkpoints carry their own config.
- **Training ops run eagerly, in call order**, when called (the SDK orders them by request id
  on the server; here the order of calls is the order of execution). Gradients of the summed
  loss accumulate across `forward_backward` calls until `optim_step` applies them (AdamW,
  `torch.optim.AdamW` semantics, global-norm clipping first; see `rlpure.model`).
- **Losses** are `rlpure.losses.compute_loss`: `cross_entropy`, `importance_sampling`, `ppo`,
  `cispo`, `dro`, `gspo`. `loss_fn_config` values are static under `jit` (a new value
  recompiles). Unknown `loss_fn_inputs` keys are refused with an error naming the datum and key:
  the cookbook's `mask` key is not a Tinker input (its RL loop strips it, `_remove_mask`,
  before `forward_backward`), so sending it is a bug we surface rather than ignore.
- **Sampling** returns each sampled token's logprob under the tempered distribution it was
  drawn from, as Tinker does (at temperature 1 this is what training computes: on-policy
  ratios are 1 to ~1e-6). `temperature=0` is greedy; `top_k`/`top_p` are
  honoured. `stop`: `None` stops at EOS; `[]` disables every stop, EOS included (Tinker's
  documented rule); a non-empty list of token ids or strings stops at those *and* at EOS. Stop
  strings match the generated tokens (their UTF-8 bytes for the byte tokenizer, their
  encoding for a pretrained tokenizer), never across the prompt boundary. The samples of one
  request share one prefill of its prompt. The stop token or string is included in the returned tokens, as
  on Tinker. `max_tokens=None` means "until the context (`max_seq_len`) is full".
- **Batching**: inside a running event loop, `sample` requests are queued and served together:
  the queue is flushed once an event-loop tick passes with no new request, so the
  `asyncio.gather` of 32 prompts × 8 samples becomes one jitted call (or a few, at most
  `max_batch_rows` rows each). The flush runs on the event loop thread, so batch composition
  depends only on the order coroutines run, never on wall time: runs are reproducible. Outside a
  running loop, `sample` computes at once. `future.result()` on a queued request flushes the
  queue immediately instead of deadlocking.
- **Determinism**: same service seed and same sequence of calls ⇒ identical tokens, logprobs
  and weights, and a run resumed from `save_state` (same seed) continues exactly as the
  uninterrupted run would have. A sample's randomness depends only on its key material, never
  on its batch: `SamplingParams.seed=s` keys sample `i` with `(s, 0, 0, 0, 0, i)`; otherwise
  request `r` of a sampling client uses `(service seed, *stream, r, i)` where the client's
  `stream` is `(1, optimizer steps so far, index of the sampling client since that step)` for
  `save_weights_and_get_sampling_client` (the step count is checkpointed) and
  `(2, index among the service's create_sampling_client calls, 0)` otherwise. Sampling
  clients of different training clients at the same step share streams (their weights
  differ). The batch does change the last bits of the sampled tokens' logprobs (~1e-6: a
  matmul of another row count rounds differently), so through `rlpure serve`, where request
  timing decides which requests share a call, logprobs agree to ~1e-6 and tokens exactly.
- **Shapes are bucketed** (powers of two on batch rows, prompt length, new tokens and datums;
  two sizes per doubling on datum length), so a run compiles a handful of times. A
  `forward_backward` batch runs longest datums first, each chunk padded to its own length. Large calls are split to bound memory
  (`max_batch_tokens` for sampling, `max_train_tokens` for `forward_backward`, whose chunks'
  gradients add up and whose metrics merge by their `:sum`/`:mean`/`:min`/`:max` suffix).
- **Checkpoints never expire**: `ttl_seconds` is accepted and ignored; the REST client's
  `delete_checkpoint_from_tinker_path` removes one (only a real local checkpoint directory).
- **Checkpoints** (`save_state`, `save_weights_for_sampler`) are directories holding
  `arrays.npz` (loaded with `allow_pickle=False`) and `manifest.json`; the returned path is the
  directory's absolute filesystem path, accepted by `load_state`,
  `create_training_client_from_state[_with_optimizer]` and `create_sampling_client`. As in the
  SDK, `load_state` restores weights only and `load_state_with_optimizer` weights and Adam
  state. They live under `checkpoint_dir / <training run id> / <state|sampler> / <name>`.
  The default `checkpoint_dir` is the user's durable store,
  `shell.data_dir.default_checkpoint_dir()` (`$RLPURE_HOME/checkpoints`, else
  `$XDG_DATA_HOME/rlpure/checkpoints`, else `~/.local/share/rlpure/checkpoints`), shared by every
  process of the user and by `rlpure serve`; `temporary_checkpoints=True` gives a fresh
  temporary directory instead, removed at exit.
- **Training runs** own a folder of the checkpoint directory each, claimed atomically when the
  training client is made (`local-{seed}-{index}`, or the host's `training_run_id`), so
  processes sharing the directory never share a run id; its `run.json` (base model, rank,
  LoRA or not, `user_metadata`, creation time) makes a run with no checkpoint yet known to
  every process's REST client.
- Clients are not thread-safe: use them from one thread (typically the event loop's).
- Custom losses run in this process, as the SDK runs them client-side
  (`forward_backward_custom`, `create_custom_loss`; `_custom_loss`), with torch.
- Not supported (raise `NotImplementedError`): losses uploaded to a server
  (`loss_fn="custom"`), non-Adam optimizers, multimodal chunks.

Layout (this module is the public entry point; import the clients from here, the private
modules are its parts):
- `_service`: `LocalServiceClient`, the model configs and the client factories;
- `_runtime`: `LocalRuntime`, what the service shares with its clients (seed, model configs,
  memory budgets, checkpoint paths, the training runs opened and their `run.json`, the
  sample-request counter);
- `_training`: `LocalTrainingClient`;
- `_custom_loss`: `forward_backward_custom`'s surrogate datums, torch run and metrics;
- `_sampling`: `LocalSamplingClient`, its request validation and batching;
- `_rest`: `LocalRestClient` (training runs and checkpoints, read from `run.json` and the
  checkpoint files) and `LocalLookupError`;
- `_train_steps`: the jitted forward/backward stages and the merging of chunk metrics;
- `_inputs`: validation of Tinker inputs and packing of datums into bucketed arrays;
- `_checkpoints`: the checkpoint directory format;
- `_futures`: `ReadyFuture`, the client futures and the per-tick batcher.
"""

from __future__ import annotations

from shell.local._rest import LocalLookupError, LocalRestClient
from shell.local._sampling import LocalSamplingClient
from shell.local._service import LocalServiceClient
from shell.local._training import LocalTrainingClient

__all__ = [
    "LocalLookupError",
    "LocalRestClient",
    "LocalSamplingClient",
    "LocalServiceClient",
    "LocalTrainingClient",
]
