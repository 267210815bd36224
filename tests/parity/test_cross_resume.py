"""checkpoints.jsonl across rlpure and tinker-cookbook 0.6.1: each reads the other's rows and
resumes at the right batch — `checkpoint_utils` on the fake SDK, then the cookbook's own
`rl.train.main` (with `tinker.ServiceClient` swapped for `shell.local.LocalServiceClient`) and
rlpure's `shell.cookbook.rl.train.main` taking turns on one local log dir, periodic, rolling and final
rows included, and the cookbook's `main` resuming an rlpure run killed after a rolling save.

The local cases train a micro model (`MICRO`) on the cookbook's arithmetic env (the cookbook's
module for its `main`, the ported one for rlpure's); each `main` call compiles the model's
stages, so they take about a minute on 2 shared cores."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.parity.porting import require_cookbook

require_cookbook()

from tinker_cookbook import checkpoint_utils  # noqa: E402

from shell.fakes import FakeCheckpointStore, FakeServiceClient  # noqa: E402
from shell.training import load_checkpoints  # noqa: E402
from tests.shell.test_train import _config, _dataset, _train, _without_times  # noqa: E402


def test_the_cookbook_reads_the_last_checkpoint_of_an_rlpure_run(tmp_path: Path) -> None:
    _train(_config(tmp_path, save_every=2), FakeServiceClient(), _dataset(5))
    ours = load_checkpoints(tmp_path)
    rows = checkpoint_utils.load_checkpoints_file(str(tmp_path))
    assert [(r.name, r.batch, r.state_path) for r in rows] == [
        (r.name, r.step, r.state_path) for r in ours
    ]
    assert [r.name for r in rows] == ["000002", "000004", "final"]
    last = checkpoint_utils.get_last_checkpoint(str(tmp_path))
    assert last is not None
    assert (last.name, last.batch, last.final) == ("final", 5, True)
    assert last.state_path == ours[-1].state_path and last.state_path.startswith("fake://")
    assert last.get("step") == 5 and last.get("rng_key_data") == list(ours[-1].rng_key_data)


def test_rlpure_resumes_a_checkpoint_the_cookbook_saved_as_an_uninterrupted_run(
    tmp_path: Path,
) -> None:
    options = {"seed": 3, "save_every": 100}
    reference = tmp_path / "reference"
    _train(_config(reference, **options), FakeServiceClient(), _dataset(4))

    # the first 2 steps by rlpure, then the cookbook's save_checkpoint_async records the state
    log_dir = tmp_path / "run"
    store = FakeCheckpointStore()
    config = _config(log_dir, **options, max_steps=2)
    _train(config, FakeServiceClient(store=store), _dataset(4))
    (ours,) = load_checkpoints(log_dir)
    (log_dir / "checkpoints.jsonl").unlink()

    async def cookbook_save() -> None:
        service = FakeServiceClient(store=store)
        client = await service.create_training_client_from_state_with_optimizer(ours.state_path)
        await checkpoint_utils.save_checkpoint_async(
            client,
            name="000002",
            log_path=str(log_dir),
            # the cookbook's _loop_state: the next batch and its running token totals
            loop_state={
                "batch": 2,
                "cumulative_tokens": ours.cumulative_tokens.as_dict(),
                "discarded_tokens": ours.discarded_tokens.as_dict(),
            },
            kind="both",
        )

    asyncio.run(cookbook_save())
    (row,) = [json.loads(line) for line in (log_dir / "checkpoints.jsonl").read_text().splitlines()]
    assert "step" not in row and "rng_key_data" not in row and row["batch"] == 2

    service = FakeServiceClient(store=store)
    result = _train(_config(log_dir, **options), service, _dataset(4))
    assert (result.start_step, result.end_step) == (2, 4)
    assert service.events[0] == (
        "create_training_client_from_state_with_optimizer",
        row["state_path"],
    )
    # the re-derived PRNG key draws what the uninterrupted run drew (the steps before the
    # checkpoint ran with max_steps=2, so their progress/done_frac differs)
    resumed = [_without_times(json.loads(x)) for x in (log_dir / "metrics.jsonl").read_text().splitlines()]  # fmt: skip
    expected = [_without_times(json.loads(x)) for x in (reference / "metrics.jsonl").read_text().splitlines()]  # fmt: skip
    # 4: the final totals row (the first call's, at step 2, was dropped with the rows after
    # the checkpoint); the same totals as the uninterrupted run's
    assert [(r["step"], "final_totals" in r) for r in resumed] == [
        (0, False), (1, False), (2, False), (3, False), (4, True),
    ]  # fmt: skip
    assert resumed[2:] == expected[2:]


# --- the cookbook's `main` and rlpure's on one log dir, on the local backend --------------------

MICRO = "test/cross-resume-micro"


def _micro_config() -> Any:
    from rlpure.model import VOCAB_SIZE, ModelConfig

    return ModelConfig(
        vocab_size=VOCAB_SIZE, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=512
    )


def _local_service(states: Path) -> Callable[..., Any]:
    """What a user binds as `tinker.ServiceClient` for the cookbook's `main`: the local options
    fixed, the SDK's keywords passed on."""
    from shell.local import LocalServiceClient

    return functools.partial(
        LocalServiceClient, seed=0, checkpoint_dir=states, model_configs={MICRO: _micro_config()}
    )


