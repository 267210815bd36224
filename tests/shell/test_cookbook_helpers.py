"""The cookbook's helper modules as env code uses them: exceptions, misc_utils, cli_utils,
logtree (+ formatters) and preference, without the cookbook installed."""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tinker
from hypothesis import given
from hypothesis import strategies as st

from rlpure.model import ByteTokenizer
from shell import errors
from shell.cookbook import cli_utils, exceptions, renderers
from shell.cookbook.preference import preference_datasets
from shell.cookbook.preference.types import (
    Comparison,
    ComparisonRendererFromChatRenderer,
    LabeledComparison,
    PreferenceModelFromChatRenderer,
)
from shell.cookbook.utils import logtree, misc_utils
from shell.cookbook.utils.logtree_formatters import ConversationFormatter
from shell.training._lock import LOCK_FILE, LogDirLockedError

# --- exceptions ----------------------------------------------------------------------------------


def test_configuration_error_is_config_error_both_ways() -> None:
    assert exceptions.ConfigurationError is errors.ConfigError
    assert exceptions.TinkerCookbookError is errors.RlpureError
    with pytest.raises(exceptions.ConfigurationError):
        raise errors.ConfigError("ours")
    with pytest.raises(errors.ConfigError):
        raise exceptions.ConfigurationError("cookbook's")
    assert issubclass(exceptions.ConfigurationError, ValueError)


@pytest.mark.parametrize(
    ("name", "stdlib"),
    [
        ("ConfigurationError", ValueError),
        ("DataError", ValueError),
        ("DataFormatError", ValueError),
        ("DataValidationError", ValueError),
        ("RendererError", ValueError),
        ("TrainingError", RuntimeError),
        ("CheckpointError", RuntimeError),
        ("AllTrajectoriesFailedError", RuntimeError),
        ("WeightsDownloadError", RuntimeError),
        ("WeightsMergeError", ValueError),
        ("WeightsAdapterError", ValueError),
        ("SandboxError", RuntimeError),
        ("EvalError", RuntimeError),
        ("EvalTimeoutError", TimeoutError),
        ("EvalGradingError", RuntimeError),
        ("BenchmarkNotFoundError", KeyError),
    ],
)
def test_each_cookbook_exception_is_a_project_error_and_its_stdlib_error(
    name: str, stdlib: type[BaseException]
) -> None:
    cls = getattr(exceptions, name)
    assert issubclass(cls, exceptions.TinkerCookbookError)
    assert issubclass(cls, stdlib)
    copy = pickle.loads(pickle.dumps(cls("boom")))
    assert type(copy) is cls
    assert copy.args == ("boom",)


def test_cookbook_errors_meet_the_shells_handlers() -> None:
    assert issubclass(exceptions.AllTrajectoriesFailedError, errors.GroupRolloutError)
    assert issubclass(exceptions.CheckpointError, exceptions.TrainingError)
    assert issubclass(exceptions.SandboxError, errors.EnvFailure)  # tolerant strategies retry it
    assert set(exceptions.__all__) == {
        n for n in dir(exceptions) if not n.startswith("_") and n[0].isupper() and n != "errors"
    }


# --- misc_utils ----------------------------------------------------------------------------------


@given(st.integers(1, 200).flatmap(lambda n: st.tuples(st.just(n), st.integers(1, n))))
def test_split_list_covers_the_list_in_parts_differing_by_at_most_one(nk: tuple[int, int]) -> None:
    n, k = nk
    items = list(range(n))
    parts = misc_utils.split_list(items, k)
    assert len(parts) == k
    assert [x for part in parts for x in part] == items
    sizes = {len(part) for part in parts}
    assert max(sizes) - min(sizes) <= 1
    assert min(sizes) >= 1


def test_split_list_puts_the_longer_part_last_as_the_cookbook() -> None:
    assert misc_utils.split_list([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4, 5]]
    assert [len(p) for p in misc_utils.split_list(range(30), 22)].count(2) == 8
    # float cut points: 30 into 22 is not floor(i*30/22) (which would give part 4 size 1)
    assert [len(p) for p in misc_utils.split_list(list(range(30)), 22)][:6] == [1, 1, 2, 1, 1, 2]


@pytest.mark.parametrize(("n", "k"), [(3, 0), (3, -1), (3, 4), (0, 1)])
def test_split_list_refuses_impossible_splits(n: int, k: int) -> None:
    with pytest.raises(ValueError, match=r"num_splits|Cannot split"):
        misc_utils.split_list(list(range(n)), k)


