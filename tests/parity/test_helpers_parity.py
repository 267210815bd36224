"""Differential tests: the shell's cookbook helper modules against tinker-cookbook 0.6.1's.

`shell.cookbook.exceptions`, `shell.cookbook.utils.{misc_utils,logtree,logtree_formatters}`, `shell.cookbook.cli_utils`
and `shell.cookbook.preference` are driven with the same inputs as the cookbook's modules, and
`rl/preference_envs.py` ported by the import rewrite is run beside the cookbook's own.
Needs the cookbook (`make parity`); skipped otherwise.
"""

from __future__ import annotations

import asyncio
import html
import inspect
import itertools
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pandas as pd
import pytest
import tinker
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpure.model import ByteTokenizer
from tests.parity.porting import ported_module, require_cookbook

require_cookbook()

from tinker_cookbook import cli_utils as cb_cli_utils  # noqa: E402
from tinker_cookbook import exceptions as cb_exceptions  # noqa: E402
from tinker_cookbook.preference import preference_datasets as cb_datasets  # noqa: E402
from tinker_cookbook.preference import types as cb_pref  # noqa: E402
from tinker_cookbook.renderers import role_colon as cb_role_colon  # noqa: E402
from tinker_cookbook.rl import types as cb_rl_types  # noqa: E402
from tinker_cookbook.utils import logtree as cb_logtree  # noqa: E402
from tinker_cookbook.utils import logtree_formatters as cb_formatters  # noqa: E402
from tinker_cookbook.utils import misc_utils as cb_misc  # noqa: E402

from shell.cookbook import cli_utils, exceptions, renderers  # noqa: E402
from shell.cookbook.preference import preference_datasets  # noqa: E402
from shell.cookbook.preference import types as pref  # noqa: E402
from shell.cookbook.rl import types as rl_types  # noqa: E402
from shell.cookbook.utils import logtree, logtree_formatters, misc_utils  # noqa: E402

# --- exceptions ----------------------------------------------------------------------------------


def test_every_cookbook_exception_exists_with_its_hierarchy() -> None:
    assert set(cb_exceptions.__all__) <= set(exceptions.__all__)
    for name in cb_exceptions.__all__:
        ours, theirs = getattr(exceptions, name), getattr(cb_exceptions, name)
        for base in inspect.getmro(theirs)[1:]:
            if base.__module__ == "builtins":
                assert issubclass(ours, base), (name, base)
            else:  # a cookbook class: ours must derive from our class of that name
                assert issubclass(ours, getattr(exceptions, base.__name__)), (name, base)


def test_cli_utils_check_log_dir_raises_the_same_error(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    for module, error in ((cli_utils, exceptions.ConfigurationError), (cb_cli_utils, None)):
        raised = error or cb_exceptions.ConfigurationError
        with pytest.raises(raised) as caught:
            module.check_log_dir(str(run), "raise")
        assert str(caught.value) == f"Log directory {run} already exists. Will not delete it."


@pytest.mark.parametrize("value", ["", "/r", "~/x", None])
def test_runs_path_and_model_name_from_argv(
    monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv(cli_utils.RUNS_DIR_ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(cli_utils.RUNS_DIR_ENV_VAR, value)
    for parts in [(), ("a",), ("a", "b/c")]:
        assert cli_utils.runs_path(*parts) == cb_cli_utils.runs_path(*parts)
    argv = ["x=1", "model_name=m1", "model_name=m2"]
    for n in range(len(argv) + 1):
        assert cli_utils.model_name_from_argv(argv[:n], "d") == cb_cli_utils.model_name_from_argv(
            argv[:n], "d"
        )


# --- misc_utils ----------------------------------------------------------------------------------


def test_split_list_matches_the_cookbook_on_every_n_and_k() -> None:
    for n in range(0, 161):
        items = list(range(n))
        for k in range(-1, n + 2):
            try:
                expected: Any = cb_misc.split_list(items, k)
            except ValueError as error:
                with pytest.raises(ValueError, match=re.escape(str(error))):
                    misc_utils.split_list(items, k)
                continue
            assert misc_utils.split_list(items, k) == expected, (n, k)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.dictionaries(
            st.sampled_from("abcd"),
            st.one_of(st.none(), st.integers(-5, 5), st.floats(-1e6, 1e6)),
        ),
        max_size=6,
    )
)
def test_dict_mean_matches(dicts: list[dict[str, Any]]) -> None:
    assert misc_utils.dict_mean(dicts) == cb_misc.dict_mean(dicts)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 2), st.text(max_size=1)), max_size=5))