@pytest.fixture
def on_local(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[dict[str, list[str]]]:
    """The cookbook's `main` on the local backend (`tinker.ServiceClient` swapped, the byte
    tokenizer registered for `MICRO`, its pricing fetch offline); records its resumes."""
    import tinker
    import tinker_cookbook.rl.train as cookbook_train
    from tinker_cookbook import tokenizer_utils

    from rlpure.model import ByteTokenizer
    from shell.local import LocalServiceClient

    tokenizer_utils.register_tokenizer(MICRO, ByteTokenizer)
    monkeypatch.setattr(cookbook_train, "fetch_model_pricing", lambda model_name: None)
    monkeypatch.setattr(tinker, "ServiceClient", _local_service(tmp_path / "run" / "local_states"))
    resumes: dict[str, list[str]] = {"resume": []}
    resume = LocalServiceClient.create_training_client_from_state_with_optimizer

    def record(self: LocalServiceClient, path: str, *args: Any, **kwargs: Any) -> Any:
        resumes["resume"].append(path)
        return resume(self, path, *args, **kwargs)

    monkeypatch.setattr(
        LocalServiceClient, "create_training_client_from_state_with_optimizer", record
    )
    try:
        yield resumes
    finally:
        tokenizer_utils.unregister_tokenizer(MICRO)


def _options(log_path: Path, max_steps: int, **overrides: Any) -> dict[str, Any]:
    return {
        "learning_rate": 1e-3,
        "model_name": MICRO,
        "recipe_name": "cross_resume",
        "max_tokens": 4,
        "log_path": str(log_path),
        "renderer_name": "role_colon",
        "eval_every": 0,
        "max_steps": max_steps,
        **overrides,
    }


def _builder(module: Any) -> Any:
    return module.ArithmeticDatasetBuilder(
        batch_size=1,
        model_name_for_tokenizer=MICRO,
        renderer_name="role_colon",
        n_batches=6,
        group_size=2,
    )


def _cookbook_main(log_path: Path, max_steps: int, **overrides: Any) -> None:
    import tinker_cookbook.rl.train as cookbook_train
    from tinker_cookbook.recipes.math_rl import arithmetic_env

    config = cookbook_train.Config(
        dataset_builder=_builder(arithmetic_env), **_options(log_path, max_steps, **overrides)
    )
    asyncio.run(cookbook_train.main(config))


def _rlpure_main(log_path: Path, max_steps: int, *, module: Any = None, **overrides: Any) -> Any:
    from shell.cookbook.rl import train
    from tests.parity.porting import ported_module

    module = module or ported_module("recipes/math_rl/arithmetic_env.py")
    config = train.Config(
        dataset_builder=_builder(module), **_options(log_path, max_steps, **overrides)
    )
    service = _local_service(log_path / "local_states")()
    return asyncio.run(train.main(config, service_client=service))


def _trained_steps(log_path: Path) -> list[int]:
    rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]
    return [row["step"] for row in rows if "progress/batch" in row or "progress/step" in row]


