"""Differential tests: the facade's `rl.preference_envs`, `sandbox` remote backends,
`rl.rollout_logging`, `display` and `rl.play_w_env` against tinker-cookbook 0.6.1's, and the
recipe entry points they let port.

Each facade module is driven with the same inputs as the cookbook's module and must give the same
outputs (rewards, metrics, logtree sections, records, text). The cookbook's `sandbox` package
imports `aiohttp` and its `modal_sandbox` imports `modal`, neither installed here, so the
sandbox classes are compared by their signatures, read from the cookbook's source. Last, the
recipe files that lacked these modules are imported by the port rule, their sibling recipe
modules served ported too (`_PortedRecipes`). Needs the cookbook (`make parity`).
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import importlib
import inspect
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import chz
import datasets as hf_datasets
import numpy as np
import pytest
import tinker
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpure.model import ByteTokenizer
from rlpure.testing import batches
from tests.parity.porting import ported_module, require_cookbook, serve_ported_recipes

COOKBOOK = require_cookbook()

import termcolor  # noqa: E402
from tinker_cookbook import display as cb_display  # noqa: E402
from tinker_cookbook import exceptions as cb_exceptions  # noqa: E402
from tinker_cookbook import tokenizer_utils as cb_tokenizer_utils  # noqa: E402
from tinker_cookbook.preference import preference_datasets as cb_datasets  # noqa: E402
from tinker_cookbook.renderers import role_colon as cb_role_colon  # noqa: E402
from tinker_cookbook.rl import play_w_env as cb_play  # noqa: E402
from tinker_cookbook.rl import preference_envs as cb_envs  # noqa: E402
from tinker_cookbook.rl import rollout_logging as cb_rollout_logging  # noqa: E402
from tinker_cookbook.rl import types as cb_rl_types  # noqa: E402
from tinker_cookbook.utils import format_colorized as cb_format_colorized  # noqa: E402
from tinker_cookbook.utils import logtree as cb_logtree  # noqa: E402

from shell import terminal  # noqa: E402
from shell.cookbook import display, renderers  # noqa: E402
from shell.cookbook import sandbox as facade_sandbox  # noqa: E402
from shell.cookbook.exceptions import ConfigurationError  # noqa: E402
from shell.cookbook.preference import preference_datasets  # noqa: E402
from shell.cookbook.rl import play_w_env, preference_envs, rollout_logging  # noqa: E402
from shell.cookbook.rl import types as rl_types  # noqa: E402
from shell.cookbook.sandbox import modal_sandbox, sandboxfusion  # noqa: E402
from shell.cookbook.utils import logtree  # noqa: E402
from shell.to_cookbook import to_cookbook_groups  # noqa: E402

MODEL = "rlpure/tiny"  # the byte tokenizer, here and (registered) in the cookbook

# --- helpers -------------------------------------------------------------------------------------


def _normalize(node: Any) -> Any:
    """A trace dict with the run-dependent parts blanked (the subtitle's timestamp)."""
    if isinstance(node, list):
        return [_normalize(child) for child in node]
    if not isinstance(node, dict):
        return node
    out = {k: _normalize(v) for k, v in node.items() if k not in ("started_at", "path")}
    if node.get("attrs", {}).get("class") == "lt-subtitle":
        out["children"] = ["Generated <time>"]
    return out


def _trajectory(types: ModuleType, tokens_per_turn: Sequence[list[int]]) -> Any:
    """A trajectory of `types` (the cookbook's `rl.types` or the facade's) with these actions."""
    transitions = []
    for index, tokens in enumerate(tokens_per_turn):
        ob = tinker.ModelInput.from_ints([1, 2, 3 + index])
        if types is cb_rl_types:
            ac = cb_rl_types.TokensWithLogprobs(tokens=tokens, maybe_logprobs=[-0.5] * len(tokens))
        else:
            ac = types.TokensWithLogprobs(tokens=tokens, logprobs=[-0.5] * len(tokens))
        transitions.append(
            types.Transition(
                ob=ob,
                ac=ac,
                reward=0.25 * index,
                episode_done=index == len(tokens_per_turn) - 1,
                metrics={"turn": index, "ok": index % 2 == 0},
                logs={"note": f"turn {index}"},
            )
        )
    return types.Trajectory(transitions=transitions, final_ob=tinker.ModelInput.from_ints([9]))


@pytest.fixture
def cookbook_byte_tokenizer() -> Iterator[None]:
    """`rlpure/tiny` names the byte tokenizer in the cookbook's registry too."""
    cb_tokenizer_utils.register_tokenizer(MODEL, ByteTokenizer)
    yield
    cb_tokenizer_utils.unregister_tokenizer(MODEL)


# --- rl/preference_envs.py -----------------------------------------------------------------------


class LengthJudge:
    """A scripted preference model: prefers the shorter completion (as the `shorter` recipe),
    and logs what it judged to the active logtree."""

    def __init__(self, lt: ModuleType) -> None:
        self.lt = lt

    async def __call__(self, comparison: Any) -> float:
        a = sum(len(m["content"]) for m in comparison.completion_A)
        b = sum(len(m["content"]) for m in comparison.completion_B)
        self.lt.log_text(f"judged {a} vs {b}")
        return float(np.sign(a - b)) * (0.5 if a + b > 20 else 1.0)


PROMPT: list[Any] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Who are you?"},
]
RESPONSES = [
    "Hi.\n\nUser:",
    "Hello there, friend.\n\nUser:",
    "Hey",  # no stop sequence: malformed
    "Yo!\n\nUser:",
    "A bot.\n\nUser:",
    "<thinking>long</thinking> ok\n\nUser:",
]


