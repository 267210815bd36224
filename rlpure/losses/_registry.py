"""Tinker's losses by name: the registry `LOSSES` and the entry point `compute_loss`.

`compute_loss(name, target_logprobs_D_T, loss_fn_inputs, config)` is what Tinker's
`forward_backward(data, loss_fn=name, loss_fn_config=config)` computes, as a pure function: it
checks Tinker's inputs and config against the loss's `LossSpec`, fills in the documented config
defaults and calls the loss in `rlpure.losses._functions`.

Conventions:
- Inputs go by Tinker's `loss_fn_inputs` names (`KNOWN_LOSS_INPUTS`), each a zero-padded
  `[D, T]` array aligned with the targets, as in `rlpure.losses._functions` (whose module
  docstring states the notation, the sum reduction, the masks and the metrics). Every input
  given is shape-checked, even one the loss does not read; an unknown name (e.g. the
  cookbook's `mask`) is refused rather than ignored.
- `config` is Tinker's `loss_fn_config`: keys a loss does not accept are refused, missing keys
  take `LossSpec.config_defaults` (Tinker's documented defaults), and keys in
  `LossSpec.required_config` (no documented default: `dro`'s `beta`, `gspo`'s clip bounds)
  must be given. `name` and `config` are plain Python values, static under `jit`.
- `valid_mask_D_T` (nonzero on real positions) is the padding mask Tinker's ragged datums do
  not need; `loss_fn_inputs_from_batch` derives it, and the inputs, from a `DatumBatch`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Literal

import jax
import jax.numpy as jnp
import msgspec
from jax.typing import ArrayLike

from rlpure._checks import check_shapes_equal
from rlpure.losses._common import LossOutput, as_logprobs
from rlpure.losses._functions import (
    cispo_clipped_weight_loss,
    cross_entropy_loss,
    dro_quadratic_penalty_loss,
    gspo_token_clipped_surrogate_loss,
    importance_sampling_loss,
    ppo_clipped_surrogate_loss,
)
from rlpure.packing import DatumBatch

__all__ = [
    "KNOWN_LOSS_INPUTS",
    "LOSSES",
    "LossSpec",
    "PolicyLossName",
    "check_loss_config",
    "compute_loss",
    "loss_fn_inputs_from_batch",
]

KNOWN_LOSS_INPUTS = frozenset(
    {"target_tokens", "weights", "logprobs", "advantages", "sequence_ratio_mask"}
)
"""Tinker `loss_fn_inputs` names `compute_loss` understands (others are refused, e.g. `mask`)."""


class LossSpec(msgspec.Struct, frozen=True, kw_only=True):
    """How a Tinker loss name maps onto a function here.

    Attributes:
        name: Tinker's `loss_fn` string.
        loss_fn: the function; called as `loss_fn(target_logprobs_D_T, *arrays,
            valid_mask_D_T=..., **config)` with `arrays` taken from `array_inputs`.
        required_inputs: `loss_fn_inputs` names Tinker requires for this loss (includes
            `target_tokens`, which the maths does not read because the logprobs of the targets
            are given, but which a Tinker datum must carry).
        array_inputs: the inputs passed positionally to `loss_fn`, in order.
        config_defaults: `loss_fn_config` keys with their documented Tinker defaults.
        required_config: `loss_fn_config` keys without a documented default (must be passed).
        reference: the Tinker documentation page.
        top_k_inputs: the inputs that may carry `K` values per position (`[D, T, K]`, with
            `[D, T, K]` logprobs: `cross_entropy`'s top-K distillation targets); empty when
            the loss takes `[D, T]` only.
    """

    name: str
    loss_fn: Callable[..., LossOutput]
    required_inputs: tuple[str, ...]
    array_inputs: tuple[str, ...]
    config_defaults: Mapping[str, float]
    required_config: tuple[str, ...] = ()
    reference: str = ""
    top_k_inputs: tuple[str, ...] = ()

    @property
    def config_keys(self) -> frozenset[str]:
        return frozenset(self.config_defaults) | frozenset(self.required_config)


PolicyLossName = Literal["importance_sampling", "ppo", "cispo", "dro", "gspo"]
"""The RL losses a training loop may choose: every loss in `LOSSES` but `cross_entropy`."""

_DOCS = "https://tinker-docs.thinkingmachines.ai/tinker/losses"
_RL_INPUTS = ("logprobs", "advantages")

LOSSES: Mapping[str, LossSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            LossSpec(
                name="cross_entropy",
                loss_fn=cross_entropy_loss,
                required_inputs=("target_tokens", "weights"),
                array_inputs=("weights",),
                config_defaults=MappingProxyType({}),
                reference=f"{_DOCS}/cross-entropy",
                top_k_inputs=("target_tokens", "weights"),
            ),
            LossSpec(
                name="importance_sampling",
                loss_fn=importance_sampling_loss,
                required_inputs=("target_tokens", *_RL_INPUTS),
                array_inputs=_RL_INPUTS,
                config_defaults=MappingProxyType({}),
                reference=_DOCS,
            ),
            LossSpec(
                name="ppo",
                loss_fn=ppo_clipped_surrogate_loss,
                required_inputs=("target_tokens", *_RL_INPUTS),
                array_inputs=_RL_INPUTS,
                config_defaults=MappingProxyType(
                    {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
                ),
                reference=f"{_DOCS}/ppo",
            ),
            LossSpec(
                name="cispo",
                loss_fn=cispo_clipped_weight_loss,
                required_inputs=("target_tokens", *_RL_INPUTS),
                array_inputs=_RL_INPUTS,
                config_defaults=MappingProxyType(
                    {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0}
                ),
                reference=f"{_DOCS}/cispo",
            ),
            LossSpec(
                name="dro",
                loss_fn=dro_quadratic_penalty_loss,
                required_inputs=("target_tokens", *_RL_INPUTS),
                array_inputs=_RL_INPUTS,
                config_defaults=MappingProxyType({}),
                required_config=("beta",),
                reference=f"{_DOCS}/dro",
            ),
            LossSpec(
                name="gspo",
                loss_fn=gspo_token_clipped_surrogate_loss,
                required_inputs=("target_tokens", *_RL_INPUTS, "sequence_ratio_mask"),
                array_inputs=(*_RL_INPUTS, "sequence_ratio_mask"),
                config_defaults=MappingProxyType({}),
                required_config=("clip_low_threshold", "clip_high_threshold"),
                reference=f"{_DOCS}/gspo",
            ),
        )
    }
)
"""Tinker loss name → `LossSpec`; the one table the local backend and users look losses up in."""


def compute_loss(
    name: str,
    target_logprobs_D_T: ArrayLike,
    loss_fn_inputs: Mapping[str, ArrayLike],
    config: Mapping[str, float] | None = None,
    *,
    valid_mask_D_T: ArrayLike | None = None,
) -> LossOutput:
    """Computes Tinker's loss `name` on a padded batch, as `forward_backward` would.

    Traceable under `jax.jit` / `jax.value_and_grad` w.r.t. `target_logprobs_D_T` (and the
    inputs); `name` and `config` are plain Python values, static under `jit` (close over them or
    mark them static). Shapes are checked at trace time.

    Args:
        name: Tinker loss name, a key of `LOSSES` (`cross_entropy`, `importance_sampling`,
            `ppo`, `cispo`, `dro`, `gspo`).
        target_logprobs_D_T: float `[D, T]` learner logprobs of the target tokens; for a loss
            with `top_k_inputs` (`cross_entropy`) also `[D, T, K]`, `K` targets a position.
        loss_fn_inputs: Tinker input name → zero-padded `[D, T]` array (`target_tokens`
            int, `weights`, `logprobs`, `advantages`, `sequence_ratio_mask` float), those of
            `top_k_inputs` `[D, T, K]` with `[D, T, K]` logprobs. Inputs a loss does not read
            (e.g. `weights` on an RL loss) are shape-checked and ignored; names Tinker does
            not know (e.g. the cookbook's `mask`) are refused.
        config: Tinker's `loss_fn_config` (e.g. `{"clip_low_threshold": 0.9}`); missing keys
            take the documented defaults in `LOSSES[name].config_defaults`.
        valid_mask_D_T: bool/float `[D, T]`, nonzero on real (non-padding) positions; default
            all positions. Padding contributes nothing to loss, gradient or metrics.

    Returns:
        `LossOutput` (`.loss`, `.target_logprobs_D_T`, `.metrics` with at least `loss:sum`).

    Raises:
        ValueError: unknown loss name, unknown input or config key, missing input or required
            config key, or an input whose shape differs from `target_logprobs_D_T`'s (naming
            the loss, the input and both shapes).

    Examples:
        >>> lp = jnp.array([[-0.5, -1.0]])
        >>> inputs = {"target_tokens": jnp.array([[3, 4]]), "logprobs": lp,
        ...           "advantages": jnp.array([[2.0, -1.0]])}
        >>> float(compute_loss("ppo", lp, inputs).loss)
        -1.0
        >>> grad = jax.grad(lambda x: compute_loss("ppo", x, inputs).loss)(lp)
        >>> grad.tolist()
        [[-2.0, 1.0]]
    """
    spec = LOSSES.get(name)
    if spec is None:
        raise ValueError(f"unknown loss {name!r}; known losses: {', '.join(sorted(LOSSES))}")
    lp = as_logprobs(name, target_logprobs_D_T, top_k=bool(spec.top_k_inputs))
    _check_loss_inputs(spec, lp, loss_fn_inputs, valid_mask_D_T=valid_mask_D_T)
    merged = _loss_config(spec, config)
    arrays = [loss_fn_inputs[key] for key in spec.array_inputs]
    return spec.loss_fn(lp, *arrays, valid_mask_D_T=valid_mask_D_T, **merged)


def _check_loss_inputs(
    spec: LossSpec,
    target_logprobs_D_T: jax.Array,
    loss_fn_inputs: Mapping[str, ArrayLike],
    *,
    valid_mask_D_T: ArrayLike | None,
) -> None:
    """Refuses unknown or missing `loss_fn_inputs` of `spec`'s loss, and any `[D, T]` mismatch.

    Raises:
        ValueError: as `compute_loss` documents, naming the loss.
    """
    name = spec.name
    unknown = sorted(set(loss_fn_inputs) - KNOWN_LOSS_INPUTS)
    if unknown:
        raise ValueError(
            f"{name}: unknown loss_fn_inputs {unknown}; Tinker inputs are "
            f"{sorted(KNOWN_LOSS_INPUTS)}"
        )
    missing = [key for key in spec.required_inputs if key not in loss_fn_inputs]
    if missing:
        raise ValueError(
            f"{name}: missing loss_fn_inputs {missing} (required: {list(spec.required_inputs)})"
        )
    lp = target_logprobs_D_T
    if lp.ndim == 3:  # top-K targets: those inputs `[D, T, K]`, the others and the mask `[D, T]`
        check_shapes_equal(
            name,
            ("target_logprobs_D_T_K", lp),
            *((f"input {key!r}", loss_fn_inputs[key]) for key in spec.top_k_inputs),
        )
        lp = lp[..., 0]
    check_shapes_equal(
        name,
        ("target_logprobs_D_T", lp),
        *(
            (f"input {key!r}", values)
            for key, values in loss_fn_inputs.items()
            if key not in spec.top_k_inputs or target_logprobs_D_T.ndim == 2
        ),
        ("valid_mask_D_T", valid_mask_D_T),
    )


def check_loss_config(name: str, config: Mapping[str, float] | None) -> dict[str, float]:
    """`config` for loss `name` over its documented defaults: what `compute_loss` will use, so
    a caller (a run's configuration) can refuse bad keys before anything runs.

    Raises:
        ValueError: an unknown loss, unknown config keys, or a required key missing (naming
            the loss and the keys).

    Examples:
        >>> check_loss_config("ppo", {"clip_high_threshold": 1.3})
        {'clip_low_threshold': 0.8, 'clip_high_threshold': 1.3}
        >>> check_loss_config("dro", None)
        Traceback (most recent call last):
        ...
        ValueError: dro: config ['beta'] must be given (no documented Tinker default; see https://tinker-docs.thinkingmachines.ai/tinker/losses/dro)
    """
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; known: {sorted(LOSSES)}")
    return _loss_config(LOSSES[name], config)


def _loss_config(spec: LossSpec, config: Mapping[str, float] | None) -> dict[str, float]:
    """`config` over `spec`'s documented defaults, refusing unknown and missing required keys.

    Raises:
        ValueError: as `compute_loss` documents, naming the loss.
    """
    name = spec.name
    config = dict(config or {})
    unknown = sorted(set(config) - spec.config_keys)
    if unknown:
        raise ValueError(
            f"{name}: unknown config keys {unknown}; accepted: {sorted(spec.config_keys)}"
        )
    missing = [key for key in spec.required_config if key not in config]
    if missing:
        raise ValueError(
            f"{name}: config {missing} must be given (no documented Tinker default; "
            f"see {spec.reference})"
        )
    return {**spec.config_defaults, **config}


def loss_fn_inputs_from_batch(batch: DatumBatch) -> tuple[dict[str, jax.Array], jax.Array]:
    """Tinker-named loss inputs and the padding mask of a `DatumBatch`, for `compute_loss`.

    `target_tokens`, `logprobs`, `advantages` come from the batch; `weights` (read by
    `cross_entropy`) and `sequence_ratio_mask` (read by `gspo`: the sequence ratio is taken over
    the trained action tokens) are `mask_D_T`. The valid mask is `t < length_D[d]`.

    Returns:
        `(loss_fn_inputs, valid_mask_D_T)`: a dict of `[D, T]` arrays and a bool `[D, T]`.

    Examples:
        >>> import numpy as np
        >>> z = np.zeros((1, 2), np.float32)
        >>> batch = DatumBatch(
        ...     input_tokens_D_T=z.astype(np.int32), target_tokens_D_T=z.astype(np.int32),
        ...     logprobs_D_T=z, advantages_D_T=np.ones((1, 2), np.float32),
        ...     mask_D_T=np.array([[0.0, 1.0]], np.float32), length_D=np.array([1], np.int32),
        ...     group_idx_D=np.zeros(1, np.int32), traj_idx_D=np.zeros(1, np.int32),
        ...     num_datums=1)
        >>> inputs, valid = loss_fn_inputs_from_batch(batch)
        >>> sorted(inputs), valid.tolist()
        (['advantages', 'logprobs', 'sequence_ratio_mask', 'target_tokens', 'weights'], [[True, False]])
    """
    mask = jnp.asarray(batch.mask_D_T)
    _, t = batch.shape
    valid = jnp.arange(t)[None, :] < jnp.asarray(batch.length_D)[:, None]
    inputs = {
        "target_tokens": jnp.asarray(batch.target_tokens_D_T),
        "weights": mask,
        "logprobs": jnp.asarray(batch.logprobs_D_T),
        "advantages": jnp.asarray(batch.advantages_D_T),
        "sequence_ratio_mask": mask,
    }
    return inputs, valid