def test_safezip_all_same_dict_mean_concat_not_none() -> None:
    assert list(misc_utils.safezip([1, 2], "ab")) == [(1, "a"), (2, "b")]
    with pytest.raises(ValueError):
        list(misc_utils.safezip([1, 2], "a"))
    assert (
        misc_utils.all_same([]) and misc_utils.all_same([3, 3]) and not misc_utils.all_same([3, 4])
    )
    assert misc_utils.dict_mean([{"a": 1, "b": None}, {"a": 2}, {"b": None, "c": 4}]) == {
        "a": 1.5,
        "c": 4.0,
    }
    assert misc_utils.concat_lists([[1], [], [2, 3]]) == [1, 2, 3]
    assert misc_utils.not_none(0) == 0
    with pytest.raises(AssertionError):
        misc_utils.not_none(None)


def test_iteration_dir_lookup_func_and_timed(caplog: pytest.LogCaptureFixture) -> None:
    assert misc_utils.iteration_dir("/logs", 7) == Path("/logs/iteration_000007")
    assert misc_utils.iteration_dir("", 7) is None
    assert misc_utils.iteration_dir(None, 7) is None
    assert misc_utils.lookup_func("json:dumps") is json.dumps
    assert misc_utils.lookup_func("dumps", default_module="json") is json.dumps
    for bad in ("dumps", "a:b:c"):
        with pytest.raises(ValueError, match="Invalid path"):
            misc_utils.lookup_func(bad)
    metrics: dict[str, Any] = {}
    with caplog.at_level(logging.INFO), misc_utils.timed("step", metrics):
        pass
    assert metrics["time/step"] >= 0.0
    assert "step took" in caplog.text
    failed: dict[str, Any] = {}
    with pytest.raises(KeyError), misc_utils.timed("broken", failed):
        raise KeyError("x")
    assert failed == {}  # the cookbook records nothing for a block that raised


# --- cli_utils -----------------------------------------------------------------------------------


def test_runs_path_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cli_utils.RUNS_DIR_ENV_VAR, "/runs")
    assert cli_utils.runs_path("math_rl", "r1") == "/runs/math_rl/r1"
    monkeypatch.setenv(cli_utils.RUNS_DIR_ENV_VAR, "")
    assert cli_utils.runs_path("x") == str(Path("~/tinker-runs/x").expanduser())
    assert cli_utils.model_name_from_argv(["model_name=a", "x=1", "model_name=b"], "d") == "b"
    assert cli_utils.model_name_from_argv([], "d") == "d"


