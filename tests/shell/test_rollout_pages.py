"""Per-iteration rollout pages: `iteration_NNNNNN/train.html`, its logtree JSON and the
rollout-summary JSONL, written by the loop on a fake-SDK run (`shell.training._rollout_pages`).

Differences from the cookbook, deliberate: the cookbook builds the page *while* rolling out (env
code's own logtree calls land in it); rlpure's rollouts write no logtree, so the page is built
after the rollouts from the trajectory groups. Env-side logtree calls are therefore not in it;
what the cookbook's rollout code logs (turn stats, step metrics, diagnostics, episode totals) is,
plus what it does not show: the decoded turns and each trajectory's advantage (the configured
estimator's, `rlpure.advantages.compute_advantages` over the whole batch, before constant-group
removal and KL shaping).
"""

from __future__ import annotations

import asyncio
import html
import json
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from rlpure.records import TokensWithLogprobs, Trajectory, TrajectoryGroup, Transition
from shell.config import build_config
from shell.fakes import FakeServiceClient, ScriptedDataset, ScriptedEnv, ScriptedGroupBuilder
from shell.training import read_jsonl, train
from shell.training._rollout_pages import (
    iteration_dir,
    serialize_rollout_summaries,
    write_rollout_report,
)

SUMMARY_KEYS = {
    "schema_version", "split", "iteration", "group_idx", "traj_idx", "tags",
    "sampling_client_step", "total_reward", "final_reward", "trajectory_metrics", "steps",
    "final_ob_len",
}  # fmt: skip
STEP_KEYS = {"step_idx", "ob_len", "ac_len", "reward", "episode_done", "metrics", "logs"}


class _WordTokenizer:
    """Decodes id `i` as `w{i}` (enough to see that the page holds decoded text)."""

    bos_token_id = None
    eos_token_id = 0

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(f"w{i}" for i in ids)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [int(word[1:]) for word in text.split()]


def _dataset(*, turns: int = 1, groups_per_batch: int = 2) -> ScriptedDataset:
    def builder(batch: int, problem: int) -> ScriptedGroupBuilder:
        return ScriptedGroupBuilder(
            lambda _: ScriptedEnv(
                prompt=[1, 40 + problem],
                rewards=[0.25] * turns,
                metrics={"correct": 1.0},
            ),
            group_size=2,
            group_rewards=[1.0, 0.0],
            tags=(f"problem{problem}",),
        )

    return ScriptedDataset(builder, num_batches=2, groups_per_batch=groups_per_batch)


def _run(log_dir: Path, *, tokenizer: Any = None, turns: int = 1, **options: Any) -> None:
    config = build_config(
        {"log_dir": str(log_dir), "backend": "fake", "progress": False, "max_tokens": 4},
        {"max_steps": 2, **options},
    )
    asyncio.run(
        train(
            config,
            dataset=_dataset(turns=turns),
            service_client=FakeServiceClient(seed=0),
            tokenizer=tokenizer,
        )
    )


def _page_text(page: Path) -> str:
    """The page's visible text, tags stripped (what a reader sees, CSS aside)."""
    body = page.read_text().split("<body", 1)[1]
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body)))