def test_all_same_concat_and_safezip_match(xs: list[Any]) -> None:
    assert misc_utils.all_same(xs) == cb_misc.all_same(xs)
    halves = [xs[: len(xs) // 2], xs[len(xs) // 2 :]]
    assert misc_utils.concat_lists(halves) == cb_misc.concat_lists(halves)
    for other in (xs, [*xs, 0]):
        try:
            expected = list(cb_misc.safezip(xs, other))
        except ValueError:
            with pytest.raises(ValueError):
                list(misc_utils.safezip(xs, other))
        else:
            assert list(misc_utils.safezip(xs, other)) == expected


def test_iteration_dir_lookup_func_and_timed_match() -> None:
    for log_path in (None, "", "/l", Path("rel")):
        for step in (0, 7, 1234567):
            assert misc_utils.iteration_dir(log_path, step) == cb_misc.iteration_dir(log_path, step)
    for args in (("json:dumps",), ("dumps", "json"), ("os.path:join", "json")):
        assert misc_utils.lookup_func(*args) is cb_misc.lookup_func(*args)
    for bad in (("dumps",), ("a:b:c", "json")):
        with pytest.raises(ValueError, match="Invalid path"):
            cb_misc.lookup_func(*bad)
        with pytest.raises(ValueError, match="Invalid path"):
            misc_utils.lookup_func(*bad)
    ours: dict[str, Any] = {}
    theirs: dict[str, Any] = {}
    with misc_utils.timed("k", ours), cb_misc.timed("k", theirs):
        pass
    assert ours.keys() == theirs.keys() == {"time/k"}


# --- logtree -------------------------------------------------------------------------------------


def _normalize(node: Any) -> Any:
    """A trace dict with the run-dependent parts blanked (the subtitle's timestamp, the
    traceback text of an exception block) and the exception summary unescaped: the cookbook
    inserts that summary as raw HTML, ours escapes it (deliberate, see `shell.cookbook.utils.logtree`)."""
    if isinstance(node, list):
        return [_normalize(child) for child in node]
    if not isinstance(node, dict):
        return node
    out = {k: _normalize(v) for k, v in node.items() if k not in ("started_at", "path")}
    if node.get("attrs", {}).get("class") == "lt-subtitle":
        out["children"] = ["Generated <time>"]
    if node.get("attrs", {}).get("class") == "lt-exc":
        summary = node["children"][0]
        out["children"] = [{**summary, "children": [html.unescape(summary["children"][0])]}]
    return out


def _script(lt: ModuleType, fmt: ModuleType, tmp: Path) -> tuple[Any, str]:
    """The same logging calls against `lt` (a logtree module): the trace dict and body HTML."""

    @lt.scope_header_decorator
    async def compute_group_rewards(i: int) -> int:
        lt.log_text(f"rewards {i}")
        return i

    @lt.scope_header_decorator("Group Rollout")
    def group_rollout() -> None:
        with lt.scope_header("Trajectory Details", class_="x", data__k="v"):
            lt.table_from_dict({"b": 1, "a": 2.5}, caption="cap", sort_by="key")
            lt.table_from_dict(
                {"b": 1, "a": 2.5}, key_header="k", value_header="v", sort_by="value"
            )
            lt.table([{"x": 1, "y": "<b>"}, {"x": 2}], caption="records")
            lt.table([[1, 2], [3, 4]])
            lt.table(pd.DataFrame({"col": [1, 2], "txt": ["<a>", "b"]}), caption="frame")
            lt.table([], caption="empty")
            lt.table_from_dict_of_lists({"n": [1, 2], "m": ["a", "b"]}, order=["m", "n"])
        lt.details("a\n<b>", summary="Diag", pre=True)
        lt.details("plain", pre=False)
        lt.header("inline")
        lt.header("forced", level=9)
        with lt.scope_details("more"):
            lt.log_text("in details", div_class="answer")
        with lt.scope_div(class_="grading"):
            lt.log_html("<i>raw</i>", div_class="c")
            lt.log_html("<i>raw2</i>")
        with lt.optional_enable_logging(False):
            lt.log_text("hidden")
        messages = [
            {"role": "user", "content": "q & a"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "t"}]},
        ]
        lt.log_formatter(fmt.ConversationFormatter(messages=messages))
        for level in range(7):
            with lt.scope_header(f"depth {level}"):
                pass

    async def main() -> Any:
        with lt.init_trace("Title <1>", path=tmp / "t.html") as trace:
            lt.log_text("explanation")
            group_rollout()
            results = await asyncio.gather(*(compute_group_rewards(i) for i in range(3)))
            assert results == [0, 1, 2]
        return trace

    trace = asyncio.run(main())
    return trace.to_dict(), trace.body_html()