def test_check_log_dir_behaviours(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "missing"
    cli_utils.check_log_dir(str(missing), "raise")  # absent: nothing to do
    run = tmp_path / "run"
    run.mkdir()
    cli_utils.check_log_dir(str(run), "resume")
    assert run.exists()
    with pytest.raises(exceptions.ConfigurationError, match="already exists"):
        cli_utils.check_log_dir(str(run), "raise")
    answers = iter(["what", "resume"])
    monkeypatch.setattr("builtins.input", lambda _prompt: next(answers))
    cli_utils.check_log_dir(str(run), "ask")
    assert run.exists()
    monkeypatch.setattr("builtins.input", lambda _prompt: "exit")
    with pytest.raises(SystemExit) as exited:
        cli_utils.check_log_dir(str(run), "ask")
    assert exited.value.code == 0
    cli_utils.check_log_dir(str(run), "delete")
    assert not run.exists()
    run.mkdir()
    with pytest.raises(AssertionError, match="Invalid behavior_if_exists"):
        cli_utils.check_log_dir(str(run), "bogus")  # type: ignore[arg-type]


def test_deleting_a_log_dir_a_run_holds_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a run holds its log dir's flock; deleting the dir under it used to succeed (the lock
    # file went with it, so the next run locked a new one while the first kept writing)
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints.jsonl").write_text("{}\n")
    held = os.open(run / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.pwrite(held, b"4242 elsewhere\n", 0)
        with pytest.raises(LogDirLockedError, match="pid 4242 on elsewhere"):
            cli_utils.check_log_dir(str(run), "delete")
        monkeypatch.setattr("builtins.input", lambda _prompt: "delete")
        with pytest.raises(LogDirLockedError):
            cli_utils.check_log_dir(str(run), "ask")
        assert (run / "checkpoints.jsonl").read_text() == "{}\n"
    finally:
        os.close(held)
    cli_utils.check_log_dir(str(run), "delete")  # released: deleted
    assert not run.exists()


# --- logtree -------------------------------------------------------------------------------------


def test_logtree_does_nothing_outside_a_trace() -> None:
    @logtree.scope_header_decorator
    def double(x: int) -> int:
        logtree.log_text("inside")
        return 2 * x

    with logtree.scope_header("no trace"), logtree.scope_details("d"), logtree.scope_div():
        logtree.log_text("x")
        logtree.table({"a": 1})  # would be a TypeError while logging
        logtree.table_from_dict_of_lists({"a": [1], "b": [1, 2]})  # likewise a ValueError
        logtree.log_formatter(ConversationFormatter(messages=[{"role": "user", "content": "hi"}]))
    assert double(3) == 6
    assert logtree.flush_trace() is False


def _section_texts(node: dict[str, Any]) -> list[str]:
    """Every text leaf under `node`, in order."""
    out: list[str] = []
    for child in node["children"]:
        out.extend([child] if isinstance(child, str) else _section_texts(child))
    return out


def _find(node: dict[str, Any], tag: str) -> list[dict[str, Any]]:
    found = [node] if node["tag"] == tag else []
    for child in node["children"]:
        if isinstance(child, dict):
            found.extend(_find(child, tag))
    return found


def test_logtree_builds_a_tree_with_nested_header_levels(tmp_path: Path) -> None:
    path = tmp_path / "iteration_000000" / "train.html"
    with logtree.init_trace("Iteration 0", path=path) as trace:
        with logtree.scope_header("Group 0", class_="grp", data__idx=0):
            logtree.log_text("reward <1.0>")
            with (
                logtree.scope_header("L3"),
                logtree.scope_header("L4"),
                logtree.scope_header("L5"),
                logtree.scope_header("L6"),
                logtree.scope_header("still L6"),
            ):
                logtree.header("inline")
        logtree.details("long\ntext", summary="CoT")
        logtree.table_from_dict({"b": 2, "a": 1}, caption="m", sort_by="key")
        logtree.table([{"x": 1, "y": 2}, {"x": 3}])
        logtree.table([[1, 2], (3, 4)])
        logtree.table_from_dict_of_lists({"n": ["a", "b"], "s": [1, 2]}, order=["s", "n"])
        with pytest.raises(TypeError, match="table_from_dict"):
            logtree.table({"a": 1})
        with pytest.raises(ValueError, match="equal length"):
            logtree.table_from_dict_of_lists({"a": [1], "b": [1, 2]})
    tree = trace.to_dict()
    root = tree["root"]
    assert tree["title"] == "Iteration 0"
    assert [c["tag"] for c in root["children"][:3]] == ["h1", "div", "section"]
    section = root["children"][2]
    assert section["attrs"] == {"class": "grp", "data-idx": "0"}
    headers = [h for level in range(2, 7) for h in _find(root, f"h{level}")]
    levels = {_section_texts(h)[0]: h["tag"] for h in headers}
    assert levels == {
        "Group 0": "h2",
        "L3": "h3",
        "L4": "h4",
        "L5": "h5",
        "L6": "h6",
        "still L6": "h6",
        "inline": "h6",
    }
    assert "reward &lt;1.0&gt;" in _section_texts(section)
    cells = [_section_texts(td) for td in _find(root, "td")]
    assert cells[:4] == [["a"], ["1"], ["b"], ["2"]]  # sorted by key
    assert ["x"] in [_section_texts(th) for th in _find(root, "th")]
    page = path.read_text()
    assert page.startswith("<!doctype html>") and "<style>" in page
    assert not re.search(r"<(link|script)\b|https?://", page)  # self-contained: no network
    assert "reward &lt;1.0&gt;" in page
    json_path = tmp_path / "train.json"
    logtree.write_trace_json(trace, json_path)
    assert json.loads(json_path.read_text()) == tree


def test_section_attrs_replace_the_default_class_as_the_cookbook() -> None:
    with logtree.init_trace("t") as trace:
        with logtree.scope_header("s", class_="grp"):
            pass
        with logtree.scope_header("plain"):
            pass
    sections = _find(trace.to_dict()["root"], "section")
    assert sections[0]["attrs"]["class"] == "grp"
    assert sections[1]["attrs"]["class"] == "lt-section"


def test_logtree_records_and_writes_an_exception(tmp_path: Path) -> None:
    path = tmp_path / "t.html"
    with pytest.raises(RuntimeError, match="sandbox died"), logtree.init_trace("t", path=path):
        logtree.log_text("before")
        raise RuntimeError("sandbox died")
    page = path.read_text()
    assert "Exception: RuntimeError: sandbox died" in page and "before" in page
    unwritten = tmp_path / "u.html"
    with pytest.raises(RuntimeError), logtree.init_trace("t", path=unwritten, write_on_error=False):
        raise RuntimeError("x")
    assert not unwritten.exists()
    assert logtree.flush_trace() is False  # the trace's context is gone


def test_scope_disable_and_optional_enable_logging() -> None:
    with logtree.init_trace("t") as trace:
        with logtree.scope_disable():
            logtree.log_text("hidden")
        with logtree.optional_enable_logging(False):
            logtree.log_text("hidden too")
        with logtree.optional_enable_logging(True):
            logtree.log_text("shown")
    texts = _section_texts(trace.to_dict()["root"])
    assert "shown" in texts and "hidden" not in texts and "hidden too" not in texts


def test_concurrent_rollouts_each_log_into_their_own_scope() -> None:
    async def rollout(i: int) -> None:
        with logtree.scope_header(f"Trajectory {i}"):
            for turn in range(3):
                logtree.log_text(f"traj {i} turn {turn}")
                await asyncio.sleep(0.001 * ((i + turn) % 3))

    @logtree.scope_header_decorator("Group Rollout")
    async def group() -> None:
        await asyncio.gather(*(rollout(i) for i in range(4)))

    async def main() -> dict[str, Any]:
        with logtree.init_trace("t") as trace:
            await group()
        return trace.to_dict()

    tree = asyncio.run(main())
    (group_section,) = [
        s for s in _find(tree["root"], "section") if _section_texts(s)[0] == "Group Rollout"
    ]
    trajectories = _find(group_section, "section")[1:]
    assert len(trajectories) == 4
    for section in trajectories:
        title, *lines = _section_texts(section)
        i = int(title.split()[-1])
        assert lines == [f"traj {i} turn {t}" for t in range(3)]
        assert section["children"][0]["tag"] == "h3"


def test_conversation_formatter_html_css_once_and_json_data() -> None:
    messages: list[renderers.Message] = [
        {"role": "user", "content": "2 < 3?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hmm"},
                {"type": "text", "text": "yes"},
                {"type": "image", "image": "https://example.org/x.png"},
            ],
        },
    ]
    formatter = ConversationFormatter(messages=messages)
    assert "lt-message-user" in formatter.to_html() and "2 &lt; 3?" in formatter.to_html()
    with logtree.init_trace("t") as trace:
        logtree.log_formatter(formatter)
        logtree.log_formatter(ConversationFormatter(messages=messages[:1]))
    assert trace.head_html().count("/* Conversation formatting */") == 1
    (first, second) = [c for c in trace.to_dict()["root"]["children"] if "data" in c]
    assert first["children"] == []  # raw HTML left out of the JSON when data is present
    assert first["data"] == {
        "type": "conversation",
        "messages": [
            {"role": "user", "content": "2 < 3?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm"},
                    {"type": "text", "text": "yes"},
                    {"type": "image", "image": "https://example.org/x.png"},
                ],
            },
        ],
    }
    assert second["data"]["messages"] == [{"role": "user", "content": "2 < 3?"}]
    with pytest.raises(exceptions.RendererError, match="Unknown content part type: video"):
        ConversationFormatter(
            messages=[{"role": "user", "content": [{"type": "video"}]}]  # type: ignore[list-item]
        ).to_html()


