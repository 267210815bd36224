"""The rooms behind the cookbook facade's checkpoint and utility modules, without the cookbook:
plain checkpoint rows (`shell.training._checkpoints`), run metadata (`shell.run_metadata`),
and the facade modules over them (`shell.cookbook.checkpoint_utils`, `shell.cookbook.utils.*`).
The same modules against the cookbook itself: tests/parity/test_cookbook_utils_parity.py."""

from __future__ import annotations

import asyncio
import dataclasses
import doctest
import json
import logging
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from shell import (
    deprecations,
    metric_sinks,
    run_metadata,
    schedules,
    session_names,
    trace_events,
)
from shell.cookbook import checkpoint_utils
from shell.cookbook.utils import (
    cost_estimation,
    git_rev,
    lr_scheduling,
    ml_log,
    session_naming,
    trace,
)
from shell.cost import load_models_json
from shell.errors import CheckpointError, ConfigError
from shell.fakes import FakeServiceClient
from shell.source_state import source_state
from shell.training._checkpoints import (
    CHECKPOINTS_FILE,
    append_checkpoint_row,
    load_checkpoints,
    read_checkpoint_rows,
)

# --- plain checkpoint rows -----------------------------------------------------------------------


def test_rows_round_trip_as_written_in_the_cookbooks_bytes(tmp_path: Path) -> None:
    rows = [{"name": "000001", "batch": 1, "state_path": "/s", "mine": [1, {"a": None}]}]
    append_checkpoint_row(tmp_path, rows[0])
    assert read_checkpoint_rows(tmp_path) == rows
    assert (tmp_path / CHECKPOINTS_FILE).read_text() == json.dumps(rows[0]) + "\n"


def test_no_file_is_no_rows(tmp_path: Path) -> None:
    assert read_checkpoint_rows(tmp_path / "absent") == []


def test_a_torn_last_row_is_skipped_and_cut_before_the_next_append(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    append_checkpoint_row(tmp_path, {"name": "a"})
    with (tmp_path / CHECKPOINTS_FILE).open("a") as f:
        f.write('{"name": "b", "ba')
    with caplog.at_level(logging.WARNING):
        assert read_checkpoint_rows(tmp_path) == [{"name": "a"}]
    assert "torn last line" in caplog.text
    append_checkpoint_row(tmp_path, {"name": "c"})
    assert read_checkpoint_rows(tmp_path) == [{"name": "a"}, {"name": "c"}]


@pytest.mark.parametrize(
    ("text", "message"),
    [('{"name": "a"}\n{oops\n{"name": "c"}\n', "line 2: not JSON"),
     ('{"name": "a"}\n[1, 2]\n', "line 2: expected a JSON object, got list")],
)  # fmt: skip
def test_a_damaged_row_names_the_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / CHECKPOINTS_FILE).write_text(text)
    with pytest.raises(CheckpointError, match=message):
        read_checkpoint_rows(tmp_path)


def test_a_value_json_cannot_hold_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        append_checkpoint_row(tmp_path, {"name": "a", "x": object()})
    assert read_checkpoint_rows(tmp_path) == []


# --- checkpoint_utils over them ------------------------------------------------------------------


def test_a_recipes_rows_resume_at_its_last_state(tmp_path: Path) -> None:
    client = FakeServiceClient().create_lora_training_client(base_model="m").result()
    for batch in (2, 4):
        checkpoint_utils.save_checkpoint(client, f"{batch:06d}", str(tmp_path), {"batch": batch})
    checkpoint_utils.save_checkpoint(client, "final", str(tmp_path), {"batch": 5}, kind="sampler")
    last = checkpoint_utils.get_last_checkpoint(str(tmp_path))
    assert last is not None
    assert (last.name, last.batch, last.state_path) == ("000004", 4, "fake://m/state/000004")
    sampler = checkpoint_utils.get_last_checkpoint(str(tmp_path), required_key="sampler_path")
    assert sampler is not None and sampler.name == "final"