def _group_rewards(
    module: ModuleType,
    types: ModuleType,
    lt: ModuleType,
    renderer: Any,
    *,
    pattern: str,
    chunk: int,
    preprocessor: Callable[[str], str] | None,
) -> tuple[Any, Any, Any, list[str]]:
    builder = module.PairwisePreferenceGroupBuilder(
        convo_prefix=PROMPT,
        policy_renderer=renderer,
        tournament_pattern=module.TournamentPattern(pattern),
        preference_model=LengthJudge(lt),
        num_envs=len(RESPONSES),
        content_preprocessor=preprocessor,
        matchup_group_size=chunk,
    )
    tokenizer = ByteTokenizer()
    trajectories = [
        _trajectory(types, [tokenizer.encode(r, add_special_tokens=False)]) for r in RESPONSES
    ]

    async def run() -> tuple[Any, Any, Any]:
        envs = await builder.make_envs()
        observations = [await env.initial_observation() for env in envs]
        steps = [await env.step([65, 66]) for env in envs]
        with lt.init_trace("group") as trace:
            rewards = await builder.compute_group_rewards(trajectories, envs)
        opened = [(ob.to_ints(), list(stop)) for ob, stop in observations]
        stepped = [
            (s.reward, s.episode_done, s.next_observation.length, list(s.next_stop_condition))
            for s in steps
        ]
        return rewards, trace.to_dict(), (opened, stepped)

    rewards, tree, envs = asyncio.run(run())
    return rewards, _normalize(tree), envs, builder.logging_tags()


def _strip_thinking(text: str) -> str:
    return text.split("</thinking>")[-1].strip()


@pytest.mark.parametrize("renderer_source", ["cookbook", "shell"])
@pytest.mark.parametrize(
    ("pattern", "chunk"),
    [
        ("all_pairs_both_ways", 4),
        ("all_pairs_one_way", 3),
        ("all_pairs_both_ways", 1),  # nobody plays: every mean is 0
        ("all_pairs_one_way", 10),  # one chunk holds the whole group
    ],
)
@pytest.mark.parametrize("preprocessor", [None, _strip_thinking])
def test_preference_group_rewards_logs_and_envs_match_the_cookbook(
    renderer_source: str, pattern: str, chunk: int, preprocessor: Callable[[str], str] | None
) -> None:
    tokenizer = ByteTokenizer()
    cb_renderer = cb_role_colon.RoleColonRenderer(tokenizer)
    renderer = (
        cb_renderer
        if renderer_source == "cookbook"
        else renderers.get_renderer("role_colon", tokenizer)
    )
    kwargs: dict[str, Any] = {"pattern": pattern, "chunk": chunk, "preprocessor": preprocessor}
    ours = _group_rewards(preference_envs, rl_types, logtree, renderer, **kwargs)
    theirs = _group_rewards(cb_envs, cb_rl_types, cb_logtree, cb_renderer, **kwargs)
    assert [r for r, _ in ours[0]] == [r for r, _ in theirs[0]]
    assert [dict(m) for _, m in ours[0]] == [dict(m) for _, m in theirs[0]]
    assert [type(m["format"]) for _, m in ours[0]] == [type(m["format"]) for _, m in theirs[0]]
    assert ours[1] == theirs[1]  # the same logtree, section by section, judge lines included
    assert ours[2] == theirs[2]  # the same prompts, stop sequences and terminal steps
    assert ours[3] == theirs[3] == ["pair_pref"]


