"""The training loop's record names and logs: a step's metrics row under the cookbook's keys
(`progress/batch`, the optimizer's own keys verbatim, `time/*` of the cookbook's spans), the
scoring passes counted in the token metrics, and `logs.log` (`run_log_file`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import tinker

from shell.fakes import FakeCheckpointStore, FakeFuture, FakeServiceClient, FakeTrainingClient
from shell.training._logs import LOG_LINE_FORMAT, STEPS_LOGGER, run_log_file
from tests.shell.test_train import _config, _dataset, _metric_lines, _train


class GradNormTrainingClient(FakeTrainingClient):
    """The fake, with the local backend's optimizer metrics (`grad_norm`, no prefix)."""

    def optim_step(self, *args: Any, **kwargs: Any) -> FakeFuture[tinker.OptimStepResponse]:
        super().optim_step(*args, **kwargs)
        response = tinker.OptimStepResponse(metrics={"grad_norm": 0.5 + self.optim_steps})
        return FakeFuture(response, events=self.events, label="optim_step")


def _grad_norm_run(log_dir: Path, **options: Any) -> list[dict[str, Any]]:
    service = FakeServiceClient()
    client = GradNormTrainingClient(
        base_model="fake", rank=8, store=service.store, events=service.events
    )
    _train(_config(log_dir, **options), service, _dataset(2), training_client=client)
    return _metric_lines(log_dir)


def test_a_step_row_carries_the_cookbooks_progress_and_time_keys(tmp_path: Path) -> None:
    rows = _grad_norm_run(tmp_path / "run")
    assert [row["progress/batch"] for row in rows] == [0, 1]
    assert [row["progress/done_frac"] for row in rows] == [0.5, 1.0]
    for row in rows:
        assert not {"progress/step", "time/rollouts_s", "time/train_s", "time/step_s"} & set(row)
        assert {
            "optim/lr",
            "time/total",
            "time/sampling",
            "time/do_train_step_and_get_sampling_client",
            "time/train_step",
            "time/save_checkpoint",
            "env/all/total_cached_ob_tokens",
        } <= set(row)
    # the optimizer's metrics merged verbatim (the cookbook's train_step), not as optim/grad_norm
    assert [row["grad_norm"] for row in rows] == [1.5, 2.5]
    assert not any("optim/grad_norm" in row for row in rows)


def test_the_kl_reference_and_post_update_scoring_count_as_prefill(tmp_path: Path) -> None:
    plain = _grad_norm_run(tmp_path / "plain")
    scored = _grad_norm_run(
        tmp_path / "scored",
        kl_penalty_coef=0.1,
        kl_reference_model="fake",
        compute_post_kl=True,
    )
    for before, after in zip(plain, scored, strict=True):
        trained, datums = after["tokens/trained"], after["batch/num_datums"]
        assert after["tokens/trained"] == before["tokens/trained"]
        assert after["tokens/sampled"] == before["tokens/sampled"]
        # two passes, each prefilling every datum's full sequence (model input + last target)
        extra = after["tokens/prefill_uncached"] - before["tokens/prefill_uncached"]
        assert extra == 2 * (trained + datums)
    assert scored[-1]["tokens/cumulative/prefill_uncached"] == sum(
        row["tokens/prefill_uncached"] for row in scored
    )


# --- logs.log ----------------------------------------------------------------------------------


def test_a_run_writes_logs_log_and_a_resume_appends_to_it(tmp_path: Path) -> None:
    log_dir, store = tmp_path / "run", FakeCheckpointStore()
    root = logging.getLogger()
    handlers = list(root.handlers)
    _train(_config(log_dir, max_steps=1), FakeServiceClient(store=store), _dataset(2))
    assert root.handlers == handlers  # detached after the call
    _train(_config(log_dir), FakeServiceClient(store=store), _dataset(2))
    assert root.handlers == handlers
    lines = (log_dir / "logs.log").read_text().splitlines()
    invocations = [i for i, line in enumerate(lines) if "Command line invocation:" in line]
    assert len(invocations) == 2 and invocations[0] == 0  # one per call, nothing doubled
    assert lines[0].startswith("shell.training._logs:") and " [INFO] " in lines[0]
    steps = [line for line in lines if line.startswith(f"{STEPS_LOGGER}:")]
    assert [line.split(" [INFO] ")[1].split(" |")[0] for line in steps] == ["Step  0", "Step  1"]
    assert any("resuming at step 1" in line for line in lines)


def test_run_log_file_opens_the_root_to_info_for_the_file_only(tmp_path: Path) -> None:
    root = logging.getLogger()
    console: list[str] = []

    class ListHandler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            console.append(record.getMessage())

    handler = ListHandler()
    saved_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    try:
        with run_log_file(tmp_path / "logs.log") as path:
            assert root.level == logging.INFO
            logging.getLogger("some.module").info("an info line")
            logging.getLogger("some.module").warning("a warning")
            logging.getLogger(STEPS_LOGGER).info("Step  0 | reward: 1.000")
            with run_log_file(path):  # the same file again: reused, not a second handler
                logging.getLogger("some.module").info("once")
        assert root.level == logging.WARNING and handler.level == logging.NOTSET
        assert logging.getLogger(STEPS_LOGGER).propagate
    finally:
        root.removeHandler(handler)
        root.setLevel(saved_level)
    assert console == ["a warning"]  # the console shows what it showed before
    text = path.read_text()
    assert "some.module:" in text and "[INFO] an info line" in text
    assert "[WARNING] a warning" in text and "[INFO] Step  0 | reward: 1.000" in text
    assert text.count("[INFO] once") == 1
    assert LOG_LINE_FORMAT == "%(name)s:%(lineno)d [%(levelname)s] %(message)s"  # the cookbook's


def test_run_log_file_keeps_warnings_on_stderr_when_logging_is_unconfigured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    for handler in saved[0]:
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    try:
        with run_log_file(tmp_path / "logs.log"):
            logging.getLogger("some.module").info("quiet")
            logging.getLogger("some.module").warning("loud")
        assert root.handlers == []
    finally:
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])
    err = capsys.readouterr().err
    assert "loud" in err and "quiet" not in err