def test_rlpure_rows_read_as_the_cookbooks_records(tmp_path: Path) -> None:
    """A log dir the rlpure loop wrote: `get_last_checkpoint` gives its last row's cookbook
    keys and keeps rlpure's own in `extra`."""
    row = {
        "name": "000003",
        "batch": 3,
        "state_path": str(tmp_path / "local_states/s"),
        "cumulative_tokens": {"sampled": 1},
        "discarded_tokens": {},
        "step": 3,
        "rng_key_data": [0, 3],
        "final": False,
        "wall_time": 1.0,
        "kl_reference_path": None,
        "relative_state_path": "local_states/s",
    }
    append_checkpoint_row(tmp_path, row)
    (tmp_path / "local_states/s").mkdir(parents=True)
    assert load_checkpoints(tmp_path)[0].step == 3  # also rlpure's own row
    last = checkpoint_utils.get_last_checkpoint(str(tmp_path))
    assert last is not None
    assert (last.batch, last.final, last.get("step"), last.get("relative_state_path")) == (
        3,
        False,
        3,
        "local_states/s",
    )
    assert last.to_dict() == row


def test_save_checkpoint_async_submits_both_saves_before_awaiting(tmp_path: Path) -> None:
    service = FakeServiceClient()
    client = service.create_lora_training_client(base_model="m").result()
    client.events.clear()
    paths = asyncio.run(
        checkpoint_utils.save_checkpoint_async(client, "x", str(tmp_path), {}, kind="both")
    )
    assert paths == {"state_path": "fake://m/state/x", "sampler_path": "fake://m/sampler/x"}
    names = [event[0] for event in client.events]
    assert names.index("save_weights_for_sampler") < names.index("await")


# --- run metadata --------------------------------------------------------------------------------


class _Run:
    def __init__(self, metadata: dict[str, str] | None) -> None:
        self.user_metadata = metadata


class _Ready:
    def __init__(self, value: Any) -> None:
        self._value = value

    def result(self) -> Any:
        return self._value

    def __await__(self) -> Any:
        yield from asyncio.sleep(0).__await__()
        return self._value


class _Rest:
    def __init__(self, runs: dict[str, _Run]) -> None:
        self._runs = runs

    def get_training_run_by_tinker_path(self, tinker_path: str) -> _Ready:
        if tinker_path not in self._runs:
            raise ValueError(f"unknown checkpoint {tinker_path}")
        return _Ready(self._runs[tinker_path])


class _Service:
    def __init__(self, runs: dict[str, _Run]) -> None:
        self._runs = runs

    def create_rest_client(self) -> _Rest:
        return _Rest(self._runs)


SERVICE = _Service({"t://a": _Run({"renderer_name": "qwen3"}), "t://b": _Run(None)})


@pytest.mark.parametrize(("path", "expected"), [("t://a", "qwen3"), ("t://b", None)])
def test_the_renderer_recorded_for_a_checkpoint(path: str, expected: str | None) -> None:
    assert run_metadata.checkpoint_renderer_name(SERVICE, path) == expected
    assert asyncio.run(run_metadata.checkpoint_renderer_name_async(SERVICE, path)) == expected


