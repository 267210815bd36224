"""What `Checkpointer` saves when (the cookbook's `CheckpointManager`): periodic saves of state
and sampler weights with `ttl_seconds`, rolling state saves with `rolling_ttl_seconds` that
delete the previous rolling state, a final save kept indefinitely; and the rows they write."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from tinker import types

from rlpure.usage import TokenUsage
from shell.config import TrainConfig
from shell.errors import EnvFailure
from shell.fakes import FakeCheckpointStore, FakeFuture, FakeServiceClient, FakeTrainingClient
from shell.training._checkpoints import CHECKPOINTS_FILE, CheckpointRecord, load_checkpoints
from shell.training._resume import last_checkpoint
from shell.training._saves import Checkpointer


class _TtlRecordingClient(FakeTrainingClient):
    """The fake training client, recording the `ttl_seconds` each save was given."""

    def __init__(self, service: FakeServiceClient) -> None:
        super().__init__(base_model="m", rank=1, store=service.store, events=service.events)
        self.ttls: list[tuple[str, str, int | None]] = []

    def save_state(
        self,
        name: str,
        ttl_seconds: int | None = None,
        overwrite: bool = False,
        user_metadata: dict[str, str] | None = None,
    ) -> FakeFuture[types.SaveWeightsResponse]:
        self.ttls.append(("state", name, ttl_seconds))
        return super().save_state(name, ttl_seconds, overwrite, user_metadata)

    def save_weights_for_sampler(
        self,
        name: str,
        ttl_seconds: int | None = None,
        user_metadata: dict[str, str] | None = None,
    ) -> FakeFuture[types.SaveWeightsForSamplerResponse]:
        self.ttls.append(("sampler", name, ttl_seconds))
        return super().save_weights_for_sampler(name, ttl_seconds, user_metadata)


class _FakeRestClient:
    """A scripted REST client deleting states from the fake store (the fake SDK has none)."""

    def __init__(self, store: FakeCheckpointStore, deleted: list[str]) -> None:
        self.store = store
        self.deleted = deleted

    def delete_checkpoint_from_tinker_path(self, tinker_path: str) -> FakeFuture[None]:
        if tinker_path not in self.store.states:
            raise ValueError(f"no checkpoint {tinker_path}")
        del self.store.states[tinker_path]
        self.deleted.append(tinker_path)
        return FakeFuture(None, events=[], label="delete")


class _ServiceWithRest(FakeServiceClient):
    def __init__(self) -> None:
        super().__init__()
        self.deleted: list[str] = []

    def create_rest_client(self) -> _FakeRestClient:
        return _FakeRestClient(self.store, self.deleted)


def _run(
    service: FakeServiceClient,
    client: FakeTrainingClient,
    log_dir: Path,
    *,
    steps: range,
    num_steps: int,
    resumed_from: CheckpointRecord | None = None,
    **options: Any,
) -> list[CheckpointRecord | None]:
    config = TrainConfig(log_dir=str(log_dir), **options)
    saves = Checkpointer(
        client,
        service_client=service,
        log_dir=log_dir,
        config=config,
        num_steps=num_steps,
        resumed_from=resumed_from,
    )

    async def go() -> list[CheckpointRecord | None]:
        return [
            await saves.save(
                step,
                final=step == num_steps,
                rng_key_data=(0, step),
                kl_reference_path=None,
                cumulative_tokens=TokenUsage(sampled=10 * step),
                discarded_tokens=TokenUsage(sampled=step),
            )
            for step in steps
        ]

    return asyncio.run(go())


def _rows(log_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (log_dir / CHECKPOINTS_FILE).read_text().splitlines()]


def test_periodic_saves_hold_sampler_weights_with_the_ttl_and_the_final_one_none(
    tmp_path: Path,
) -> None:
    service = FakeServiceClient()
    client = _TtlRecordingClient(service)
    saved = _run(service, client, tmp_path, steps=range(1, 5), num_steps=4, save_every=2,
                 ttl_seconds=60)  # fmt: skip
    assert [r is not None for r in saved] == [False, True, False, True]
    assert [(kind, ttl) for kind, _, ttl in client.ttls] == [
        ("state", 60), ("sampler", 60), ("state", None), ("sampler", None)
    ]  # fmt: skip
    # submitted together, then awaited (as the cookbook's save_checkpoint_async)
    saves = [e[0] for e in service.events if e[0] != "await" or e[1].startswith("save")]
    assert saves[:2] == ["save_state", "save_weights_for_sampler"]
    rows = _rows(tmp_path)
    assert [r["name"] for r in rows] == ["000002", "final"]
    assert all(r["sampler_path"].startswith("fake://m/sampler/step_") for r in rows)
    assert all("rolling" not in r for r in rows)
    assert rows[-1]["cumulative_tokens"]["sampled"] == 40  # the end totals
    assert rows[-1]["discarded_tokens"]["sampled"] == 4
    assert load_checkpoints(tmp_path)[0].sampler_path == rows[0]["sampler_path"]


def test_rolling_saves_are_state_only_and_delete_the_previous_one(tmp_path: Path) -> None:
    service = _ServiceWithRest()
    client = _TtlRecordingClient(service)
    _run(service, client, tmp_path, steps=range(1, 6), num_steps=5, save_every=3,
         rolling_save_every=1, rolling_ttl_seconds=99, ttl_seconds=None)  # fmt: skip
    rows = _rows(tmp_path)
    assert [(r["name"], r.get("rolling", False), "sampler_path" in r) for r in rows] == [
        ("000001", True, False),
        ("000002", True, False),
        ("000003", False, True),  # periodic falls here: no rolling save
        ("000004", True, False),
        ("final", False, True),
    ]
    assert [ttl for kind, _, ttl in client.ttls if kind == "state"] == [99, 99, None, 99, None]
    # each rolling state deleted once a newer rolling one (or the final) is saved
    assert service.deleted == [rows[0]["state_path"], rows[1]["state_path"], rows[3]["state_path"]]
    assert rows[2]["state_path"] in service.store.states  # periodic ones stay
    # the last row is what resumes; a rolling one reads back as rolling
    last = last_checkpoint(tmp_path)
    assert last is not None and last.final
    rolling = load_checkpoints(tmp_path)[3]
    assert rolling.rolling and rolling.sampler_path is None and rolling.step == 4


def test_a_run_resumed_from_a_rolling_save_deletes_it_once_superseded(tmp_path: Path) -> None:
    service = _ServiceWithRest()
    client = _TtlRecordingClient(service)
    _run(service, client, tmp_path, steps=range(1, 3), num_steps=9, rolling_save_every=1)
    resumed_from = last_checkpoint(tmp_path)
    assert resumed_from is not None and resumed_from.rolling and resumed_from.step == 2
    service.deleted.clear()
    _run(service, client, tmp_path, steps=range(3, 5), num_steps=4, rolling_save_every=1,
         resumed_from=resumed_from)  # fmt: skip
    rows = _rows(tmp_path)
    assert service.deleted == [resumed_from.state_path, rows[2]["state_path"]]
    assert rows[-1]["name"] == "final"


def test_a_run_resumed_from_a_periodic_save_deletes_the_rolling_state_before_it(
    tmp_path: Path,
) -> None:
    # rolling 1, 2 (deletes 1), periodic 3, killed: the resumed run used to know only the row
    # it resumed from, so rolling state 2 stayed for good on the local backend (no TTL)
    service = _ServiceWithRest()
    client = _TtlRecordingClient(service)
    _run(service, client, tmp_path, steps=range(1, 4), num_steps=9, save_every=3,
         rolling_save_every=1)  # fmt: skip
    rows = _rows(tmp_path)
    assert [(r["name"], r.get("rolling", False)) for r in rows] == [
        ("000001", True), ("000002", True), ("000003", False)
    ]  # fmt: skip
    resumed_from = last_checkpoint(tmp_path)
    assert resumed_from is not None and not resumed_from.rolling
    service.deleted.clear()
    _run(service, client, tmp_path, steps=range(4, 5), num_steps=9, save_every=3,
         rolling_save_every=1, resumed_from=resumed_from)  # fmt: skip
    rows = _rows(tmp_path)
    assert service.deleted == [rows[1]["state_path"]]  # by rolling 4, once it was recorded
    assert rows[2]["state_path"] in service.store.states  # the periodic one stays


def test_a_service_without_a_rest_client_keeps_its_rolling_states_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    service = FakeServiceClient()
    with caplog.at_level("WARNING"):
        _run(service, _TtlRecordingClient(service), tmp_path, steps=range(1, 4), num_steps=3,
             rolling_save_every=1)  # fmt: skip
    assert "cannot delete the superseded rolling checkpoint" in caplog.text
    assert [r["name"] for r in _rows(tmp_path)] == ["000001", "000002", "final"]


class _FailingSaveClient(_TtlRecordingClient):
    """Refuses `save_state` for the checkpoint of one step, as a full disk would."""

    def __init__(self, service: FakeServiceClient, *, fail_at: int) -> None:
        super().__init__(service)
        self.fail_at = fail_at

    def save_state(  # type: ignore[override]
        self, name: str, *args: Any, **kwargs: Any
    ) -> FakeFuture[types.SaveWeightsResponse]:
        if name.startswith(f"step_{self.fail_at:06d}_"):
            raise OSError("No space left on device")
        return super().save_state(name, *args, **kwargs)


def test_a_failed_rolling_save_is_a_warning_and_the_run_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    service = _ServiceWithRest()
    client = _FailingSaveClient(service, fail_at=2)
    with caplog.at_level("WARNING"):
        saved = _run(service, client, tmp_path, steps=range(1, 5), num_steps=4,
                     rolling_save_every=1)  # fmt: skip
    assert [r is None for r in saved] == [False, True, False, False]
    assert "the rolling checkpoint after step 2 failed (OSError: No space left" in caplog.text
    rows = _rows(tmp_path)
    assert [r["name"] for r in rows] == ["000001", "000003", "final"]
    # step 1's state stays the latest rolling one until step 3's is saved
    assert service.deleted == [rows[0]["state_path"], rows[1]["state_path"]]
    # a periodic or final save that fails still stops the run
    cases: list[dict[str, Any]] = [{"save_every": 2}, {}]
    for options in cases:
        failing = _FailingSaveClient(service, fail_at=2)
        with pytest.raises(OSError, match="No space left"):
            _run(service, failing, tmp_path / str(len(options)), steps=range(1, 3),
                 num_steps=2 if not options else 4, **options)  # fmt: skip


def test_nothing_is_due_without_cadences_nor_at_the_last_step(tmp_path: Path) -> None:
    service = FakeServiceClient()
    saved = _run(service, _TtlRecordingClient(service), tmp_path, steps=range(1, 4),
                 num_steps=3)  # fmt: skip
    assert [r is None for r in saved] == [True, True, False]
    saves = Checkpointer(
        _TtlRecordingClient(service),
        service_client=service,
        log_dir=tmp_path,
        config=TrainConfig(save_every=1, rolling_save_every=1),
        num_steps=3,
        resumed_from=None,
    )
    assert [saves.due(step) for step in range(5)] == [None, "periodic", "periodic", None, None]


# --- through the loop --------------------------------------------------------------------------


def _train_rows(log_dir: Path, service: FakeServiceClient, **options: Any) -> Any:
    from tests.shell.test_train import _config, _dataset, _train

    failing = options.pop("failing_batches", ())
    return _train(_config(log_dir, **options), service, _dataset(5, failing_batches=failing))


def test_train_saves_periodic_rolling_and_final_rows_as_the_cookbook(tmp_path: Path) -> None:
    service = _ServiceWithRest()
    result = _train_rows(tmp_path, service, save_every=2, rolling_save_every=1)
    rows = _rows(tmp_path)
    assert [(r["name"], r["batch"], r.get("rolling", False)) for r in rows] == [
        ("000001", 1, True), ("000002", 2, False), ("000003", 3, True), ("000004", 4, False),
        ("final", 5, False),
    ]  # fmt: skip
    assert ["sampler_path" in r for r in rows] == [False, True, False, True, True]
    assert service.deleted == [rows[0]["state_path"], rows[2]["state_path"]]
    # the final row holds the run's end totals, the last step's cumulative counts
    last = result.last_metrics
    assert rows[-1]["cumulative_tokens"] == {
        kind: last[f"tokens/cumulative/{kind}"] for kind in rows[-1]["cumulative_tokens"]
    }
    assert rows[-1]["cumulative_tokens"]["sampled"] > 0


def test_a_run_killed_after_a_rolling_save_resumes_from_it_as_if_never_stopped(
    tmp_path: Path,
) -> None:
    from tests.shell.test_train import _without_times

    store = FakeCheckpointStore()
    whole = tmp_path / "whole"
    _train_rows(whole, FakeServiceClient(store=store), rolling_save_every=1)
    killed = tmp_path / "killed"
    with pytest.raises(EnvFailure, match="scripted failure"):
        _train_rows(killed, FakeServiceClient(store=store), rolling_save_every=1,
                    failing_batches=(3,))  # fmt: skip
    resumed_from = last_checkpoint(killed)
    assert resumed_from is not None and resumed_from.rolling and resumed_from.step == 3
    service = _ServiceWithRest()
    service.store = store
    result = _train_rows(killed, service, rolling_save_every=1)
    assert (result.start_step, result.end_step) == (3, 5)
    assert service.deleted[0] == resumed_from.state_path  # superseded by the step-4 save
    metrics = [json.loads(x) for x in (killed / "metrics.jsonl").read_text().splitlines()]
    expected = [json.loads(x) for x in (whole / "metrics.jsonl").read_text().splitlines()]
    assert [_without_times(r) for r in metrics] == [_without_times(r) for r in expected]


def test_the_cookbooks_config_maps_its_checkpoint_options(tmp_path: Path) -> None:
    from shell.cookbook.rl import train
    from tests.shell.test_rl_facade import _config as cookbook_config

    config = cookbook_config(
        tmp_path, save_every=3, ttl_seconds=None, rolling_save_every=2, rolling_ttl_seconds=60
    )
    mapped = train.to_train_config(config, backend="fake")
    assert (mapped.save_every, mapped.ttl_seconds) == (3, None)
    assert (mapped.rolling_save_every, mapped.rolling_ttl_seconds) == (2, 60)
    defaults = train.to_train_config(cookbook_config(tmp_path), backend="fake")
    assert (defaults.ttl_seconds, defaults.rolling_ttl_seconds) == (604800, 7200)


def test_a_periodic_save_can_be_asked_for_at_the_first_batch(tmp_path: Path) -> None:
    service = FakeServiceClient()
    saves = Checkpointer(
        _TtlRecordingClient(service),
        service_client=service,
        log_dir=tmp_path,
        config=TrainConfig(ttl_seconds=5),
        num_steps=3,
        resumed_from=None,
    )
    record = asyncio.run(
        saves.save(0, periodic=True, rng_key_data=(0, 0), kl_reference_path=None,
                   cumulative_tokens=TokenUsage(), discarded_tokens=TokenUsage())
    )  # fmt: skip
    assert record is not None and record.sampler_path is not None
    assert [(r["name"], r["batch"]) for r in _rows(tmp_path)] == [("000000", 0)]