def _checkpoint_rows(log_path: Path) -> list[dict[str, Any]]:
    lines = (log_path / "checkpoints.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_rlpure_and_the_cookbooks_main_resume_each_others_local_log_dir(
    tmp_path: Path, on_local: dict[str, list[str]]
) -> None:
    log_path = tmp_path / "run"
    cadence = {"save_every": 2, "rolling_save_every": 1}
    # rlpure writes steps 0-2: a rolling row, a periodic one with sampler weights, the final
    first = _rlpure_main(log_path, 3, **cadence)
    assert (first.start_step, first.end_step) == (0, 3)
    ours = _checkpoint_rows(log_path)
    assert [(r["name"], r.get("rolling", False)) for r in ours] == [
        ("000001", True), ("000002", False), ("final", False)
    ]  # fmt: skip
    assert Path(ours[-1]["state_path"]).is_absolute() and Path(ours[-1]["state_path"]).is_dir()
    assert not Path(ours[0]["state_path"]).exists()  # the rolling state, deleted

    # the cookbook's checkpoint_utils read the rows; its main resumes the final one
    assert checkpoint_utils.get_last_checkpoint(str(log_path)).state_path == ours[-1]["state_path"]
    assert checkpoint_utils.get_last_checkpoint(str(log_path), "sampler_path").name == "final"
    _cookbook_main(log_path, 5, **cadence)
    assert on_local["resume"] == [ours[-1]["state_path"]]
    assert _trained_steps(log_path) == [0, 1, 2, 3, 4]
    theirs = _checkpoint_rows(log_path)[len(ours) :]
    assert [(r["name"], r["batch"], r.get("rolling", False)) for r in theirs] == [
        ("000004", 4, False), ("000005", 5, True), ("final", 5, False)
    ]  # fmt: skip
    # the totals continue across the handover
    assert theirs[-1]["cumulative_tokens"]["sampled"] > ours[-1]["cumulative_tokens"]["sampled"]

    # and rlpure resumes the cookbook's final row in turn
    last = _rlpure_main(log_path, 6, **cadence)
    assert (last.start_step, last.end_step) == (5, 6)
    assert on_local["resume"][-1] == theirs[-1]["state_path"]
    assert _trained_steps(log_path) == [0, 1, 2, 3, 4, 5]
    assert _checkpoint_rows(log_path)[-1]["name"] == "final"


class _Killed(Exception):
    """Stands for the process being killed."""


def test_the_cookbooks_main_resumes_an_rlpure_run_killed_after_a_rolling_save(
    tmp_path: Path, on_local: dict[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.parity.porting import ported_module

    module = ported_module("recipes/math_rl/arithmetic_env.py")
    get_batch = module.ArithmeticDataset.get_batch

    def killed_at_batch_2(self: Any, index: int) -> Any:
        if index == 2:
            raise _Killed
        return get_batch(self, index)

    monkeypatch.setattr(module.ArithmeticDataset, "get_batch", killed_at_batch_2)
    log_path = tmp_path / "run"
    with pytest.raises(_Killed):
        _rlpure_main(log_path, 4, module=module, save_every=0, rolling_save_every=1)
    rows = _checkpoint_rows(log_path)
    assert [(r["name"], r.get("rolling")) for r in rows] == [("000001", True), ("000002", True)]
    last = checkpoint_utils.get_last_checkpoint(str(log_path))
    assert (last.name, last.batch, last.get("rolling")) == ("000002", 2, True)
    assert Path(last.state_path).is_dir() and not Path(rows[0]["state_path"]).exists()

    _cookbook_main(log_path, 3, save_every=0, rolling_save_every=1)
    assert on_local["resume"] == [last.state_path]
    assert _trained_steps(log_path) == [0, 1, 2]
    assert _checkpoint_rows(log_path)[-1]["name"] == "final"