def test_each_step_writes_a_report_of_the_first_groups_and_summaries_of_all(
    tmp_path: Path,
) -> None:
    _run(tmp_path, tokenizer=_WordTokenizer(), num_groups_to_log=1)
    for step in (0, 1):
        directory = tmp_path / f"iteration_{step:06d}"
        page = directory / "train.html"
        text = _page_text(page)
        assert f"RL Iteration {step}" in text
        assert "Group 0" in text and "Group 1" not in text  # num_groups_to_log = 1
        assert "Trajectory 0 | total reward 1.250 | final group reward 1.000" in text
        assert "Trajectory 1 | total reward 0.250 | final group reward 0.000" in text
        assert "advantage +0.500" in text and "advantage -0.500" in text  # group-centred
        assert "stop reason" in text and "problem0" in text
        assert "observation:" in text and "action:" in text
        assert "w1 w40" in text  # the observation, decoded by the tokenizer
        assert "Metrics emitted by env.step" in text and "correct" in text
        raw = page.read_text()
        assert raw.count('<details class="lt-details">') == 2  # one per trajectory
        assert "lt-message-observation" in raw and "lt-message-action" in raw
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", raw)  # self-contained
        tree = json.loads((directory / "train_logtree.json").read_text())
        assert tree["title"] == f"RL Iteration {step}"
        records = read_jsonl(directory / "train_rollout_summaries.jsonl")
        assert len(records) == 4  # every group (2) x group size (2), not only the logged one
        assert {tuple(r) == tuple(records[0]) for r in records} == {True}
        assert set(records[0]) == SUMMARY_KEYS and set(records[0]["steps"][0]) == STEP_KEYS
        assert [(r["group_idx"], r["traj_idx"]) for r in records] == [
            (0, 0),
            (0, 1),
            (1, 0),
            (1, 1),
        ]
        assert records[0]["split"] == "train" and records[0]["iteration"] == step
        assert records[0]["sampling_client_step"] == step
        assert records[1]["tags"] == ["problem0"] and records[2]["tags"] == ["problem1"]
        assert records[0]["total_reward"] == 1.25 and records[1]["final_reward"] == 0.0
        assert records[0]["steps"][0]["ob_len"] == 2
    assert (tmp_path / "metrics.jsonl").is_file() and (tmp_path / "samples.jsonl").is_file()


def test_without_a_tokenizer_the_report_shows_token_ids_and_every_turn(tmp_path: Path) -> None:
    _run(tmp_path, turns=2, num_groups_to_log=2)
    text = _page_text(tmp_path / "iteration_000000" / "train.html")
    assert "Group 1" in text
    assert "Turn 1" in text and "Turn 2" in text
    assert "observation: 1 40" in text  # ids joined by spaces
    # turn 2 extends turn 1's observation and action: only its new tokens are shown
    assert "observation: [previous turns] " in text
    assert "2 turn(s)" in text and "total reward 1.500" in text


def test_num_groups_to_log_zero_writes_summaries_but_no_page(tmp_path: Path) -> None:
    _run(tmp_path, num_groups_to_log=0)
    directory = tmp_path / "iteration_000000"
    assert not (directory / "train.html").exists()
    assert len(read_jsonl(directory / "train_rollout_summaries.jsonl")) == 4


def _group() -> TrajectoryGroup:
    transition = Transition(
        ob=[5, 6], ac=TokensWithLogprobs(tokens=[7], logprobs=[-0.5], stop_reason="stop"), reward=0.0,
        episode_done=True, logs={"note": "<b>bold?</b>", "long": "x\n" * 3},
    )  # fmt: skip
    return TrajectoryGroup(
        trajectories_G=[Trajectory(transitions=[transition])] * 2,
        final_rewards_G=[1.0, 0.0],
        metrics_G=[{"correct": 1}, {"correct": 0}],
    )


def test_an_eval_report_uses_the_cookbook_names_and_escapes_env_text(tmp_path: Path) -> None:
    report = write_rollout_report(
        tmp_path,
        step=3,
        groups_P=[_group()],
        tags_P=[["test"]],
        decode=lambda ids: " ".join(map(str, ids)),
        num_groups_to_log=4,
        base_name="eval_test",
        split="eval/test",
        title="Running evaluation test 3",
    )
    directory = iteration_dir(tmp_path, 3)
    assert report.html == str(directory / "eval_test.html")
    assert report.summaries == str(directory / "eval_test_rollout_summaries.jsonl")
    raw = (directory / "eval_test.html").read_text()
    assert "<b>bold?</b>" not in raw and "&lt;b&gt;bold?&lt;/b&gt;" in raw
    text = _page_text(directory / "eval_test.html")
    assert "Running evaluation test 3" in text and "advantage n/a" in text
    assert "note: <b>bold?</b>" in text and "Group metrics" in text
    records = read_jsonl(directory / "eval_test_rollout_summaries.jsonl")
    assert [r["split"] for r in records] == ["eval/test", "eval/test"]
    assert records[0]["steps"][0]["logs"]["note"] == "<b>bold?</b>"