@pytest.mark.parametrize("pattern", ["all_pairs_both_ways", "all_pairs_one_way"])
def test_tournament_pairs_match_the_cookbook(pattern: str) -> None:
    for n in range(10):
        assert preference_envs.get_pairs(n, preference_envs.TournamentPattern(pattern)) == (
            cb_envs.get_pairs(n, cb_envs.TournamentPattern(pattern))
        )
        for chunk in range(1, 7):
            ours = preference_envs.get_pairs_chunked(
                n, preference_envs.TournamentPattern(pattern), chunk
            )
            assert ours == cb_envs.get_pairs_chunked(n, cb_envs.TournamentPattern(pattern), chunk)


def test_an_unknown_pattern_raises_the_same_configuration_error() -> None:
    with pytest.raises(cb_exceptions.ConfigurationError) as theirs:
        cb_envs.get_pairs(3, "round_robin")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError) as ours:
        preference_envs.get_pairs(3, "round_robin")  # type: ignore[arg-type]
    assert str(ours.value) == str(theirs.value)
    assert [m.value for m in preference_envs.TournamentPattern] == [
        m.value for m in cb_envs.TournamentPattern
    ]


def test_a_multi_turn_trajectory_is_refused_naming_it() -> None:
    builder = preference_envs.PairwisePreferenceGroupBuilder(
        convo_prefix=PROMPT,
        policy_renderer=renderers.get_renderer("role_colon", ByteTokenizer()),
        tournament_pattern=preference_envs.TournamentPattern.ALL_PAIRS_ONE_WAY,
        preference_model=cast(Any, LengthJudge(logtree)),
        num_envs=2,
    )
    trajectories = [_trajectory(rl_types, [[72]]), _trajectory(rl_types, [[72], [73]])]
    with pytest.raises(ValueError, match=r"trajectory 1 has 2 transitions; expected 1"):
        asyncio.run(builder.compute_group_rewards(trajectories, []))


def _prompt_rows(datasets: ModuleType, prompts: list[str]) -> Any:
    """A comparison builder of `datasets` (the cookbook's module or the facade's) over these
    prompts, in memory; a prompt `"skip"` is a row the builder skips."""

    @chz.chz
    class Prompts(datasets.ComparisonDatasetBuilder):  # type: ignore[misc,name-defined]
        def get_train_and_test_datasets(self) -> Any:
            return hf_datasets.Dataset.from_list([{"prompt": p} for p in prompts]), None

        def example_to_labeled_comparison(self, example: dict[str, Any]) -> Any:
            if example["prompt"] == "skip":
                return None
            comparison = datasets.Comparison(
                prompt_conversation=[{"role": "user", "content": example["prompt"]}],
                completion_A=[{"role": "assistant", "content": "a"}],
                completion_B=[{"role": "assistant", "content": "bb"}],
            )
            return datasets.LabeledComparison(comparison=comparison, label="B")

    return Prompts()


def _batches(module: ModuleType, datasets: ModuleType, prompts: list[str], judge: Any) -> Any:
    builder = module.PairwisePreferenceRLDatasetBuilder(
        comparison_builder=_prompt_rows(datasets, prompts),
        batch_size=2,
        policy_renderer_name="role_colon",
        policy_model_name=MODEL,
        tournament_pattern=module.TournamentPattern.ALL_PAIRS_ONE_WAY,
        group_size=3,
        preference_model_builder=lambda: judge,
    )

    async def run() -> Any:
        dataset, test = await builder()
        batches = []
        for index in range(len(dataset)):
            groups = dataset.get_batch(index)
            envs = [await group.make_envs() for group in groups]
            firsts = [[(await e.initial_observation())[0].to_ints() for e in g] for g in envs]
            batches.append(
                [
                    (
                        g.convo_prefix,
                        g.num_envs,
                        str(g.tournament_pattern),
                        g.matchup_group_size,
                        g.preference_model is judge,
                        first,
                    )
                    for g, first in zip(groups, firsts, strict=True)
                ]
            )
        return len(dataset), test, batches

    return asyncio.run(run())


