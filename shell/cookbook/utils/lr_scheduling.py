"""`tinker_cookbook.utils.lr_scheduling`: learning-rate schedules, over `shell.schedules`."""

from __future__ import annotations

from shell.schedules import LRSchedule, lr_multiplier

__all__ = ["LRSchedule", "compute_schedule_lr_multiplier"]


def compute_schedule_lr_multiplier(lr_schedule: LRSchedule, step: int, total_steps: int) -> float:
    """The factor of the base learning rate at `step` (from 0) of `total_steps`.

    Raises:
        ConfigurationError: `total_steps` is not positive, or an unknown schedule.
    """
    return lr_multiplier(lr_schedule, step=step, total_steps=total_steps)
