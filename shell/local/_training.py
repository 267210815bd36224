"""The local backend's training client: forward/backward, AdamW steps, weights and checkpoints.

Conventions:
- Toy models (`rlpure/tiny`, ...) train in full: every weight trains, the LoRA `rank` is
  recorded for `get_info` only. Pretrained models (resolved by `shell.local._models`) train
  LoRA adapters (`rlpure.model.LoraConfig`: Tinker's `α / R` scaling with `α = 32`, `B = 0` at
  init so step 0 is the base model) on the service's frozen base weights, shared by every
  client: gradients, Adam state and `save_state` hold the adapters only; samplers get the base
  with the adapters merged in. Every loss keeps Tinker's sum reduction either way.
- Operations run eagerly, in call order, and return a `ReadyFuture`. Gradients of the summed
  loss accumulate across `forward_backward` calls until `optim_step` applies them (AdamW with
  global-norm clipping, `rlpure.model.apply_adam_update`) and clears them; a call refused by
  validation accumulates nothing.
- A `forward_backward` batch is split into chunks (`shell.local._inputs.plan_chunks`): datums
  sorted longest first, each chunk at most the runtime's `training_rows(width)` datums (a
  memory bound) padded to its own length bucket, so short datums never pay a long one's
  quadratic attention and no call runs on padding rows alone. Their gradients add up and their
  metrics merge by suffix, so chunking does not change the result beyond float rounding.
- Datums of one call that share token prefixes (a GRPO group's prompt, a multi-turn episode's
  history) take the prefix-shared route when it saves enough (`prefix_sharing_fraction`), in
  one of two layouts (`prefix_route`): token tries packed as rows (`plan_prefix_chunks`) or
  groups, a prefix row per shared prefix and a suffix row per datum reading it
  (`plan_grouped_chunks`). The model computes each shared prefix once and every datum
  gathers its logprobs back, so losses, logprobs and gradients equal the unshared route's up
  to float rounding. The `Datum`s and outputs are the same either way.
- Weights are an immutable pytree, replaced (never mutated) by `optim_step` and the loads, so a
  sampling client's snapshot never changes under it.
- The optimizer step count is part of the client's state and of its checkpoints: sampling
  clients made by `save_weights_and_get_sampling_client` take the stream
  `(1, steps so far, index since that step)`.
- The client never sees its service: it gets the service's shared `LocalRuntime`
  (`shell.local._runtime`: seed, budgets, checkpoint paths) and, for `create_sampling_client`, a
  plain callable that opens a sampling client on a saved checkpoint path.
- Checkpoints go where the runtime's `checkpoint_path(...)` says; `load_state` restores
  weights only (fresh Adam state), `load_state_with_optimizer` weights and Adam state.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import optax
import tinker
from tinker import types
from tinker.lib.public_interfaces.custom_loss import LossHandle, check_loss_inputs

from rlpure import model as model_lib
from rlpure.packing import plan_grouped_chunks, prefix_tree_size
from shell.errors import CheckpointError
from shell.local._checkpoints import read_checkpoint, write_checkpoint
from shell.local._custom_loss import (
    SURROGATE_LOSS,
    CustomLossFn,
    custom_loss_gradients,
    custom_metrics,
    forward_data,
    linear_loss_data,
    require_torch,
)
from shell.local._futures import ClientFuture, ReadyFuture
from shell.local._inputs import (
    PREFIX_SHARING_FRACTION,
    CheckedData,
    PackedData,
    call_groups,
    check_data,
    loss_config_key,
    pack_grouped_chunks,
    pack_prefix_chunk,
    plan_prefix_chunks,
    prefix_key_weight,
    to_float,
)
from shell.local._runtime import LoadedModel, LocalRuntime
from shell.local._sampling import LocalSamplingClient, sampler_params
from shell.local._train_steps import (
    CHUNKS_PER_CALL,
    lora_logprobs,
    lora_loss_and_grad,
    loss_and_logprob_grad,
    merge_metrics,
    model_backward,
    model_forward_vjp,
    stacked,
    stacked_model_inputs,
    zeros_like_tree,
)

if TYPE_CHECKING:
    from shell.local._runtime import Tokenizer

__all__ = ["LocalTrainingClient"]


# `"auto"` changes layout only when the other one's estimated cost is at most this fraction of
# the layout it took last (the tries at first): on close calls (a small GRPO batch, where both
# compute about the same positions) a run keeps its layout, and so its compiled programs, from
# step to step instead of flipping on noise in the estimate.
GROUPED_COST_MARGIN = 0.95
_PREFIX_ROUTES = ("auto", "trie", "grouped")


def auto_prefix_layout(
    last: Literal["trie", "grouped"], *, trie_cost: float, grouped_cost: float
) -> Literal["trie", "grouped"]:
    """`prefix_route="auto"`'s layout for a call: the one it took `last`, unless the other's
    estimated cost is at most `GROUPED_COST_MARGIN` of it.

    Examples:
        >>> auto_prefix_layout("trie", trie_cost=100.0, grouped_cost=96.0)
        'trie'
        >>> auto_prefix_layout("grouped", trie_cost=96.0, grouped_cost=100.0)
        'grouped'
        >>> auto_prefix_layout("grouped", trie_cost=90.0, grouped_cost=100.0)
        'trie'
    """
    cost = {"trie": trie_cost, "grouped": grouped_cost}
    other: Literal["trie", "grouped"] = "grouped" if last == "trie" else "trie"
    return other if cost[other] <= GROUPED_COST_MARGIN * cost[last] else last


# AdamParams' ranges: (lowest, highest, whether the highest is excluded)
_ADAM_RANGES = {
    "learning_rate": (0.0, math.inf, False),
    "beta1": (0.0, 1.0, True),
    "beta2": (0.0, 1.0, True),
    "eps": (0.0, math.inf, False),
    "weight_decay": (0.0, math.inf, False),
    "grad_clip_norm": (0.0, math.inf, False),
}


def _adam_hyperparams(params: types.AdamParams) -> model_lib.AdamHyperparams:
    """`params` as `AdamHyperparams`, each value checked against `_ADAM_RANGES` (`eps` must be
    positive).

    Raises:
        TypeError | ValueError: a value that is no finite number, or out of its range (named).
    """
    values = {}
    for field, (low, high, open_high) in _ADAM_RANGES.items():
        value = to_float(getattr(params, field), f"AdamParams.{field}")
        above = value >= high if open_high else value > high
        if value < low or above or (field == "eps" and value <= 0):
            if field == "eps":
                rule = "> 0"
            else:
                rule = f">= {low:g}" if math.isinf(high) else f"in [{low:g}, {high:g})"
            raise ValueError(f"AdamParams.{field}: expected a value {rule}, got {value!r}")
        values[field] = value
    return model_lib.AdamHyperparams(**values)


class LocalTrainingClient:
    """Trains a local model (the SDK's `TrainingClient`; full fine-tuning, see module doc)."""

    def __init__(
        self,
        *,
        runtime: LocalRuntime,
        open_sampling_client: Callable[[str], ClientFuture[LocalSamplingClient]],
        base_model: str,
        config: model_lib.ModelConfig,
        params: model_lib.Params,
        opt_state: optax.OptState,
        model_id: str,
        lora_rank: int,
        optim_steps: int = 0,
        run_metadata: dict[str, str] | None = None,
        model: LoadedModel,
        lora: model_lib.LoraConfig | None = None,
    ) -> None:
        """Internal: use the service's factories. `runtime` is the service's shared state;
        `open_sampling_client(path)` opens a sampling client on the checkpoint at `path`;
        `run_metadata` is the `user_metadata` the client was created with (recorded in its
        checkpoints, read back by the REST client's `get_training_run_by_tinker_path`);
        `model` is the service's resolved base model. With `lora`, `params` are the LoRA
        adapters (and `opt_state` their Adam state) on `model.params`, the frozen shared base
        weights; without, `params` are the full weights of a toy model."""
        self._runtime = runtime
        self._open_sampling_client = open_sampling_client
        self._base_model = base_model
        self._config = config
        self._params = params
        self._opt_state = opt_state
        self._grads: model_lib.Params | None = None
        self._model = model
        self._lora = lora
        if lora is not None and model.params is None:
            raise ValueError(f"LoRA needs a pretrained base model; {base_model!r} is a toy model")
        self.model_id = model_id
        self._lora_rank = lora_rank
        self._optim_steps = optim_steps  # checkpointed: keys the sampling streams
        self._run_metadata = dict(run_metadata or {})
        self._samplers_this_step = 0
        self.prefix_sharing_fraction = PREFIX_SHARING_FRACTION
        """`forward`/`forward_backward` take the prefix-shared route when the datums' tries hold
        at most this fraction of their tokens (same results either way): 0 never, 1 always."""
        self.prefix_route: Literal["auto", "trie", "grouped"] = "auto"
        """Which layout the prefix-shared route takes: `"trie"` (`plan_prefix_chunks`),
        `"grouped"` (`plan_grouped_chunks`) or, with `"auto"`, the one of the lower
        estimated cost (`_prefix_packs`)."""
        self._auto_route: Literal["trie", "grouped"] = "trie"  # `"auto"`'s last layout

    @property
    def params(self) -> model_lib.Params:
        """The trained weights: the full params of a toy model, the LoRA adapters of a
        pretrained one (an immutable pytree; replaced, never mutated, by `optim_step`)."""
        return self._params

    @property
    def lora(self) -> model_lib.LoraConfig | None:
        """The adapters' config (None: full fine-tuning of a toy model)."""
        return self._lora

    @property
    def base_params(self) -> model_lib.Params | None:
        """The frozen base weights LoRA adapts, shared with the service (None for a toy)."""
        return self._model.params

    @property
    def config(self) -> model_lib.ModelConfig:
        return self._config

    def get_tokenizer(self) -> Tokenizer:
        """`ByteTokenizer` for a toy model, the checkpoint's `PreTrainedTokenizerFast` else."""
        return self._model.tokenizer

    def get_info(self) -> types.GetInfoResponse:
        return types.GetInfoResponse(
            model_data=types.ModelData(
                arch=self._config.family if self._lora is not None else "rlpure-transformer",
                model_name=self._base_model,
                tokenizer_id=self._base_model if self._lora is not None else "rlpure/byte",
            ),
            model_id=self.model_id,
            is_lora=self._lora is not None,
            lora_rank=self._lora_rank,
            model_name=self._base_model,
        )

    async def get_info_async(self) -> types.GetInfoResponse:
        return self.get_info()

    # -- forward / backward --

    def forward(
        self,
        data: list[types.Datum],
        loss_fn: types.LossFnType,
        loss_fn_config: Mapping[str, float | str] | None = None,
    ) -> tinker.APIFuture[types.ForwardBackwardOutput]:
        """Loss, logprobs and metrics without gradients."""
        return ReadyFuture(self._run(data, loss_fn, loss_fn_config, backward=False))

    async def forward_async(
        self,
        data: list[types.Datum],
        loss_fn: types.LossFnType,
        loss_fn_config: Mapping[str, float | str] | None = None,
    ) -> tinker.APIFuture[types.ForwardBackwardOutput]:
        return self.forward(data, loss_fn, loss_fn_config)

    def forward_backward(
        self,
        data: list[types.Datum],
        loss_fn: types.LossFnType,
        loss_fn_config: Mapping[str, float | str] | None = None,
    ) -> tinker.APIFuture[types.ForwardBackwardOutput]:
        """Computes the summed loss and adds its gradient to the accumulated gradient.

        Args:
            data: datums; `model_input` of length `N_d` and every `loss_fn_inputs` tensor 1-D of
                length `N_d` (Tinker's shifted alignment: input position `i` predicts
                `target_tokens[i]`), but `cross_entropy`'s `target_tokens` and `weights`,
                which may be `(N_d, K)`: `K` targets a position (top-K distillation).
            loss_fn: a loss of `rlpure.losses.LOSSES`.
            loss_fn_config: loss hyper-parameters (e.g. `clip_low_threshold`).

        Returns:
            `APIFuture[ForwardBackwardOutput]`: `loss_fn_outputs[d]["logprobs"]` is a float32
            `TensorData` shaped as datum `d`'s `target_tokens`; `metrics` holds `loss:sum` and
            the loss's metrics.

        Raises:
            TypeError, ValueError: malformed data (naming the datum and key) or config.
        """
        return ReadyFuture(self._run(data, loss_fn, loss_fn_config, backward=True))

    async def forward_backward_async(
        self,
        data: list[types.Datum],
        loss_fn: types.LossFnType,
        loss_fn_config: Mapping[str, float | str] | None = None,
    ) -> tinker.APIFuture[types.ForwardBackwardOutput]:
        return self.forward_backward(data, loss_fn, loss_fn_config)

    def forward_backward_custom(
        self,
        data: list[types.Datum],
        loss_fn: CustomLossFn | LossHandle,
        *,
        loss_type_input: Literal["logprobs"] | None = None,
    ) -> tinker.APIFuture[types.ForwardBackwardOutput]:
        """`forward_backward` with a loss written in torch over each datum's logprobs, run in
        this process as the SDK runs it client-side (`shell.local._custom_loss`): a forward
        pass for the logprobs, the loss and its gradient in torch, then a `cross_entropy`
        `forward_backward` with `weights = −∂loss/∂logprobs`. The gradient accumulates as
        `forward_backward`'s does.

        Args:
            data: datums with `target_tokens` (and whatever else the loss reads).
            loss_fn: `(data, logprobs_list) -> (loss, metrics)`, or a `LossHandle` from this
                service's `create_custom_loss`.
            loss_type_input: deprecated (the SDK's): None or `"logprobs"`.

        Returns:
            `APIFuture[ForwardBackwardOutput]`: the backward call's outputs (logprobs), its
            `loss:sum` as `surrogate_loss:sum`, the custom loss's metrics, and `loss:sum` the
            custom loss.

        Raises:
            ImportError: torch is not installed.
            ValueError: a `LossHandle` of another session or whose inputs the data lack, a
                datum without `target_tokens`, or no data.
            NotImplementedError: a `LossHandle` uploaded to a Tinker server (`loss_id`).

        Unlike the SDK, a loss that raises leaves the client usable (the SDK then rejects its
        queued and later requests, whose ids it had reserved); nothing accumulates.
        """
        if loss_type_input is not None:
            warnings.warn(
                "The 'loss_type_input' parameter of forward_backward_custom() is deprecated: the "
                "loss always receives logprobs. This parameter will be removed in a future "
                "release; remove it from your call.",
                DeprecationWarning,
                stacklevel=2,
            )
        if loss_type_input not in (None, "logprobs"):
            raise ValueError(
                f"Unsupported loss_type_input={loss_type_input!r}. Supported values are: logprobs"
            )
        require_torch("run custom forward_backward")
        if isinstance(loss_fn, LossHandle):
            if loss_fn.session_id != self._runtime.session_id:
                raise ValueError(
                    f"LossHandle {loss_fn.name!r} was created in session {loss_fn.session_id}; "
                    "it can only be used by clients of that session"
                )
            if loss_fn.loss_id is not None:
                raise NotImplementedError(
                    f"LossHandle {loss_fn.name!r} runs on a Tinker server (loss_id "
                    f"{loss_fn.loss_id}); the local backend runs losses client-side only"
                )
            check_loss_inputs(loss_fn, data)
        if not data:
            raise ValueError("No data provided")
        forward = self._run(forward_data(data), SURROGATE_LOSS, None, backward=False)
        grads_D, loss_metrics, loss_sum = custom_loss_gradients(data, loss_fn, forward)
        out = self._run(linear_loss_data(data, grads_D), SURROGATE_LOSS, None, backward=True)
        metrics = custom_metrics(out.metrics, loss_metrics, loss_sum)
        return ReadyFuture(dataclasses.replace(out, metrics=metrics))

    async def forward_backward_custom_async(
        self,
        data: list[types.Datum],
        loss_fn: CustomLossFn | LossHandle,
        *,
        loss_type_input: Literal["logprobs"] | None = None,
    ) -> tinker.APIFuture[types.ForwardBackwardOutput]:
        return self.forward_backward_custom(data, loss_fn, loss_type_input=loss_type_input)

    def _run(
        self,
        data: list[types.Datum],
        loss_fn: str,
        loss_fn_config: Mapping[str, Any] | None,
        *,
        backward: bool,
    ) -> types.ForwardBackwardOutput:
        checked = check_data(data, loss_fn, self._config)
        loss_config = loss_config_key(loss_fn_config)
        grads = self._grads
        lp_D: list[np.ndarray] = [np.empty(0, np.float32)] * len(checked.tokens_D)
        metric_chunks = []
        for packs in self._packed_groups(checked):
            if backward and grads is None:
                grads = zeros_like_tree(self._params)
            if self._lora is None:
                out, grads = self._chunk_loss(
                    packs[0], loss_fn, loss_config, grads, backward=backward
                )
                results = [(out.target_logprobs_D_T, out.metrics)]
            elif backward:
                assert grads is not None
                results, grads = self._lora_backward_call(packs, loss_fn, loss_config, grads)
            else:
                results = self._lora_forward_call(packs, loss_fn, loss_config)
            for packed, (chunk_lp_D_T, chunk_metrics) in zip(packs, results, strict=True):
                chunk_lp_D_T = np.asarray(chunk_lp_D_T, np.float32)
                for row, d in enumerate(packed.index_D):
                    lp_D[d] = checked.unpadded(d, chunk_lp_D_T[row])
                metric_chunks.append({key: float(value) for key, value in chunk_metrics.items()})
        if backward:
            self._grads = grads
        metrics = merge_metrics(metric_chunks)
        outputs = [{"logprobs": types.TensorData.from_numpy(lp)} for lp in lp_D]
        return types.ForwardBackwardOutput(
            loss_fn_output_type="ArrayRecord", loss_fn_outputs=outputs, metrics=metrics
        )

    def _packed_groups(self, checked: CheckedData) -> list[list[PackedData]]:
        """The call's chunks, packed, in groups one jitted call runs (one chunk for a toy model,
        up to `CHUNKS_PER_CALL` of one shape with LoRA): the prefix-shared route's when
        sharing is worth it (`_prefix_packs`), else `plan_chunks`'."""
        per_call = 1 if self._lora is None else CHUNKS_PER_CALL

        def rows_for_width(width: int) -> int:
            return self._runtime.training_rows(self._config, width)

        packs = self._prefix_packs(checked, rows_for_width)
        return call_groups(checked, packs, rows_for_width=rows_for_width, per_call=per_call)

    def _prefix_packs(
        self, checked: CheckedData, rows_for_width: Callable[[int], int]
    ) -> list[PackedData] | None:
        """The prefix-shared route's packed chunks, or None when sharing saves too little
        (`prefix_sharing_fraction`). With `prefix_route` `"auto"`, the tries
        (`plan_prefix_chunks`) or the groups (`plan_grouped_chunks`), whichever costs less:
        computed positions plus `prefix_key_weight` times the query-key pairs attention
        computes (a trie row's queries each read the whole row), switching from the layout
        it took last only when the other costs at most `GROUPED_COST_MARGIN` of it; the
        groups alone when the tries' planner finds no plan that shares (cut into rows of the
        memory budget, long datums may share nothing), though the datums share enough.

        Raises:
            ValueError: `prefix_route` is not `"auto"`, `"trie"` or `"grouped"`.
        """
        if self.prefix_route not in _PREFIX_ROUTES:
            raise ValueError(
                f"prefix_route must be one of {', '.join(_PREFIX_ROUTES)}; got "
                f"{self.prefix_route!r}"
            )
        trie = None
        if self.prefix_route != "grouped":
            trie = plan_prefix_chunks(
                checked.tokens_D,
                rows_for_width=rows_for_width,
                max_fraction=self.prefix_sharing_fraction,
            )
            if trie is None and self.prefix_route == "trie":
                return None
        weight = prefix_key_weight(self._config)
        # The most positions (trie nodes, grouped rows' padded positions) a sharing plan may cost.
        most = self.prefix_sharing_fraction * int(checked.length_D.sum())
        grouped = None
        if self.prefix_route != "trie":
            # Under `"auto"` a trie plan means the sharing passed; with none (too little
            # sharing, or the tries cut into rows lost it) the groups may still share.
            if trie is None and prefix_tree_size(checked.tokens_D) > most:
                return None
            grouped = plan_grouped_chunks(
                checked.tokens_D,
                positions_for_keys=partial(self._runtime.training_positions, self._config),
                key_weight=weight,
            )
        if trie is not None and grouped is not None:
            computed = len(trie.chunks) * trie.rows * trie.width
            self._auto_route = auto_prefix_layout(
                self._auto_route,
                trie_cost=computed * (1 + weight * trie.width),
                grouped_cost=grouped.positions + weight * grouped.key_reads,
            )
            if self._auto_route == "trie":
                grouped = None
        elif grouped is not None and self.prefix_route == "auto":
            if grouped.positions > most:
                return None  # the groups' padded rows save too little as well
            self._auto_route = "grouped"  # the only layout that shares: the one it took last
        if grouped is not None:
            return pack_grouped_chunks(checked, grouped)
        if trie is None:  # no widths fit the groups' memory budget, nor (`"auto"`) the tries'
            return None
        return [pack_prefix_chunk(checked, trie, chunk) for chunk in trie.chunks]

    def _lora_backward_call(
        self,
        packs: list[PackedData],
        loss_fn: str,
        loss_config: tuple[tuple[str, float], ...],
        grads: model_lib.Params,
    ) -> tuple[list[tuple[np.ndarray, dict[str, np.ndarray]]], model_lib.Params]:
        """One `lora_loss_and_grad` call over `packs` (chunks of one shape, at most
        `CHUNKS_PER_CALL`): each chunk's logprobs `[D, T]` and metrics, and `grads` plus their
        gradient."""
        base = self._model.params
        assert base is not None
        outs_X, grads = lora_loss_and_grad(
            self._params,
            base,
            stacked_model_inputs(packs),
            {key: stacked([packed.inputs[key] for packed in packs]) for key in packs[0].inputs},
            stacked([packed.valid_D_T for packed in packs]),
            np.int32(len(packs)),
            grads,
            config=self._config,
            lora=self._lora,
            loss_fn=loss_fn,
            loss_config=loss_config,
        )
        lp_X_D_T = np.asarray(outs_X.target_logprobs_D_T, np.float32)
        metrics_X = {key: np.asarray(value) for key, value in outs_X.metrics.items()}
        results = [
            (lp_X_D_T[x], {key: value[x] for key, value in metrics_X.items()})
            for x in range(len(packs))
        ]
        return results, grads

    def _lora_forward_call(
        self,
        packs: list[PackedData],
        loss_fn: str,
        loss_config: tuple[tuple[str, float], ...],
    ) -> list[tuple[Any, dict[str, Any]]]:
        """A LoRA `forward` over `packs` (chunks of one shape, at most `CHUNKS_PER_CALL`): one
        `lora_logprobs` call (no residuals), then each chunk's loss; per chunk its logprobs
        `[D, T]` and metrics."""
        base = self._model.params
        assert base is not None
        lp_X_D_T = lora_logprobs(
            self._params,
            base,
            stacked_model_inputs(packs),
            stacked([packed.inputs["target_tokens"] for packed in packs]),
            np.int32(len(packs)),
            config=self._config,
            lora=self._lora,
        )
        results = []
        for x, packed in enumerate(packs):
            out, _ = loss_and_logprob_grad(
                lp_X_D_T[x],
                packed.inputs,
                packed.valid_D_T,
                loss_fn=loss_fn,
                loss_config=loss_config,
                with_grad=False,
            )
            results.append((out.target_logprobs_D_T, out.metrics))
        return results

    def _chunk_loss(
        self,
        packed: PackedData,
        loss_fn: str,
        loss_config: tuple[tuple[str, float], ...],
        grads: model_lib.Params | None,
        *,
        backward: bool,
    ) -> tuple[Any, model_lib.Params | None]:
        """A toy model's (full fine-tuning) loss output on one chunk, and `grads` plus the
        chunk's gradient when `backward`: the three jitted stages of `shell.local._train_steps`
        (a LoRA model runs `_lora_backward_call` or `_lora_forward_call`)."""
        lp_D_T, vjp = model_forward_vjp(
            self._params, packed.model_input, packed.inputs["target_tokens"], config=self._config
        )
        out, dlp_D_T = loss_and_logprob_grad(
            lp_D_T,
            packed.inputs,
            packed.valid_D_T,
            loss_fn=loss_fn,
            loss_config=loss_config,
            with_grad=backward,
        )
        if backward:
            grads = model_backward(vjp, dlp_D_T, grads)
        return out, grads

    # -- optimiser --

    def optim_step(
        self,
        optim_params: types.OptimParams | None = None,
        *,
        adam_params: types.AdamParams | None = None,
    ) -> tinker.APIFuture[types.OptimStepResponse]:
        """Applies one AdamW step with the gradients accumulated since the last step.

        Honours `learning_rate`, `beta1`, `beta2`, `eps`, `weight_decay` (decoupled) and
        `grad_clip_norm` (0 = off); changing them never recompiles. With no accumulated
        gradient the step uses zeros (Adam's momentum still moves the weights).

        Returns:
            `APIFuture[OptimStepResponse]` with metric `grad_norm` (before clipping).

        Raises:
            ValueError: a value outside its range (`_ADAM_RANGES`), naming the field: with
                `beta1 = 1` Adam's bias correction divides by 0 and every weight becomes NaN.
        """
        if optim_params is not None and adam_params is not None:
            raise ValueError("Specify optim_params or legacy adam_params, not both")
        params = optim_params if optim_params is not None else adam_params
        if not isinstance(params, types.AdamParams):
            raise NotImplementedError(
                f"optim_step: the local backend supports tinker.AdamParams only, got "
                f"{type(params).__name__}"
            )
        hyper = _adam_hyperparams(params)
        grads = self._grads if self._grads is not None else zeros_like_tree(self._params)
        self._params, self._opt_state, grad_norm = model_lib.apply_adam_update(
            self._params, self._opt_state, grads, hyper
        )
        self._grads = None
        self._optim_steps += 1
        self._samplers_this_step = 0
        return ReadyFuture(types.OptimStepResponse(metrics={"grad_norm": float(grad_norm)}))

    async def optim_step_async(
        self,
        optim_params: types.OptimParams | None = None,
        *,
        adam_params: types.AdamParams | None = None,
    ) -> tinker.APIFuture[types.OptimStepResponse]:
        return self.optim_step(optim_params, adam_params=adam_params)

    # -- weights and checkpoints --

    def _sampling_client(self) -> LocalSamplingClient:
        stream = (1, self._optim_steps, self._samplers_this_step)
        self._samplers_this_step += 1
        return LocalSamplingClient(
            runtime=self._runtime,
            base_model=self._base_model,
            config=self._config,
            params=sampler_params(self._model, self._params, self._lora),
            stream=stream,
            model=self._model,
        )

    def save_weights_and_get_sampling_client(
        self,
        name: str | None = None,
        retry_config: Any = None,
        record_stability_info: bool = False,
        kind: str = "snapshot",
    ) -> ClientFuture[LocalSamplingClient]:
        """A sampling client on a snapshot of the current weights (nothing written to disk).

        `kind="inflight"` is accepted and also gives a snapshot (which satisfies the SDK's
        "these weights or newer" contract).
        """
        if kind not in ("snapshot", "inflight"):
            raise ValueError(f"kind: expected 'snapshot' or 'inflight', got {kind!r}")
        return ClientFuture(self._sampling_client())

    async def save_weights_and_get_sampling_client_async(
        self,
        name: str | None = None,
        retry_config: Any = None,
        record_stability_info: bool = False,
        kind: str = "snapshot",
    ) -> LocalSamplingClient:
        return await self.save_weights_and_get_sampling_client(
            name, retry_config, record_stability_info, kind
        ).result_async()

    def save_state(
        self,
        name: str,
        ttl_seconds: int | None = None,
        overwrite: bool = False,
        user_metadata: dict[str, str] | None = None,
    ) -> tinker.APIFuture[types.SaveWeightsResponse]:
        """Saves weights and Adam state; `.path` is the checkpoint directory's absolute path.

        `ttl_seconds` is accepted and ignored: local checkpoints never expire (delete them with
        the REST client's `delete_checkpoint_from_tinker_path`, as the cookbook's rolling saves
        do).

        Raises:
            FileExistsError: if the checkpoint exists and `overwrite` is False.
        """
        directory = self._runtime.checkpoint_path(self.model_id, "state", name, overwrite=overwrite)
        write_checkpoint(
            directory,
            base_model=self._base_model,
            config=self._config,
            params=self._params,
            opt_state=self._opt_state,
            optim_steps=self._optim_steps,
            kind="state",
            user_metadata=user_metadata,
            training_run_id=self.model_id,
            run_metadata=self._run_metadata,
            lora=self._lora,
        )
        return ReadyFuture(types.SaveWeightsResponse(path=str(directory)))

    async def save_state_async(
        self,
        name: str,
        ttl_seconds: int | None = None,
        overwrite: bool = False,
        user_metadata: dict[str, str] | None = None,
    ) -> tinker.APIFuture[types.SaveWeightsResponse]:
        return self.save_state(name, ttl_seconds, overwrite, user_metadata)

    def save_weights_for_sampler(
        self,
        name: str,
        ttl_seconds: int | None = None,
        user_metadata: dict[str, str] | None = None,
    ) -> tinker.APIFuture[types.SaveWeightsForSamplerResponse]:
        """Saves the weights (no optimizer state) for `create_sampling_client(model_path=...)`.

        `ttl_seconds` is accepted and ignored (local checkpoints never expire); an existing
        sampler checkpoint of that name is replaced.
        """
        directory = self._runtime.checkpoint_path(self.model_id, "sampler", name, overwrite=True)
        write_checkpoint(
            directory,
            base_model=self._base_model,
            config=self._config,
            params=self._params,
            opt_state=None,
            optim_steps=self._optim_steps,
            kind="sampler",
            user_metadata=user_metadata,
            training_run_id=self.model_id,
            run_metadata=self._run_metadata,
            lora=self._lora,
        )
        return ReadyFuture(types.SaveWeightsForSamplerResponse(path=str(directory)))

    async def save_weights_for_sampler_async(
        self,
        name: str,
        ttl_seconds: int | None = None,
        user_metadata: dict[str, str] | None = None,
    ) -> tinker.APIFuture[types.SaveWeightsForSamplerResponse]:
        return self.save_weights_for_sampler(name, ttl_seconds, user_metadata)

    def create_sampling_client(
        self, model_path: str, retry_config: Any = None, record_stability_info: bool = False
    ) -> ClientFuture[LocalSamplingClient]:
        return self._open_sampling_client(model_path)

    async def create_sampling_client_async(
        self, model_path: str, retry_config: Any = None, record_stability_info: bool = False
    ) -> LocalSamplingClient:
        return await self.create_sampling_client(model_path).result_async()

    def _load(self, path: str, *, with_optimizer: bool) -> types.LoadWeightsResponse:
        checkpoint = read_checkpoint(path, with_optimizer=with_optimizer)
        if checkpoint.config != self._config:
            raise CheckpointError(
                f"checkpoint {path!r}: model config {checkpoint.config} does not match this "
                f"client's {self._config}"
            )
        if checkpoint.lora != self._lora:
            raise CheckpointError(
                f"checkpoint {path!r}: LoRA config {checkpoint.lora} does not match this "
                f"client's {self._lora}"
            )
        if self._lora is not None and checkpoint.base_model != self._base_model:
            raise CheckpointError(
                f"checkpoint {path!r}: adapters of base model {checkpoint.base_model!r}, not of "
                f"this client's {self._base_model!r}"
            )
        self._params = checkpoint.params
        self._opt_state = (
            checkpoint.opt_state
            if with_optimizer
            else model_lib.init_optimizer_state(checkpoint.params)
        )
        self._grads = None
        self._optim_steps = checkpoint.optim_steps
        self._samplers_this_step = 0
        return types.LoadWeightsResponse(path=path, model_id=self.model_id)

    def load_state(
        self, path: str, weights_access_token: str | None = None
    ) -> tinker.APIFuture[types.LoadWeightsResponse]:
        """Loads weights only (the optimizer restarts), as the SDK's `load_state` does."""
        return ReadyFuture(self._load(path, with_optimizer=False))

    async def load_state_async(
        self, path: str, weights_access_token: str | None = None
    ) -> tinker.APIFuture[types.LoadWeightsResponse]:
        return self.load_state(path)

    def load_state_with_optimizer(
        self, path: str, weights_access_token: str | None = None
    ) -> tinker.APIFuture[types.LoadWeightsResponse]:
        """Loads weights and Adam state: training continues exactly as if never interrupted."""
        return ReadyFuture(self._load(path, with_optimizer=True))

    async def load_state_with_optimizer_async(
        self, path: str, weights_access_token: str | None = None
    ) -> tinker.APIFuture[types.LoadWeightsResponse]:
        return self.load_state_with_optimizer(path)