def test_the_dataset_builder_batches_prompts_as_the_cookbook(
    cookbook_byte_tokenizer: None,
) -> None:
    prompts = ["Say hi", "Name a color", "skip", "Count to three", "Pick", "Odd one", "Cut"]
    judge = LengthJudge(logtree)
    ours = _batches(preference_envs, preference_datasets, prompts, judge)
    theirs = _batches(cb_envs, cb_datasets, prompts, judge)
    assert ours == theirs
    assert ours[0] == 3 and ours[1] is None  # 7 rows, batches of 2, the last row cut; no test
    assert [len(batch) for batch in ours[2]] == [2, 1, 2]  # the skipped row leaves a gap


def test_the_builder_refuses_an_empty_group_or_chunk() -> None:
    base: dict[str, Any] = {
        "convo_prefix": PROMPT,
        "policy_renderer": renderers.get_renderer("role_colon", ByteTokenizer()),
        "tournament_pattern": preference_envs.TournamentPattern.ALL_PAIRS_ONE_WAY,
        "preference_model": LengthJudge(logtree),
        "num_envs": 2,
    }
    for field in ("num_envs", "matchup_group_size"):
        with pytest.raises(ValueError, match=f"PairwisePreferenceGroupBuilder.{field}: expected"):
            preference_envs.PairwisePreferenceGroupBuilder(**{**base, field: 0})


# --- sandbox: SandboxBackend, SandboxFusionClient, modal_sandbox ----------------------------------


def _source_signatures(path: Path, class_name: str) -> dict[str, list[tuple[str, str, Any]]]:
    """`method → [(parameter, kind, default source)]` of a class in the cookbook's source (its
    module cannot be imported here: it needs `aiohttp` or `modal`)."""
    tree = ast.parse(path.read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name]
    found: dict[str, list[tuple[str, str, Any]]] = {}
    for node in cls.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if node.name.startswith("_") and node.name != "__init__":
            continue
        args = node.args
        positional = [*args.posonlyargs, *args.args]
        defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
        params = [
            (a.arg, "positional", None if d is None else ast.unparse(d))
            for a, d in zip(positional, defaults, strict=True)
        ]
        params += [
            (a.arg, "keyword", None if d is None else ast.unparse(d))
            for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
        ]
        kind = "async" if isinstance(node, ast.AsyncFunctionDef) else "sync"
        found[f"{kind} {node.name}"] = params
    return found


def _our_signatures(cls: type) -> dict[str, list[tuple[str, str, Any]]]:
    found: dict[str, list[tuple[str, str, Any]]] = {}
    for name, member in vars(cls).items():
        if name.startswith("_") and name != "__init__":
            continue
        function = member.__func__ if isinstance(member, classmethod) else member
        function = function.fget if isinstance(function, property) else function
        if not inspect.isfunction(function):
            continue
        params = []
        for p in inspect.signature(function).parameters.values():
            kind = "keyword" if p.kind is p.KEYWORD_ONLY else "positional"
            default = None if p.default is p.empty else repr(p.default)
            params.append((p.name, kind, default))
        kind = "async" if inspect.iscoroutinefunction(function) else "sync"
        found[f"{kind} {name}"] = params
    return found


def _evaluated(signatures: dict[str, list[tuple[str, str, Any]]]) -> Any:
    """Default sources evaluated (`128 * 1024` → `131072`) so both sides read alike."""
    return {
        method: [
            (name, kind, None if default is None else repr(eval(default)))
            for name, kind, default in params
        ]
        for method, params in signatures.items()
    }