def test_logtree_builds_the_cookbooks_tree_and_body(tmp_path: Path) -> None:
    (tmp_path / "ours").mkdir()
    (tmp_path / "theirs").mkdir()
    ours, ours_html = _script(logtree, logtree_formatters, tmp_path / "ours")
    theirs, theirs_html = _script(cb_logtree, cb_formatters, tmp_path / "theirs")
    assert _normalize(ours) == _normalize(theirs)
    stamp = re.compile(r"Generated [0-9T:-]+")
    assert stamp.sub("", ours_html) == stamp.sub("", theirs_html)
    assert (tmp_path / "ours" / "t.html").exists() and (tmp_path / "theirs" / "t.html").exists()


def test_logtree_exception_and_no_trace_behaviour_match(tmp_path: Path) -> None:
    trees = []
    for lt in (logtree, cb_logtree):
        with pytest.raises(KeyError), lt.init_trace("t") as trace, lt.scope_header("s"):
            lt.log_text("before")
            raise KeyError("k")
        trees.append(_normalize(trace.to_dict()))
        # outside a trace: no effect, no error, even for arguments refused while logging
        lt.table({"a": 1})
        lt.table_from_dict_of_lists({"a": [1], "b": []})
        assert lt.scope_header_decorator(lambda: 5)() == 5
        assert lt.flush_trace() is False
    assert trees[0] == trees[1]


def test_logtree_refuses_the_same_tables_while_logging() -> None:
    for lt in (logtree, cb_logtree):
        with lt.init_trace("t"):
            with pytest.raises(TypeError, match="table_from_dict"):
                lt.table({"a": 1})
            with pytest.raises(TypeError, match="does not support type"):
                lt.table("text")
            with pytest.raises(ValueError, match="equal length"):
                lt.table_from_dict_of_lists({"a": [1], "b": []})


def test_conversation_formatter_matches_on_html_and_data() -> None:
    from tinker_cookbook.renderers.base import ToolCall as CbToolCall

    conversations: list[list[dict[str, Any]]] = [
        [{"role": "system", "content": "be <nice>"}, {"role": "user", "content": "q"}],
        [
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "x & y"},
                    {"type": "text", "text": "answer"},
                    {"type": "image", "image": "data:image/png;base64,AAAA"},
                ],
                "trainable": True,
                "name": "bot",
            },
            {"role": "tool", "content": "42", "tool_call_id": "c1"},
        ],
        [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    CbToolCall(
                        function=CbToolCall.FunctionBody(name="f", arguments='{"a": 1}'), id="c1"
                    )
                ],
            }
        ],
        [],
    ]
    for messages in conversations:
        ours = logtree_formatters.ConversationFormatter(messages=messages)
        theirs = cb_formatters.ConversationFormatter(messages=messages)  # type: ignore[arg-type]
        assert ours.to_html() == theirs.to_html()
        assert json.dumps(ours.to_data()) == json.dumps(theirs.to_data())


# --- preference ----------------------------------------------------------------------------------

PROMPT = [{"role": "user", "content": "Who are you?"}]
SHORT = [{"role": "assistant", "content": "A bot."}]
LONG = [{"role": "assistant", "content": "A large language model."}]


def test_comparison_swaps_match() -> None:
    for label in ("A", "B", "Tie"):
        ours = pref.LabeledComparison(pref.Comparison(PROMPT, SHORT, LONG), label).swap()  # type: ignore[arg-type]
        theirs = cb_pref.LabeledComparison(cb_pref.Comparison(PROMPT, SHORT, LONG), label).swap()  # type: ignore[arg-type]
        assert ours.label == theirs.label
        assert vars(ours.comparison) == vars(theirs.comparison)