def test_conversation_formatter_keeps_message_metadata_and_audio() -> None:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": [{"type": "audio", "audio": b"RIFF"}],
        "tool_calls": [{"function": {"name": "f", "arguments": "{}"}, "id": "1"}],
        "trainable": False,
        "name": "bot",
    }
    data = ConversationFormatter(messages=[message]).to_data()
    assert data["messages"][0] == {
        "role": "assistant",
        "content": [{"type": "audio"}],
        "tool_calls": [{"function": {"name": "f", "arguments": "{}"}, "id": "1"}],
        "trainable": False,
        "name": "bot",
    }
    assert "[Audio]" in ConversationFormatter(messages=[message]).to_html()


# --- preference ----------------------------------------------------------------------------------

PROMPT: list[renderers.Message] = [{"role": "user", "content": "Who are you?"}]
SHORT: list[renderers.Message] = [{"role": "assistant", "content": "A bot."}]
LONG: list[renderers.Message] = [{"role": "assistant", "content": "A large language model."}]


def test_comparison_swaps() -> None:
    comparison = Comparison(prompt_conversation=PROMPT, completion_A=SHORT, completion_B=LONG)
    assert comparison.swap() == Comparison(PROMPT, LONG, SHORT)
    assert LabeledComparison(comparison=comparison, label="A").swap().label == "B"
    assert LabeledComparison(comparison=comparison, label="B").swap().label == "A"
    assert LabeledComparison(comparison, "Tie").swap() == LabeledComparison(
        comparison.swap(), "Tie"
    )