@pytest.mark.parametrize(
    ("source", "ours"),
    [
        ("sandbox/sandboxfusion.py", sandboxfusion.SandboxFusionClient),
        ("sandbox/modal_sandbox.py", modal_sandbox.ModalSandbox),
        ("sandbox/modal_sandbox.py", modal_sandbox.ModalSandboxPool),
    ],
)
def test_remote_sandbox_classes_have_the_cookbooks_methods_and_signatures(
    source: str, ours: type
) -> None:
    theirs = _source_signatures(COOKBOOK / source, ours.__name__)
    assert _evaluated(_our_signatures(ours)) == _evaluated(theirs)
    if ours is modal_sandbox.ModalSandbox:  # the cookbook's `sandbox_id` is a property
        assert isinstance(inspect.getattr_static(ours, "sandbox_id"), property)


def test_sandbox_package_binds_the_cookbooks_names_and_backend_values() -> None:
    tree = ast.parse((COOKBOOK / "sandbox/__init__.py").read_text())
    (all_node,) = [
        n
        for n in tree.body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "__all__"
    ]
    assert set(ast.literal_eval(all_node.value)) <= set(facade_sandbox.__all__)
    (backend,) = [
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SandboxBackend"
    ]
    values = [
        (n.targets[0].id, ast.literal_eval(n.value))  # type: ignore[attr-defined]
        for n in backend.body
        if isinstance(n, ast.Assign)
    ]
    assert [(m.name, m.value) for m in facade_sandbox.SandboxBackend] == values


# --- rl/rollout_logging.py -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["RolloutSummaryExportConfig", "RolloutSummaryGroup"])
def test_rollout_summary_records_have_the_cookbooks_fields(name: str) -> None:
    ours, theirs = getattr(rollout_logging, name), getattr(cb_rollout_logging, name)
    assert [(f.name, f.default) for f in dataclasses.fields(ours)] == [
        (f.name, f.default) for f in dataclasses.fields(theirs)
    ]
    assert ours.__dataclass_params__.frozen and theirs.__dataclass_params__.frozen
    if name == "RolloutSummaryExportConfig":  # positional, as the cookbook's
        assert rollout_logging.RolloutSummaryExportConfig("train", 3, "train", 2) == (
            rollout_logging.RolloutSummaryExportConfig(
                split="train", iteration=3, base_name="train", sampling_client_step=2
            )
        )


@settings(max_examples=25, deadline=None)
@given(batches(reward_kind="binary", prefix="mixed", max_group_size=3))
def test_summaries_from_groups_equal_the_cookbooks(groups_P: Any) -> None:
    steps = [None if p % 2 else 10 + p for p in range(len(groups_P))]
    tags = [[f"env{p}", "extra"] for p in range(len(groups_P))]
    ours = rollout_logging.serialize_rollout_summaries_from_groups(
        split="train",
        iteration=4,
        groups_P=[
            rollout_logging.RolloutSummaryGroup(g, t, s)
            for g, t, s in zip(groups_P, tags, steps, strict=True)
        ],
    )
    theirs = cb_rollout_logging.serialize_rollout_summaries_from_groups(
        split="train",
        iteration=4,
        groups_P=[
            cb_rollout_logging.RolloutSummaryGroup(g, t, s)
            for g, t, s in zip(to_cookbook_groups(groups_P), tags, steps, strict=True)
        ],
    )
    assert [list(r) for r in ours] == [list(r) for r in theirs]
    assert json.loads(json.dumps(ours)) == json.loads(json.dumps(theirs))


def test_the_removed_jsonl_writers_raise_the_cookbooks_error(tmp_path: Path) -> None:
    calls: list[tuple[str, dict[str, Any]]] = [
        (
            "write_rollout_summaries_jsonl",
            {"split": "train", "iteration": 0, "trajectory_groups_P": [], "taglist_P": []},
        ),
        (
            "write_rollout_summaries_jsonl_from_groups",
            {"split": "t", "iteration": 0, "groups_P": []},
        ),
    ]
    for name, kwargs in calls:
        messages = []
        for module in (rollout_logging, cb_rollout_logging):
            with pytest.raises(RuntimeError) as caught:
                getattr(module, name)(tmp_path / "out.jsonl", **kwargs)
            messages.append(str(caught.value))
        assert messages[0] == messages[1]
        assert not (tmp_path / "out.jsonl").exists()


# --- display.py and utils/format_colorized.py --------------------------------------------------


