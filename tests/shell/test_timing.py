"""Phase spans (`shell.timing`): the recorder, its `time/*` metrics, and the
`timing_spans.jsonl` rows a training run writes (fake SDK)."""

from __future__ import annotations

import asyncio
import doctest
import itertools
import json
from pathlib import Path

import pytest

from shell import timing as _timing
from shell.fakes import FakeCheckpointStore, FakeServiceClient
from shell.timing import (
    SpanRecord,
    StepTimer,
    recording,
    span,
    span_dicts,
    step_timer,
    timing_metrics,
)
from shell.trace_events import start_tracing, stop_tracing
from shell.training._logs import read_jsonl
from tests.shell.test_train import _config, _dataset, _metric_lines, _train


def _ticking(start: float = 0.0, tick: float = 1.0):  # type: ignore[no-untyped-def]
    counter = itertools.count()
    return lambda: start + tick * next(counter)


def test_a_timer_records_spans_in_the_order_they_end_with_both_clocks() -> None:
    timer = StepTimer(clock=_ticking(), wall_clock=_ticking(1000.0, 2.0))
    with timer.span("outer"), timer.span("inner"):
        pass
    inner, outer = timer.spans
    assert (inner.name, inner.start_time, inner.end_time) == ("inner", 1.0, 2.0)
    assert (outer.name, outer.start_time, outer.end_time) == ("outer", 0.0, 3.0)
    assert (outer.wall_start, outer.wall_end) == (1000.0, 1006.0)
    assert outer.duration == 3.0


def test_a_span_that_raises_is_still_recorded() -> None:
    timer = StepTimer()
    with pytest.raises(RuntimeError), timer.span("boom"):
        raise RuntimeError("x")
    assert [s.name for s in timer.spans] == ["boom"]


def test_span_is_a_no_op_outside_a_step_timer_and_records_into_the_current_one() -> None:
    with span("nowhere"):
        pass
    with step_timer() as timer, span("here"):
        pass
    assert [s.name for s in timer.spans] == ["here"]
    assert timer.total is not None and timer.total >= timer.spans[0].duration
    with span("nowhere again"):  # the timer is no longer current
        pass
    assert len(timer.spans) == 1