class ScriptedJudge:
    """A sampling client answering each `sample` with the next scripted text (byte tokens)."""

    def __init__(self, answers: list[str]) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[list[int], int, float | None, int | None]] = []

    async def _respond(self, text: str) -> tinker.SampleResponse:
        tokens = np.asarray(ByteTokenizer().encode(text, add_special_tokens=False), np.int32)
        sequence = tinker.SampledSequence(
            stop_reason="length",
            sequence_id=f"judge-{len(self.calls)}",
            tokens_np=tokens,
            logprobs_np=np.zeros(len(tokens), np.float32),
        )
        return tinker.SampleResponse(sequences=[sequence])

    def sample(
        self, prompt: tinker.ModelInput, num_samples: int, sampling_params: tinker.SamplingParams
    ) -> Any:
        params = sampling_params
        self.calls.append((prompt.to_ints(), num_samples, params.temperature, params.max_tokens))
        return self._respond(self.answers[len(self.calls) - 1])


ANSWERS = ["A", "B", "Tie", " B ", "nonsense", ""]


@pytest.mark.parametrize("our_renderer", ["cookbook", "shell"])
def test_preference_model_from_chat_renderer_matches(our_renderer: str) -> None:
    tokenizer = ByteTokenizer()
    cb_renderer = cb_role_colon.RoleColonRenderer(tokenizer)
    renderer = (
        cb_renderer
        if our_renderer == "cookbook"
        else renderers.get_renderer("role_colon", tokenizer)
    )
    ours_judge, theirs_judge = ScriptedJudge(ANSWERS), ScriptedJudge(ANSWERS)
    ours = pref.PreferenceModelFromChatRenderer(renderer, ours_judge)  # type: ignore[arg-type]
    theirs = cb_pref.PreferenceModelFromChatRenderer(cb_renderer, theirs_judge)  # type: ignore[arg-type]
    comparison_ours = pref.Comparison(PROMPT, SHORT, LONG)  # type: ignore[arg-type]
    comparison_theirs = cb_pref.Comparison(PROMPT, SHORT, LONG)  # type: ignore[arg-type]
    for _ in ANSWERS:
        assert asyncio.run(ours(comparison_ours)) == asyncio.run(theirs(comparison_theirs))
    assert ours_judge.calls == theirs_judge.calls


@pytest.mark.parametrize("label", ["A", "B", "Tie"])
def test_comparison_renderer_model_input_weights_match(label: str) -> None:
    cb_renderer = cb_role_colon.RoleColonRenderer(ByteTokenizer())
    ours_input, ours_weights = pref.ComparisonRendererFromChatRenderer(
        cb_renderer
    ).to_model_input_weights(pref.LabeledComparison(pref.Comparison(PROMPT, SHORT, LONG), label))  # type: ignore[arg-type]
    theirs_input, theirs_weights = cb_pref.ComparisonRendererFromChatRenderer(
        cb_renderer
    ).to_model_input_weights(
        cb_pref.LabeledComparison(cb_pref.Comparison(PROMPT, SHORT, LONG), label)
    )  # type: ignore[arg-type]
    assert ours_input.to_ints() == theirs_input.to_ints()
    assert ours_weights.tolist() == theirs_weights.tolist()


def test_comparison_builder_from_jsonl_matches(tmp_path: Path) -> None:
    lines = [
        {
            "comparison": {"prompt_conversation": PROMPT, "completion_A": a, "completion_B": b},
            "label": label,
        }
        for (a, b), label in zip(
            itertools.product([SHORT, LONG], repeat=2), ["A", "B", "Tie", "A"], strict=True
        )
    ]
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train.write_text("".join(json.dumps(line) + "\n" for line in lines))
    test.write_text(json.dumps(lines[1]) + "\n")
    ours = preference_datasets.ComparisonBuilderFromJsonl(
        train_path=str(train), test_path=str(test)
    )
    theirs = cb_datasets.ComparisonBuilderFromJsonl(train_path=str(train), test_path=str(test))
    (ours_train, ours_test), (theirs_train, theirs_test) = (
        ours.get_labeled_comparisons(),
        theirs.get_labeled_comparisons(),
    )
    assert theirs_test is not None and ours_test is not None
    for mine, cookbook in zip(
        [*ours_train, *ours_test], [*theirs_train, *theirs_test], strict=True
    ):
        assert (mine.label, vars(mine.comparison)) == (cookbook.label, vars(cookbook.comparison))


# --- rl/preference_envs.py, ported ---------------------------------------------------------------


class LengthJudge:
    """A scripted preference model: prefers the shorter completion (as the `shorter` recipe)."""

    async def __call__(self, comparison: Any) -> float:
        a = sum(len(m["content"]) for m in comparison.completion_A)
        b = sum(len(m["content"]) for m in comparison.completion_B)
        return float(np.sign(a - b))