@pytest.fixture(params=["plain", "forced", "no_color"])
def color_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Colours off (stdout is captured, not a terminal), forced on, or off by `NO_COLOR` with
    `FORCE_COLOR` set too; termcolor's cached decision is cleared around each case."""
    for name in ("ANSI_COLORS_DISABLED", "NO_COLOR", "FORCE_COLOR"):
        monkeypatch.delenv(name, raising=False)
    if request.param in ("forced", "no_color"):
        monkeypatch.setenv("FORCE_COLOR", "1")
    if request.param == "no_color":
        monkeypatch.setenv("NO_COLOR", "1")
    termcolor.can_colorize.cache_clear()
    yield request.param
    termcolor.can_colorize.cache_clear()


def test_colored_writes_what_termcolor_writes(color_mode: str) -> None:
    for color in (None, "green", "yellow", "red", "cyan", "blue"):
        for attrs in (None, ["bold"], ["bold", "underline"]):
            assert terminal.colored("text\n", color, attrs=attrs) == termcolor.colored(
                "text\n", color, attrs=attrs
            )
    assert terminal.colors_enabled() is (color_mode == "forced")


TEXTS = st.text(alphabet=st.sampled_from("ab é\n日"), max_size=12)


@settings(max_examples=60, deadline=None)
@given(
    TEXTS,
    st.lists(st.sampled_from([-1.0, 0.0, 0.5, 1.0]), min_size=40, max_size=40),
    st.booleans(),
    st.booleans(),
)
def test_format_colorized_matches_the_cookbook(
    text: str, weights: list[float], arrow: bool, forced: bool
) -> None:
    tokenizer = ByteTokenizer()
    tokens = tokenizer.encode(text, add_special_tokens=False)
    weights = weights[: len(tokens)]
    with _colors(forced):
        ours = display.format_colorized(tokens, weights, tokenizer, draw_newline_arrow=arrow)
        theirs = cb_format_colorized.format_colorized(
            tokens, weights, tokenizer, draw_newline_arrow=arrow
        )
    assert ours == theirs


class _colors:
    """Forces colours on (or leaves them off) for termcolor and `shell.terminal` alike."""

    def __init__(self, forced: bool) -> None:
        self.forced = forced
        self.saved: str | None = None

    def __enter__(self) -> None:
        self.saved = os.environ.pop("FORCE_COLOR", None)
        if self.forced:
            os.environ["FORCE_COLOR"] = "1"
        termcolor.can_colorize.cache_clear()

    def __exit__(self, *exc: object) -> None:
        os.environ.pop("FORCE_COLOR", None)
        if self.saved is not None:
            os.environ["FORCE_COLOR"] = self.saved
        termcolor.can_colorize.cache_clear()


def test_format_colorized_refuses_unequal_lengths_as_the_cookbook() -> None:
    messages = []
    for module in (display, cb_format_colorized):
        with pytest.raises(ValueError) as caught:
            module.format_colorized([1, 2], [0.0], ByteTokenizer())
        messages.append(str(caught.value))
    assert messages[0] == messages[1]


def _datum() -> tinker.Datum:
    image = tinker.types.ImageChunk(data=b"png", format="png", expected_tokens=3)
    chunks: list[tinker.ModelInputChunk] = [
        tinker.EncodedTextChunk(tokens=[72, 105]),
        image,
        tinker.EncodedTextChunk(tokens=[33]),
    ]
    targets = np.array([105, 64, 64, 64, 33, 10])
    return tinker.Datum(
        model_input=tinker.ModelInput(chunks=chunks),
        loss_fn_inputs={
            "target_tokens": tinker.TensorData.from_numpy(targets),
            "weights": tinker.TensorData.from_numpy(np.array([0.0, 0, 0, 1, 1, -1])),
            "advantages": tinker.TensorData.from_numpy(np.array([0.0, 0, 0, -2, 3, 0])),
        },
    )


@pytest.mark.parametrize("key", ["weights", "advantages"])
def test_colorize_example_matches_the_cookbook(color_mode: str, key: str) -> None:
    tokenizer = ByteTokenizer()
    datum = _datum()
    assert display.colorize_example(datum, tokenizer, key=key) == (
        cb_display.colorize_example(datum, tokenizer, key=key)
    )
    for chunk in datum.model_input.chunks:
        assert display.to_ints(chunk, tokenizer) == cb_display.to_ints(chunk, tokenizer)