def test_span_is_traced_while_a_trace_is_open_timer_or_not(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    with span("before"):  # no trace open: nothing to write
        pass
    start_tracing(path)
    try:
        with span("free"), step_timer() as timer, span("timed"), span("untraced", trace=False):
            pass
    finally:
        stop_tracing()
    with span("after"):
        pass
    events = [json.loads(line) for line in path.read_text().splitlines()]
    spans = [(e["ph"], e["name"]) for e in events if e["ph"] in "BE"]
    assert spans == [("B", "free"), ("B", "timed"), ("E", "timed"), ("E", "free")]
    assert [s.name for s in timer.spans] == ["untraced", "timed"]


def test_tasks_gathered_inside_a_step_record_into_its_timer() -> None:
    async def sample(i: int) -> int:
        with span("policy_sample"):
            await asyncio.sleep(0)
        return i

    async def step() -> StepTimer:
        with step_timer() as timer:
            await asyncio.gather(*(sample(i) for i in range(3)))
        return timer

    timer = asyncio.run(step())
    assert [s.name for s in timer.spans] == ["policy_sample"] * 3
    assert timer.metrics()["time/policy_sample:count"] == 3


def test_recording_makes_a_timer_current_without_touching_its_total() -> None:
    timer = StepTimer()
    with step_timer(timer):
        pass
    total = timer.total
    with recording(timer), span("save_checkpoint_async"):
        pass
    assert timer.total == total and [s.name for s in timer.spans] == ["save_checkpoint_async"]


def test_nested_step_timers_restore_the_outer_one() -> None:
    with step_timer() as outer:
        with step_timer() as inner, span("a"):
            pass
        with span("b"):
            pass
    assert [s.name for s in inner.spans] == ["a"] and [s.name for s in outer.spans] == ["b"]


def _record(name: str, start: float, end: float, wall: float = 100.0) -> SpanRecord:
    return SpanRecord(
        name=name, start_time=start, end_time=end, wall_start=wall + start, wall_end=wall + end
    )


def test_timing_metrics_are_the_cookbooks_aggregates() -> None:
    spans = [
        _record("sampling", 0.0, 2.0),
        _record("env_step", 0.0, 1.0),
        _record("env_step", 1.0, 4.0),
        _record("env_step", 4.0, 6.0),
    ]
    assert timing_metrics(spans, total=7.0) == {
        "time/sampling": 2.0,
        "time/env_step:total": 6.0,
        "time/env_step:count": 3,
        "time/env_step:mean": 2.0,
        "time/env_step:max": 3.0,
        "time/total": 7.0,
    }
    assert timing_metrics([]) == {}
    assert timing_metrics([], total=1.5) == {"time/total": 1.5}


def test_span_dicts_are_relative_to_the_earliest_start() -> None:
    spans = [_record("b", 2.0, 3.0), _record("a", 1.0, 4.0)]
    assert span_dicts(spans) == [
        {"name": "b", "duration": 1.0, "wall_start": 1.0, "wall_end": 2.0},
        {"name": "a", "duration": 3.0, "wall_start": 0.0, "wall_end": 3.0},
    ]
    assert span_dicts([]) == []


def test_doctests() -> None:
    assert doctest.testmod(_timing).failed == 0


# --- timing_spans.jsonl of a run ---------------------------------------------------------------

_STEP_SPANS = {
    "sampling",
    "do_train_step_and_get_sampling_client",
    "prepare_minibatch",
    "assemble_training_data",
    "train_step",
    "compute_full_batch_metrics_and_get_sampling_client",
    "compute_kl_sample_train",
    "save_checkpoint_and_get_sampling_client",
    "save_checkpoint",
}
_SUBSTEP_SPANS = {
    f"train/{call}_substep_{k}_{part}"
    for k in (0, 1)
    for call, part in [
        ("fwd_bwd", "mb_0_enqueue"),
        ("optim", "enqueue"),
        ("fwd_bwd", "mb_0_consume"),
        ("optim", "consume"),
    ]
}


def test_a_run_writes_one_spans_row_per_step_with_the_cookbooks_schema(tmp_path: Path) -> None:
    log_dir = tmp_path / "run"
    config = _config(log_dir, save_every=2, num_substeps=2, eval_every=2)
    _train(config, FakeServiceClient(), _dataset(3), test_dataset=_dataset(1))
    rows = read_jsonl(log_dir / "timing_spans.jsonl")
    assert [row["step"] for row in rows] == [0, 1, 2, 3]  # 3: final evaluation and checkpoint
    for row in rows:
        assert set(row) == {"step", "spans"}
        for found in row["spans"]:
            assert set(found) == {"name", "duration", "wall_start", "wall_end"}
            assert found["duration"] >= 0 and found["wall_end"] >= found["wall_start"] >= 0
        assert min(found["wall_start"] for found in row["spans"]) == 0.0
    names = [{found["name"] for found in row["spans"]} for row in rows]
    evals = {"run_evals", "run_evaluations_parallel", "run_single_evaluation"}
    # each group's rollout and its env/sampler calls, as the cookbook's rollouts time them
    rollout = {"env_initial_observation", "policy_sample", "env_step", "compute_group_rewards"}
    group = {"do_group_rollout_and_filter_constant_reward"}
    train = _STEP_SPANS | _SUBSTEP_SPANS | rollout | group
    assert names[0] == train | evals  # eval_every=2: steps 0 and 2
    assert names[1] == train | {"save_checkpoint_async"}  # save_every=2
    assert names[2] == train | evals
    assert names[3] == evals | rollout | group | {"save_checkpoint_async"}  # the eval's rollouts

    metrics = _metric_lines(log_dir)
    trained = [row for row in metrics if "final_eval" not in row]
    for row, spans in zip(trained, rows, strict=False):
        durations = {found["name"]: found["duration"] for found in spans["spans"]}
        assert row["time/sampling"] == pytest.approx(durations["sampling"])
        assert row["time/total"] >= row["time/sampling"] + row["time/train_step"]
    # the checkpoint is saved after the step's metrics row is written (a kill while saving
    # keeps the row), so its span is in timing_spans.jsonl only
    assert "time/save_checkpoint_async" not in trained[1]


def test_a_resume_drops_the_spans_rows_logged_after_its_checkpoint(tmp_path: Path) -> None:
    log_dir, store = tmp_path / "run", FakeCheckpointStore()
    _train(_config(log_dir, max_steps=2), FakeServiceClient(store=store), _dataset(4))
    assert [row["step"] for row in read_jsonl(log_dir / "timing_spans.jsonl")] == [0, 1, 2]
    _train(_config(log_dir), FakeServiceClient(store=store), _dataset(4))
    # the first call's final line (step 2) is dropped; step 2 is the resumed run's
    assert [row["step"] for row in read_jsonl(log_dir / "timing_spans.jsonl")] == [0, 1, 2, 3, 4]