RESPONSES = ["Hi.\n\nUser:", "Hello there, friend.\n\nUser:", "Hey", "Yo!\n\nUser:"]


def _trajectory(types: ModuleType, tokens: list[int]) -> Any:
    ob = tinker.ModelInput.from_ints([1, 2, 3])
    if types is cb_rl_types:
        ac = cb_rl_types.TokensWithLogprobs(tokens=tokens, maybe_logprobs=[0.0] * len(tokens))
    else:
        from rlpure.records import TokensWithLogprobs

        ac = TokensWithLogprobs(tokens=tokens, logprobs=[0.0] * len(tokens))
    transition = types.Transition(ob=ob, ac=ac, reward=0.0, episode_done=True, metrics={})
    return types.Trajectory(transitions=[transition], final_ob=tinker.ModelInput.empty())


def _group_rewards(
    module: ModuleType,
    types: ModuleType,
    lt: ModuleType,
    renderer: Any,
    pattern: str,
    chunk: int,
) -> tuple[Any, Any, list[str]]:
    builder = module.PairwisePreferenceGroupBuilder(
        convo_prefix=PROMPT,
        policy_renderer=renderer,
        tournament_pattern=module.TournamentPattern(pattern),
        preference_model=LengthJudge(),
        num_envs=len(RESPONSES),
        matchup_group_size=chunk,
    )
    tokenizer = ByteTokenizer()
    trajectories = [
        _trajectory(types, tokenizer.encode(r, add_special_tokens=False)) for r in RESPONSES
    ]

    async def run() -> tuple[Any, Any]:
        envs = await builder.make_envs()
        observations = [await env.initial_observation() for env in envs]
        with lt.init_trace("group") as trace:
            rewards = await builder.compute_group_rewards(trajectories, envs)
        return rewards, (trace.to_dict(), [ob.to_ints() for ob, _stop in observations])

    rewards, (tree, obs) = asyncio.run(run())
    return rewards, _normalize(tree), obs


@pytest.mark.parametrize("renderer_source", ["cookbook", "shell"])
@pytest.mark.parametrize(
    ("pattern", "chunk"), [("all_pairs_both_ways", 4), ("all_pairs_one_way", 3)]
)
def test_ported_preference_envs_reward_groups_as_the_cookbook(
    renderer_source: str, pattern: str, chunk: int
) -> None:
    ported = ported_module("rl/preference_envs.py")
    from tinker_cookbook.rl import preference_envs as cb_envs

    tokenizer = ByteTokenizer()
    cb_renderer = cb_role_colon.RoleColonRenderer(tokenizer)
    renderer = (
        cb_renderer
        if renderer_source == "cookbook"
        else renderers.get_renderer("role_colon", tokenizer)
    )
    ours = _group_rewards(ported, rl_types, logtree, renderer, pattern, chunk)
    theirs = _group_rewards(cb_envs, cb_rl_types, cb_logtree, cb_renderer, pattern, chunk)
    assert [r for r, _ in ours[0]] == [r for r, _ in theirs[0]]
    assert [dict(m) for _, m in ours[0]] == [dict(m) for _, m in theirs[0]]
    assert ours[1] == theirs[1]  # the same logtree, section by section
    assert ours[2] == theirs[2]  # the same prompts
    assert ported.get_pairs_chunked(7, ported.TournamentPattern(pattern), chunk) == (
        cb_envs.get_pairs_chunked(7, cb_envs.TournamentPattern(pattern), chunk)
    )


def test_ported_shorter_recipe_builds_the_same_dataset() -> None:
    ported = ported_module("recipes/preference/shorter/env.py")
    from tinker_cookbook.recipes.preference.shorter import env as cb_shorter

    ours, theirs = ported.ShorterComparisonBuilder(), cb_shorter.ShorterComparisonBuilder()
    assert isinstance(ours, preference_datasets.ComparisonDatasetBuilder)
    ours_rows, _ = ours.get_train_and_test_datasets()
    theirs_rows, _ = theirs.get_train_and_test_datasets()
    assert len(ours_rows) == len(theirs_rows)
    labeled = ours.example_to_labeled_comparison(ours_rows[0])
    assert isinstance(labeled, pref.LabeledComparison) and labeled.label == "Tie"
    model = ported.ShorterPreferenceModelBuilder()()
    assert isinstance(model, pref.PreferenceModel)
    assert asyncio.run(model(pref.Comparison(PROMPT, LONG, SHORT))) == 1.0  # type: ignore[arg-type]