class ScriptedJudge:
    """A sampling client that answers each `sample` with the next scripted text (greedy, one
    token of the byte tokenizer per character), recording the prompts."""

    def __init__(self, answers: list[str]) -> None:
        self.answers = answers
        self.prompts: list[list[int]] = []
        self.params: list[tinker.SamplingParams] = []

    async def _respond(self, text: str) -> tinker.SampleResponse:
        tokens = ByteTokenizer().encode(text, add_special_tokens=False)
        sequence = tinker.SampledSequence(
            stop_reason="length",
            sequence_id=f"judge-{len(self.prompts)}",
            tokens_np=np.asarray(tokens, np.int32),
            logprobs_np=np.zeros(len(tokens), np.float32),
        )
        return tinker.SampleResponse(sequences=[sequence])

    def sample(
        self, prompt: tinker.ModelInput, num_samples: int, sampling_params: tinker.SamplingParams
    ) -> Any:
        self.prompts.append(prompt.to_ints())
        self.params.append(sampling_params)
        assert num_samples == 1
        return self._respond(self.answers[len(self.prompts) - 1])


def test_preference_model_from_chat_renderer_maps_the_judges_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tokenizer = ByteTokenizer()
    renderer = renderers.get_renderer("role_colon", tokenizer)
    judge = ScriptedJudge(["A", " B\n", "Tie", "maybe"])
    model = PreferenceModelFromChatRenderer(renderer, judge)  # type: ignore[arg-type]
    comparison = Comparison(PROMPT, SHORT, LONG)
    with caplog.at_level(logging.WARNING):
        scores = [asyncio.run(model(comparison)) for _ in range(4)]
    assert scores == [-1.0, 1.0, 0.0, 0.0]
    assert "Invalid output preference model output: 'maybe'" in caplog.text
    assert all(p.temperature == 0.0 and p.max_tokens == 1 for p in judge.params)
    text = tokenizer.decode(judge.prompts[0])
    assert text.index("==== Completion A ====") < text.index("A bot.")
    assert text.index("A bot.") < text.index("==== Completion B ====") < text.index("A large")
    assert text.rstrip().endswith("Assistant:")


def test_comparison_renderer_trains_on_the_first_label_token() -> None:
    renderer = renderers.get_renderer("role_colon", ByteTokenizer())
    comparison = ComparisonRendererFromChatRenderer(renderer)
    full, full_weights = renderer.build_supervised_example(
        [
            *PROMPT,
            {"role": "system", "content": "==== Completion A ===="},
            *SHORT,
            {"role": "system", "content": "==== Completion B ===="},
            *LONG,
            {"role": "system", "content": "==== Preference ===="},
            {"role": "assistant", "content": "B"},
        ]
    )
    model_input, weights = comparison.to_model_input_weights(
        LabeledComparison(Comparison(PROMPT, SHORT, LONG), "B")
    )
    first = int(np.flatnonzero(np.asarray(full_weights) == 1.0)[0])
    assert model_input.to_ints() == full.to_ints()[: first + 1]
    assert weights.dtype == np.float32 and weights.tolist() == [0.0] * first + [1.0]


def test_comparison_builder_from_jsonl(tmp_path: Path) -> None:
    row = {
        "comparison": {"prompt_conversation": PROMPT, "completion_A": SHORT, "completion_B": LONG},
        "label": "A",
    }
    train = tmp_path / "train.jsonl"
    train.write_text(json.dumps(row) + "\n\n" + json.dumps({"other": 1}) + "\n")
    builder = preference_datasets.ComparisonBuilderFromJsonl(train_path=str(train))
    rows, test_rows = builder.get_train_and_test_datasets()
    assert len(rows) == 2 and test_rows is None
    comparisons, test = builder.get_labeled_comparisons()
    assert comparisons == [LabeledComparison(Comparison(PROMPT, SHORT, LONG), "A")]
    assert test is None
    both = preference_datasets.ComparisonBuilderFromJsonl(
        train_path=str(train), test_path=str(train)
    )
    assert both.get_labeled_comparisons()[1] == comparisons
