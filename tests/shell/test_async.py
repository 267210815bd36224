"""Async off-policy training (`TrainConfig.async_config`, `shell.training._async`).

The cookbook's `do_async_training` on the fake SDK: rollouts keep going while training runs,
at most `groups_per_batch * (max_steps_off_policy + 1)` groups in flight, oldest sampler
first, staleness metrics, a clean shutdown, and a resume that trains no group twice.
"""

from __future__ import annotations

import pytest

from shell.config import AsyncConfig, StreamMinibatchConfig, TrainConfig
from shell.errors import ConfigError
from shell.training._policy_update import records_stability_info


def _async(max_steps_off_policy: int = 1, groups_per_batch: int = 2, **kw: str) -> AsyncConfig:
    return AsyncConfig(
        max_steps_off_policy=max_steps_off_policy, groups_per_batch=groups_per_batch, **kw
    )


def test_async_runs_train_with_the_async_loss_and_record_stability_info() -> None:
    config = TrainConfig(backend="fake", async_config=_async())
    assert config.training_loss_fn() == "stable_reinforce"  # the cookbook's default
    assert records_stability_info(config)
    ppo = TrainConfig(backend="fake", async_config=_async(loss_fn="ppo"))
    assert ppo.training_loss_fn() == "ppo" and not records_stability_info(ppo)
    assert TrainConfig(backend="fake").training_loss_fn() == "importance_sampling"


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"async_config": _async(max_steps_off_policy=-1)}, "max_steps_off_policy: must be >= 0"),
        ({"async_config": _async(groups_per_batch=0)}, "groups_per_batch: must be >= 1"),
        (
            {"async_config": _async(), "loss_fn": "ppo"},
            "loss_fn: 'ppo' conflicts with async_config.loss_fn 'stable_reinforce'",
        ),
        (
            {"async_config": _async(), "backend": "local"},
            "async_config.loss_fn: 'stable_reinforce' is a Tinker loss the local backend",
        ),
        (
            {
                "async_config": _async(),
                "stream_minibatch_config": StreamMinibatchConfig(
                    groups_per_batch=2, num_minibatches=1
                ),
            },
            "not supported",
        ),
        (
            {
                "async_config": _async(),
                "kl_penalty_coef": 0.1,
                "kl_discount": 0.5,
                "kl_reference_model": "m",
            },
            "kl_discount: 0.5 > 0 is not supported with loss_fn 'stable_reinforce'",
        ),
    ],
)
def test_bad_async_options_are_config_errors(fields: dict[str, object], match: str) -> None:
    fields = {"backend": "fake", **fields}
    with pytest.raises(ConfigError, match=match):
        TrainConfig(**fields)  # type: ignore[arg-type]


def test_the_cookbooks_default_loss_may_stay_beside_an_async_loss() -> None:
    config = TrainConfig(
        backend="local", loss_fn="importance_sampling", async_config=_async(loss_fn="ppo")
    )
    assert config.training_loss_fn() == "ppo"
