"""Learning-rate schedules: the multiplier of the base rate at a step (pure arithmetic).

Conventions: `step` counts from 0 and `total_steps` is the run's length; the multiplier is
tinker-cookbook 0.6.1's (`utils/lr_scheduling.compute_schedule_lr_multiplier`):

- `linear`: `1 - step / total_steps`;
- `cosine`: `(1 + cos(pi * step / total_steps)) / 2`;
- `constant`: `1`.

So the last step (`total_steps - 1`) still trains with a positive rate, and `step ==
total_steps` gives 0 for `linear` and `cosine`. Steps beyond the run are not clipped (as the
cookbook: `linear` goes negative).
"""

from __future__ import annotations

import math
from typing import Literal, get_args

from shell.errors import ConfigError

__all__ = ["LR_SCHEDULES", "LRSchedule", "lr_multiplier"]

LRSchedule = Literal["linear", "cosine", "constant"]
"""The schedule names."""

LR_SCHEDULES: tuple[str, ...] = get_args(LRSchedule)
"""Every schedule name, in `LRSchedule`'s order."""


def lr_multiplier(schedule: str, *, step: int, total_steps: int) -> float:
    """The factor of the base learning rate at `step` of `total_steps` under `schedule`.

    Raises:
        ConfigError: `total_steps` is not positive, or `schedule` is not one of
            `LR_SCHEDULES`.

    Examples:
        >>> [lr_multiplier("linear", step=s, total_steps=4) for s in range(4)]
        [1.0, 0.75, 0.5, 0.25]
        >>> lr_multiplier("cosine", step=2, total_steps=4)
        0.5
    """
    if total_steps <= 0:
        raise ConfigError(f"total_steps must be positive, got {total_steps}")
    if schedule == "linear":
        return 1 - step / total_steps
    if schedule == "cosine":
        return 0.5 * (1 + math.cos(math.pi * step / total_steps))
    if schedule == "constant":
        return 1.0
    raise ConfigError(
        f"Unknown learning rate schedule: {schedule} (expected one of {list(LR_SCHEDULES)})"
    )