def test_a_failed_lookup_is_a_warning_and_no_renderer(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert run_metadata.checkpoint_renderer_name(SERVICE, "t://none") is None
    assert "Could not fetch renderer metadata for checkpoint t://none" in caplog.text


def test_a_renderer_mismatch_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        assert run_metadata.check_checkpoint_renderer("p", expected="a", recorded="a")
        assert run_metadata.check_checkpoint_renderer("p", expected="a", recorded=None)
        assert not run_metadata.check_checkpoint_renderer("p", expected="a", recorded="b")
    assert [r.levelname for r in caplog.records] == ["INFO", "INFO", "WARNING"]


def test_recipe_metadata_names_the_recipe_and_this_projects_version() -> None:
    assert run_metadata.recipe_metadata("r") == {
        "recipe_name": "r",
        "git_rev": run_metadata.code_version(),
    }
    assert run_metadata.code_version() != "unknown"


# --- source state, metric sinks, ml_log ----------------------------------------------------------


def _module_at(path: Path, name: str) -> ModuleType:
    path.mkdir(parents=True, exist_ok=True)
    (path / f"{name}.py").write_text("X = 1\n")
    module = ModuleType(name)
    module.__file__ = str(path / f"{name}.py")
    return module


def test_source_state_gives_each_repos_commit_and_diff(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    module = _module_at(repo, "mod")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git[:3], "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "c"], check=True)
    head = subprocess.run([*git[:3], "rev-parse", "HEAD"], capture_output=True, text=True)
    clean = source_state([module, module])
    assert (
        clean
        == f"### repo: {repo.resolve()} @ {head.stdout.strip()}\nmodules: mod\n(no local changes)\n"
    )
    (repo / "mod.py").write_text("X = 2\n")
    dirty = source_state([module])
    assert "-- repo-wide (vs HEAD, staged+unstaged) --\n" in dirty
    assert "-X = 1\n+X = 2\n" in dirty


def test_source_state_notes_a_module_outside_any_repo(tmp_path: Path) -> None:
    module = _module_at(tmp_path / "plain", "loose")
    text = source_state([module])
    if "### repo:" in text:  # the temporary directory is itself inside a repository
        pytest.skip("tmp_path lies inside a git repository")
    where = (tmp_path / "plain").resolve()
    assert text == f"### module: loose (not in a git repository)\nmodule_path: {where}\n"


def test_a_config_json_cannot_hold_is_written_as_its_type(tmp_path: Path) -> None:
    path = metric_sinks.write_config_json(tmp_path, {"a": 1, "o": object(), "f": json.dumps})
    # a function has a __dict__, so it is written as {} (the cookbook's rule order)
    assert json.loads(path.read_text()) == {"a": 1, "o": "<class 'object'>", "f": {}}


def test_the_console_table_hides_aggregates_and_formats_floats() -> None:
    text = metric_sinks.metrics_table_text({"b": 0.5, "a:count": 3, "c": "s"}, step=7)
    assert text is not None
    assert "Step 7" in text and "0.500000" in text and "a:count" not in text
    assert metric_sinks.metrics_table_text({"x:total": 1.0}) is None


def test_ml_log_writes_metrics_rows_and_closes(tmp_path: Path) -> None:
    ml_logger = ml_log.setup_logging(
        str(tmp_path), config={"lr": 0.1}, do_configure_logging_module=False
    )
    ml_logger.log_metrics({"reward": float("inf"), "n": np.int64(3)}, step=0)
    ml_logger.log_summary({"total": 1})
    ml_logger.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"step": 0, "reward": None, "n": 3}, {"total": 1}]
    assert json.loads((tmp_path / "config.json").read_text()) == {"lr": 0.1}
    assert (tmp_path / "code.diff").read_text().startswith("### ")
    assert ml_logger.store is None


def test_ml_log_refuses_a_cloud_log_dir() -> None:
    with pytest.raises(ConfigError, match="only local directories"):
        ml_log.setup_logging("s3://bucket/run")


# --- schedules, run naming -----------------------------------------------------------------------


@pytest.mark.parametrize("module", [schedules, session_names, run_metadata, deprecations])
def test_the_examples_in_the_docstrings_hold(module: ModuleType) -> None:
    assert doctest.testmod(module).failed == 0


def test_schedules_end_at_zero_and_start_at_one() -> None:
    for schedule in ("linear", "cosine"):
        assert schedules.lr_multiplier(schedule, step=0, total_steps=9) == 1.0
        assert schedules.lr_multiplier(schedule, step=9, total_steps=9) == pytest.approx(0.0)
    assert schedules.lr_multiplier("constant", step=5, total_steps=2) == 1.0