def test_a_later_turn_shows_only_what_it_adds_to_the_previous_turn(tmp_path: Path) -> None:
    def turn(ob: list[int], ac: list[int]) -> Transition:
        action = TokensWithLogprobs(tokens=ac, logprobs=[0.0] * len(ac), stop_reason="stop")
        return Transition(ob=ob, ac=action, reward=0.0, episode_done=False)

    extends = Trajectory(transitions=[turn([5, 6], [7]), turn([5, 6, 7, 99], [8])])
    restarts = Trajectory(transitions=[turn([5, 6], [7]), turn([31, 32], [8])])
    group = TrajectoryGroup(
        trajectories_G=[extends, restarts], final_rewards_G=[0.0, 0.0], metrics_G=[{}, {}]
    )
    write_rollout_report(
        tmp_path,
        step=0,
        groups_P=[group],
        tags_P=[[]],
        decode=lambda ids: " ".join(map(str, ids)),
        num_groups_to_log=1,
    )
    text = _page_text(tmp_path / "iteration_000000" / "train.html")
    assert "observation: [previous turns] 99 action: 8" in text
    assert "observation: 31 32 action: 8" in text  # not a prefix: shown whole


def test_rollout_summaries_refuse_misaligned_tags() -> None:
    with pytest.raises(ValueError, match="taglist_P has 1 entries for 2 groups"):
        serialize_rollout_summaries(
            split="train", iteration=0, trajectory_groups_P=[_group(), _group()], taglist_P=[["a"]]
        )
    with pytest.raises(ValueError, match="sampling_client_steps_P has 3 entries for 1 groups"):
        serialize_rollout_summaries(
            split="train",
            iteration=0,
            trajectory_groups_P=[_group()],
            taglist_P=[["a"]],
            sampling_client_steps_P=[0, 1, 2],
        )


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(
    CHROMIUM is None,
    reason="headless Chromium is not installed (Debian package `chromium`); the page's text is "
    "checked without a browser by the other tests of this file",
)
def test_the_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    assert CHROMIUM is not None
    _run(tmp_path / "run", tokenizer=_WordTokenizer(), num_groups_to_log=1)
    page = tmp_path / "run" / "iteration_000000" / "train.html"
    shot = tmp_path / "train.png"
    common = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
    dom = subprocess.run(
        [*common, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    text = html.unescape(re.sub(r"<[^>]+>", " ", dom.stdout))
    assert "RL Iteration 0" in text and "Trajectory 0 | total reward 1.250" in text
    assert "w1 w40" in text
    subprocess.run(
        [*common, f"--screenshot={shot}", "--window-size=1200,900", page.as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert shot.stat().st_size > 1000


def test_eval_steps_write_eval_test_reports(tmp_path: Path) -> None:
    config = build_config(
        {"log_dir": str(tmp_path), "backend": "fake", "progress": False, "max_tokens": 4},
        {"max_steps": 2, "eval_every": 1, "num_groups_to_log": 1},
    )
    asyncio.run(
        train(
            config,
            dataset=_dataset(),
            service_client=FakeServiceClient(seed=0),
            test_dataset=_dataset(groups_per_batch=3),
        )
    )
    for step in (0, 1, 2):  # step 2: the final evaluation, as the cookbook's end_batch
        directory = tmp_path / f"iteration_{step:06d}"
        text = _page_text(directory / "eval_test.html")
        assert f"Running evaluation test {step}" in text and "Group 1" not in text
        records = read_jsonl(directory / "eval_test_rollout_summaries.jsonl")
        assert {r["split"] for r in records} == {"eval/test"}
        assert len(records) == 2 * 3 * 2  # every test group (2 batches x 3) x group size 2
