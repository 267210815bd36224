"""checkpoints.jsonl across rlpure and tinker-cookbook 0.6.1's `checkpoint_utils`: each reads the
other's rows and resumes at the right batch (on the fake SDK)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

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
    assert [r["step"] for r in resumed] == [0, 1, 2, 3]
    assert resumed[2:] == expected[2:]