@pytest.mark.parametrize(
    ("schedule", "total", "message"),
    [("linear", 0, "total_steps must be positive, got 0"), ("step", 3, "one of .'linear'")],
)
def test_a_bad_schedule_is_a_config_error(schedule: str, total: int, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        lr_scheduling.compute_schedule_lr_multiplier(schedule, 0, total)  # type: ignore[arg-type]


def test_session_names() -> None:
    assert session_naming.default_cookbook_session_name("rl-loop") == "cookbook-rl-loop"
    assert session_naming.default_cookbook_session_name("x", wandb_name="mine") == "mine"
    assert session_naming.default_cookbook_session_name("!!", None, "A b") == "cookbook-a-b"
    assert session_naming.resolve_session_display_name(session_name=None, wandb_name="") is None
    assert git_rev.recipe_user_metadata("r")["recipe_name"] == "r"


def test_a_deprecation_past_its_removal_version_raises() -> None:
    with pytest.raises(
        RuntimeError, match=r"'x' is deprecated\. It will be removed in version 0\.2"
    ):
        deprecations.warn_deprecated("x", current_version="0.2.0.dev1", removal_version="0.2")
    with pytest.warns(DeprecationWarning, match=r"^'x' is deprecated\. Use y\.$"):
        deprecations.warn_deprecated("x", current_version="0.2", message="Use y.")


# --- cost estimation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "no such file"),
        ("[1", "malformed JSON"),
        ('{"a": 1}', "expected a JSON list of objects"),
    ],
)
def test_a_bad_models_json_is_one_config_error(
    tmp_path: Path, text: str | None, message: str
) -> None:
    path = tmp_path / "models.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError, match=f"url {path}: {message}"):
        load_models_json(path)


def test_the_cost_tracker_prices_its_totals() -> None:
    rates = cost_estimation.TokenCostRates(1.0, 0.5, 2.0, 3.0)
    tracker = cost_estimation.CostTracker(rates)
    step = tracker.record_step(cost_estimation.TokenUsage(sampled=10**6, trained=2 * 10**6))
    assert (step["cost/step_usd"], step["tokens/trained"]) == (8.0, 2 * 10**6)
    tracker.record_discarded_sampling(cost_estimation.TokenUsage(prefill_uncached=10**6))
    totals = tracker.cumulative_metrics()
    assert (totals["cost/cumulative_usd"], totals["cost/discarded_usd"]) == (9.0, 1.0)
    assert dataclasses.asdict(tracker.cumulative)["prefill_uncached"] == 10**6


# --- trace events, spans -------------------------------------------------------------------------


def test_spans_are_traced_only_while_tracing(tmp_path: Path) -> None:
    with trace_events.traced("before") as attributes:
        attributes["x"] = 1  # goes nowhere
    path = tmp_path / "t" / "trace.jsonl"
    trace_events.start_tracing(path)
    try:
        with trace_events.traced("outer"):
            trace_events.current_attributes()["k"] = "v"
            with trace_events.traced("inline", own_attributes=False):
                trace_events.current_attributes()["j"] = 2
    finally:
        trace_events.stop_tracing()
    assert trace_events.active_trace() is None
    with trace_events.traced("after"):
        pass
    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(e["name"], e["ph"]) for e in events] == [
        ("outer", "B"), ("thread_name", "M"), ("process_name", "M"),
        ("inline", "B"), ("inline", "E"), ("outer", "E"),
    ]  # fmt: skip
    assert events[-1]["args"]["k"] == "v" and events[-1]["args"]["j"] == 2
    assert events[0]["ts"] <= events[-1]["ts"] and events[0]["tid"] == events[-1]["tid"]


@pytest.mark.parametrize("content", [None, "{not json\n"])
def test_the_trace_converter_says_what_is_wrong_with_its_input_in_one_line(
    tmp_path: Path, content: str | None
) -> None:
    source = tmp_path / "trace_events.jsonl"
    if content is not None:
        source.write_text(content)
    done = subprocess.run(
        [sys.executable, "-m", "shell.cookbook.utils.trace", str(source), str(tmp_path / "t.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.startswith(f"convert: {source}: ") and done.stderr.count("\n") == 1
    assert not (tmp_path / "t.json").exists()


def test_an_iteration_window_times_scopes_into_the_step_timer() -> None:
    @trace.scope
    def work() -> int:
        return 3

    with trace.trace_iteration(step=1) as window:
        assert work() == 3
        window.record_span("by_hand", 0.0, 0.5)
    metrics = window.get_timing_metrics()
    assert metrics["time/by_hand"] == 0.5 and "time/work" in metrics and "time/total" in metrics
    assert work() == 3 and len(window.spans) == 2  # outside the iteration: not recorded