@pytest.mark.parametrize("only_last", [False, True])
def test_format_trajectory_matches_the_cookbook(color_mode: str, only_last: bool) -> None:
    tokenizer = ByteTokenizer()
    turns = [tokenizer.encode(t, add_special_tokens=False) for t in ("Hi", "there", "x")]
    theirs_traj = _trajectory(cb_rl_types, turns)
    theirs = cb_display.format_trajectory(theirs_traj, tokenizer, only_last_transition=only_last)
    # the cookbook's own trajectory, and ours converted to the cookbook's records
    assert display.format_trajectory(theirs_traj, tokenizer, only_last) == theirs
    ours_traj = _trajectory(rl_types, turns)
    group = rl_types.TrajectoryGroup(
        trajectories_G=[ours_traj], final_rewards_G=[0.0], metrics_G=[{}]
    )
    (converted,) = to_cookbook_groups([group])[0].trajectories_G
    assert display.format_trajectory(ours_traj, tokenizer, only_last) == (
        cb_display.format_trajectory(converted, tokenizer, only_last)
    )


# --- rl/play_w_env.py ----------------------------------------------------------------------------


def _typed(monkeypatch: pytest.MonkeyPatch, lines: list[str]) -> None:
    """`input()` answers `lines` in turn, echoing its prompt as the real one does."""
    answers = iter(lines)

    def fake_input(prompt: str = "") -> str:
        sys.stdout.write(prompt)
        return next(answers)

    monkeypatch.setattr("builtins.input", fake_input)


@pytest.mark.parametrize(
    ("multiline", "show", "lines"),
    [
        (False, True, ["go north"]),
        (False, False, ["é"]),
        (True, True, ["one", "", "two", "", "", "unused"]),
        (True, False, ["", ""]),
    ],
)
def test_manual_policy_reads_and_prints_as_the_cookbook(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    color_mode: str,
    multiline: bool,
    show: bool,
    lines: list[str],
) -> None:
    tokenizer = ByteTokenizer()
    ob = tinker.ModelInput.from_ints(tokenizer.encode("Room: dark", add_special_tokens=False))
    outputs = []
    for module in (play_w_env, cb_play):
        _typed(monkeypatch, lines)
        policy = module.ManualPolicy(tokenizer, multiline=multiline, show_observation=show)
        action = asyncio.run(policy(ob, ["\n"]))
        outputs.append((list(map(int, action.tokens)), policy.step_count, capsys.readouterr().out))
        assert action.maybe_logprobs is None
    assert outputs[0] == outputs[1]


class _CountdownEnv:
    """Built over a `types` module: two turns, reward 1 when the typed action is `"7"`."""

    @staticmethod
    def make(types: ModuleType) -> Any:
        class Env(types.Env):  # type: ignore[misc,name-defined]
            def __init__(self) -> None:
                self.turn = 0

            async def initial_observation(self) -> Any:
                return tinker.ModelInput.from_ints([71, 63]), ["\n"]

            async def step(self, action: Any, *, extra: Any = None) -> Any:
                self.turn += 1
                hit = [int(t) for t in action] == [55]
                return types.StepResult(
                    reward=1.0 if hit else 0.0,
                    episode_done=self.turn == 2,
                    next_observation=tinker.ModelInput.from_ints([71, 50 + self.turn]),
                    next_stop_condition=["\n"],
                    metrics={"hit": float(hit)},
                )

        return Env()


def test_play_env_plays_and_summarizes_as_the_cookbook(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], color_mode: str
) -> None:
    tokenizer = ByteTokenizer()
    results = []
    for module, types in ((play_w_env, rl_types), (cb_play, cb_rl_types)):
        _typed(monkeypatch, ["3", "7"])
        env = _CountdownEnv.make(types)
        trajectory = asyncio.run(module.play_env(env, tokenizer, multiline=False))
        rewards = [t.reward for t in trajectory.transitions]
        results.append((rewards, capsys.readouterr().out))
    assert results[0] == results[1]
    assert results[0][0] == [0.0, 1.0]


def test_print_trajectory_summary_matches_the_cookbook(
    capsys: pytest.CaptureFixture[str], color_mode: str
) -> None:
    for turns in ([[72]], [[72], [73], [74]]):
        play_w_env.print_trajectory_summary(_trajectory(rl_types, turns))
        ours = capsys.readouterr().out
        cb_play.print_trajectory_summary(_trajectory(cb_rl_types, turns))
        assert ours == capsys.readouterr().out


