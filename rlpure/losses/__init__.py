"""Tinker's losses as pure, differentiable functions that sum over tokens and datums.

- `_functions`: the losses themselves (`cross_entropy_loss`, `importance_sampling_loss`,
  `ppo_clipped_surrogate_loss`, `cispo_clipped_weight_loss`, `dro_quadratic_penalty_loss`,
  `gspo_token_clipped_surrogate_loss`); its docstring states the notation, the sum reduction,
  the masks and the metrics.
- `_registry`: `LOSSES` by Tinker's name (`LossSpec`: inputs, config defaults) and
  `compute_loss`, what `forward_backward(data, loss_fn=name, loss_fn_config=config)` computes
  (`check_loss_config` refuses a bad `config` ahead);
  `loss_fn_inputs_from_batch` builds the inputs from a `DatumBatch`.
- `_common`: `LossOutput` and the checks and ratio metrics the losses share.
"""

from __future__ import annotations

from rlpure.losses._common import LossOutput
from rlpure.losses._functions import (
    cispo_clipped_weight_loss,
    cross_entropy_loss,
    dro_quadratic_penalty_loss,
    gspo_token_clipped_surrogate_loss,
    importance_sampling_loss,
    ppo_clipped_surrogate_loss,
)
from rlpure.losses._registry import (
    KNOWN_LOSS_INPUTS,
    LOSSES,
    LossSpec,
    PolicyLossName,
    check_loss_config,
    compute_loss,
    loss_fn_inputs_from_batch,
)

__all__ = [
    "KNOWN_LOSS_INPUTS",
    "LOSSES",
    "LossOutput",
    "LossSpec",
    "PolicyLossName",
    "check_loss_config",
    "cispo_clipped_weight_loss",
    "compute_loss",
    "cross_entropy_loss",
    "dro_quadratic_penalty_loss",
    "gspo_token_clipped_surrogate_loss",
    "importance_sampling_loss",
    "loss_fn_inputs_from_batch",
    "ppo_clipped_surrogate_loss",
]
