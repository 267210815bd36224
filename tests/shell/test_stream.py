"""Streaming minibatches (`TrainConfig.stream_minibatch_config`, `shell.training._stream`).

The cookbook's `do_sync_training_with_stream_minibatch` on the fake SDK: each minibatch of a
step's groups goes to `forward_backward` as soon as its groups arrive, one `optim_step` per
substep; bad options are `ConfigError`s before anything runs.
"""

from __future__ import annotations

import pytest

from shell.config import StreamMinibatchConfig, TrainConfig, build_config
from shell.errors import ConfigError


@pytest.mark.parametrize(
    ("groups_per_batch", "num_minibatches", "num_substeps", "match"),
    [
        (0, 1, 1, "must be >= 1"),
        (4, 0, 1, "must be >= 1"),
        (4, 1, 3, "not divisible by num_substeps 3"),
        (4, 3, 1, "3 minibatches do not divide the 4 groups of a substep"),
        (8, 3, 2, "3 minibatches do not divide the 4 groups of a substep"),
    ],
)
def test_minibatches_that_do_not_divide_the_batch_are_refused(
    groups_per_batch: int, num_minibatches: int, num_substeps: int, match: str
) -> None:
    stream = StreamMinibatchConfig(
        groups_per_batch=groups_per_batch, num_minibatches=num_minibatches
    )
    with pytest.raises(ConfigError, match=match):
        TrainConfig(backend="fake", num_substeps=num_substeps, stream_minibatch_config=stream)


def test_the_stream_config_reads_from_a_config_file_table() -> None:
    config = build_config(
        {
            "backend": "fake",
            "stream_minibatch_config": {"groups_per_batch": 4, "num_minibatches": 2},
        }
    )
    assert config.stream_minibatch_config == StreamMinibatchConfig(
        groups_per_batch=4, num_minibatches=2
    )
    with pytest.raises(ConfigError, match="stream_minibatch_config"):
        build_config({"stream_minibatch_config": {"groups_per_batch": 4}})