# --- the recipe entry points, by the port rule -----------------------------------------------------


@pytest.fixture
def ported_recipes() -> Iterator[None]:
    """Sibling recipe modules (`shell.cookbook.recipes.*`) served ported while a test runs."""
    with serve_ported_recipes():
        yield


PORTED_ENTRY_POINTS = [
    "recipes/preference/shorter/train.py",
    "recipes/code_rl/code_grading.py",
    "recipes/code_rl/code_env.py",
    "recipes/code_rl/deepcoder_tool.py",
    "recipes/code_rl/lcb_utils.py",
    "recipes/code_rl/train.py",
    "recipes/harbor_rl/harbor_env.py",
    "recipes/harbor_rl/harbor_tools.py",
    "recipes/harbor_rl/train.py",
    "recipes/harbor_rl/eval.py",
    "recipes/harbor_rl/scripts/train_terminal_bench.py",
    "recipes/harbor_rl/scripts/eval_harbor_rl.py",
    "rl/preference_envs.py",
    "rl/play_w_env.py",
]
"""Recipe files that import by the port rule once this module's facades exist."""


@pytest.mark.parametrize("path", PORTED_ENTRY_POINTS)
def test_the_recipe_file_imports_by_the_port_rule(path: str, ported_recipes: None) -> None:
    module = ported_module(path)
    assert module.__name__ == "ported." + path.removesuffix(".py").replace("/", ".")


def test_text_arenas_play_script_imports_with_textarena(ported_recipes: None) -> None:
    """`play.py` takes `ManualPolicy` and `print_trajectory_summary` from `rl.play_w_env`; its
    env module needs the recipe's extra, `textarena`."""
    pytest.importorskip("textarena")
    module = ported_module("recipes/multiplayer_rl/text_arena/play.py")
    assert module.ManualPolicy is play_w_env.ManualPolicy


def test_the_shorter_recipe_builds_our_preference_dataset_builder(ported_recipes: None) -> None:
    module = ported_module("recipes/preference/shorter/train.py")
    assert module.PairwisePreferenceRLDatasetBuilder is (
        preference_envs.PairwisePreferenceRLDatasetBuilder
    )


def test_code_grading_without_a_sandboxfusion_server_names_it(
    ported_recipes: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recipe's grader, unchanged, against a closed port: it fails the sample with the one
    line naming SandboxFusion (the cookbook's grader returns `(False, {"error": ...})` too)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("SANDBOX_URL", f"http://127.0.0.1:{port}/run_code")
    grading = importlib.import_module("shell.cookbook.recipes.code_rl.code_grading")
    sample = [{"input": "1\n", "output": "1\n", "testtype": "stdin_stdout", "metadata": {}}]
    ok, details = asyncio.run(grading.sandbox_check_correctness(sample, "print(input())"))
    assert ok is False
    assert details["error"].startswith("SandboxFusion is not reachable at http://127.0.0.1:")
    assert "docker run" in details["error"]
    ok, details = asyncio.run(
        grading.sandbox_check_correctness(
            sample, "print(1)", backend=facade_sandbox.SandboxBackend.MODAL
        )
    )
    assert ok is False  # `import modal` fails first, inside the grader's own try
    assert "modal" in details["error"]


def test_metric_util_has_the_cookbooks_names_and_parameters() -> None:
    """`compute_trajectory_metrics` takes the cookbook's parameter names (it was rlpure's
    `trajectory_metrics(groups_P, tags_P)`), and `RLTestSetEvaluator` has its public
    `eval_token_completer`."""
    from tinker_cookbook.rl import metric_util as theirs

    from shell.cookbook.rl import metric_util as ours

    def parameters(function: Any) -> list[tuple[str, Any]]:
        return [(p.name, p.kind) for p in inspect.signature(function).parameters.values()]

    assert parameters(ours.compute_trajectory_metrics) == parameters(
        theirs.compute_trajectory_metrics
    )
    assert parameters(ours.RLTestSetEvaluator.eval_token_completer) == parameters(
        theirs.RLTestSetEvaluator.eval_token_completer
    )
