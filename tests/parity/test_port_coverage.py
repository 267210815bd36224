"""Coverage of the port rule: every `.py` file of the cookbook's `recipes/` and `rl/`, ported.

Each file of the installed tinker-cookbook 0.6.1's `recipes/` and `rl/` is rewritten by the port
rule and imported in its own forked child of one fresh process (`porting.port_coverage`), so no
file sees what another left behind. A file either imports or fails for one reason: (a)
`third-party`, a package that is not installed; (b) `cookbook`, a cookbook module the facade
lacks; (c) `other`, the exception's first line. The table and the counts are written to
`port_coverage.txt` in the test's temporary folder and printed whatever `-s` says. The test
fails when a file of `EXPECTED_IMPORTS` stops importing, when a file fails in a way
`KNOWN_GAPS` does not list (a new gap, or a known one whose reason changed), and when a file of
`KNOWN_GAPS` now imports (move it to `EXPECTED_IMPORTS`). Needs the cookbook (`make parity`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import msgspec
import pytest

from tests.parity.porting import (
    Category,
    ImportOutcome,
    classify_import_error,
    cookbook_files,
    require_cookbook,
)

COOKBOOK = require_cookbook()
REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 240
"""The whole run's limit (it takes well under a minute on two cores)."""

ENTRY_POINTS_NOT_IMPORTED = frozenset({"recipes/chat_sl/sweep/__main__.py"})
"""`__main__.py` files: `python -m` entry points that parse `sys.argv` at import."""

RL_ENTRY_POINTS = (
    "recipes/audio/medical_asr/train.py",
    "recipes/chat_sl/train.py",
    "recipes/code_rl/train.py",
    "recipes/decisions/train.py",
    "recipes/forecasting/train.py",
    "recipes/harbor_rl/train.py",
    "recipes/math_rl/train.py",
    "recipes/multiplayer_rl/guess_number/train.py",
    "recipes/multiplayer_rl/text_arena/train.py",
    "recipes/multiplayer_rl/twenty_questions/train.py",
    "recipes/preference/dpo/train.py",
    "recipes/preference/shorter/train.py",
    "recipes/prompt_distillation/train.py",
    "recipes/rl_basic.py",
    "recipes/rl_loop.py",
    "recipes/rl_numerics_check/train.py",
    "recipes/rubric/train.py",
    "recipes/sdft/train.py",
    "recipes/search_tool/train.py",
    "recipes/verifiers_rl/train.py",
    "recipes/vlm_classifier/train.py",
)
"""The recipes' `train.py` files, plus `rl_basic.py` and `rl_loop.py`, as the cookbook has them."""

EXPECTED_IMPORTS: frozenset[str] = frozenset(
    {
        "recipes/audio/__init__.py",
        "recipes/audio/asr/__init__.py",
        "recipes/audio/emotion/__init__.py",
        "recipes/audio/emotion/prepare_data.py",
        "recipes/audio/grading.py",
        "recipes/audio/medical_asr/__init__.py",
        "recipes/chat_sl/sweep/__init__.py",
        "recipes/chat_sl/sweep/analyze.py",
        "recipes/chat_sl/sweep/cli.py",
        "recipes/chat_sl/sweep/grid.py",
        "recipes/chat_sl/sweep/launch_all.py",
        "recipes/chat_sl/sweep/results.py",
        "recipes/chat_sl/sweep/runner.py",
        "recipes/code_rl/code_env.py",
        "recipes/code_rl/code_grading.py",
        "recipes/code_rl/deepcoder_tool.py",
        "recipes/code_rl/lcb_utils.py",
        "recipes/code_rl/train.py",
        "recipes/distillation/harbor_multiturn.py",
        "recipes/forecasting/__init__.py",
        "recipes/forecasting/data.py",
        "recipes/forecasting/env.py",
        "recipes/forecasting/train.py",
        "recipes/harbor_rl/eval.py",
        "recipes/harbor_rl/harbor_env.py",
        "recipes/harbor_rl/harbor_tools.py",
        "recipes/harbor_rl/scripts/eval_harbor_rl.py",
        "recipes/harbor_rl/scripts/train_terminal_bench.py",
        "recipes/harbor_rl/train.py",
        "recipes/math_rl/arithmetic_env.py",
        "recipes/math_rl/math_env.py",
        "recipes/math_rl/math_grading.py",
        "recipes/math_rl/train.py",
        "recipes/multiplayer_rl/guess_number/env.py",
        "recipes/multiplayer_rl/guess_number/train.py",
        "recipes/multiplayer_rl/text_arena/env.py",
        "recipes/multiplayer_rl/text_arena/play.py",
        "recipes/multiplayer_rl/text_arena/tictactoe.py",
        "recipes/multiplayer_rl/text_arena/train.py",
        "recipes/multiplayer_rl/twenty_questions/env.py",
        "recipes/multiplayer_rl/twenty_questions/train.py",
        "recipes/preference/datasets.py",
        "recipes/preference/shorter/env.py",
        "recipes/preference/shorter/train.py",
        "recipes/prompt_distillation/create_data.py",
        "recipes/rl_basic.py",
        "recipes/rl_loop.py",
        "recipes/rl_numerics_check/__init__.py",
        "recipes/rl_numerics_check/env.py",
        "recipes/rl_numerics_check/train.py",
        "recipes/rubric/data.py",
        "recipes/rubric/debug_env.py",
        "recipes/rubric/env.py",
        "recipes/rubric/generate_data.py",
        "recipes/rubric/prometheus_experimental.py",
        "recipes/rubric/train.py",
        "recipes/sdft/__init__.py",
        "recipes/sdft/benchmark.py",
        "recipes/sdft/eval.py",
        "recipes/search_tool/embedding.py",
        "recipes/search_tool/offline_eval.py",
        "recipes/search_tool/search_env.py",
        "recipes/search_tool/tools.py",
        "recipes/search_tool/train.py",
        "recipes/sl_loop.py",
        "recipes/true_thinking_score/__init__.py",
        "recipes/true_thinking_score/analyze.py",
        "recipes/true_thinking_score/run_small_experiment.py",
        "recipes/true_thinking_score/tts.py",
        "recipes/verifiers_rl/evaluate.py",
        "recipes/verifiers_rl/tinker_openai.py",
        "recipes/verifiers_rl/train.py",
        "recipes/verifiers_rl/verifiers_env.py",
        "rl/__init__.py",
        "rl/data_processing.py",
        "rl/dataset_utils.py",
        "rl/interleaved.py",
        "rl/message_env.py",
        "rl/metrics.py",
        "rl/play_w_env.py",
        "rl/preference_envs.py",
        "rl/problem_env.py",
        "rl/rollout_limits.py",
        "rl/rollout_logging.py",
        "rl/rollout_presets.py",
        "rl/rollout_runner.py",
        "rl/rollout_strategy.py",
        "rl/rollouts.py",
        "rl/types.py",
    }
)
"""Files that import by the port rule today: one that stops importing is a regression."""

KNOWN_GAPS: dict[str, tuple[Category, str]] = {
    "recipes/audio/asr/env.py": ("cookbook", "renderers.tml_v0"),
    "recipes/audio/asr/rl_train.py": ("cookbook", "renderers.tml_v0"),
    "recipes/audio/asr/sl_train.py": ("cookbook", "renderers.tml_v0"),
    "recipes/audio/data.py": ("cookbook", "renderers.tml_v0"),
    "recipes/audio/emotion/env.py": ("cookbook", "renderers.tml_v0"),
    "recipes/audio/emotion/evaluate.py": ("cookbook", "renderers.tml_v0"),
    "recipes/audio/emotion/rl_train.py": ("cookbook", "renderers.tml_v0"),
    "recipes/audio/emotion/sl_train.py": ("cookbook", "renderers.tml_v0"),
    "recipes/audio/medical_asr/env.py": ("cookbook", "renderers.tml_v0"),
    "recipes/audio/medical_asr/train.py": ("cookbook", "renderers.tml_v0"),
    "recipes/chat_sl/chat_datasets.py": (
        "cookbook",
        "supervised.data.SupervisedDatasetFromHFDataset",
    ),
    "recipes/chat_sl/train.py": ("cookbook", "supervised.data.SupervisedDatasetFromHFDataset"),
    "recipes/decisions/__init__.py": ("cookbook", "renderers.tml_v0"),
    "recipes/decisions/decision.py": ("cookbook", "renderers.tml_v0"),
    "recipes/decisions/demo.py": ("cookbook", "renderers.tml_v0"),
    "recipes/decisions/forecasting.py": ("cookbook", "renderers.tml_v0"),
    "recipes/decisions/train.py": ("cookbook", "renderers.tml_v0"),
    "recipes/distillation/off_policy_reasoning.py": ("cookbook", "supervised.train"),
    "recipes/distillation/on_policy_distillation.py": ("cookbook", "distillation"),
    "recipes/distillation/on_policy_distillation_harbor_multi_turn.py": (
        "cookbook",
        "distillation",
    ),
    "recipes/distillation/on_policy_multi_teacher.py": ("cookbook", "distillation"),
    "recipes/preference/dpo/train.py": ("cookbook", "preference.train_dpo"),
    "recipes/preference/rlhf/rlhf_pipeline.py": (
        "cookbook",
        "preference.comparison_policy_evaluator",
    ),
    "recipes/prompt_distillation/train.py": ("cookbook", "supervised.train"),
    "recipes/sdft/datasets.py": ("cookbook", "distillation"),
    "recipes/sdft/run_continual_learning.py": ("cookbook", "distillation"),
    "recipes/sdft/train.py": ("cookbook", "distillation"),
    "recipes/sl_basic.py": ("cookbook", "supervised.data.SupervisedDatasetFromHFDataset"),
    "recipes/vlm_classifier/data.py": ("cookbook", "image_processing_utils"),
    "recipes/vlm_classifier/eval.py": ("cookbook", "image_processing_utils"),
    "recipes/vlm_classifier/eval_sweep.py": ("cookbook", "image_processing_utils"),
    "recipes/vlm_classifier/sweep.py": ("cookbook", "image_processing_utils"),
    "recipes/vlm_classifier/train.py": ("cookbook", "image_processing_utils"),
    "rl/metric_util.py": ("cookbook", "eval.benchmarks._types"),
    "rl/train.py": ("cookbook", "rl.metrics"),
}
"""Files that do not import yet → (category, the module named, or for `other` the first line)."""

_TML_V0 = (
    "renderers.tml_v0 needs tml-renderers>=0.4.1, which the package registry here does not have "
    "(0.2.1 is its newest)"
)
ENTRY_POINTS_OUT_OF_SCOPE: dict[str, str] = {
    "recipes/audio/medical_asr/train.py": f"supervised fine-tuning of an audio model; {_TML_V0}",
    "recipes/chat_sl/train.py": "supervised fine-tuning (`supervised.*`): out of scope",
    "recipes/decisions/train.py": f"supervised fine-tuning (`supervised.common`); {_TML_V0}",
    "recipes/preference/dpo/train.py": "DPO (`preference.train_dpo` over `supervised.*`): "
    "out of scope",
    "recipes/prompt_distillation/train.py": "supervised fine-tuning on distilled prompts "
    "(`supervised.*`): out of scope",
    "recipes/sdft/train.py": "self-distillation fine-tuning (`distillation.sdft`): not ported",
    "recipes/vlm_classifier/train.py": "a vision-language classifier trained with "
    "`supervised.*` (and `image_processing_utils`): out of scope",
}
"""The entry points of `RL_ENTRY_POINTS` that do not import, each with its one-line reason (the
README's out-of-scope list); every other entry point must be in `EXPECTED_IMPORTS`."""


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ImportOutcome]:
    """Every file's outcome, from `python -m tests.parity.porting` run in a fresh process."""
    where = tmp_path_factory.mktemp("port_coverage")
    out = where / "outcomes.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    run = subprocess.run(
        [sys.executable, "-m", "tests.parity.porting", str(out)],
        cwd=where,  # a file that writes where it runs writes here
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    decoded = msgspec.json.decode(out.read_bytes(), type=list[ImportOutcome])
    return {outcome.path: outcome for outcome in decoded}


def _report(outcomes: dict[str, ImportOutcome]) -> str:
    """The table (file, outcome, module or reason) and the counts."""
    width = max(len(path) for path in outcomes)
    rows = [f"{o.path:<{width}}  {o.category:<11}  {o.detail}".rstrip() for o in outcomes.values()]
    tried = [o for o in outcomes.values() if o.category != "entry point"]
    imported = [o for o in tried if o.category == "imports"]
    rl_imported = [p for p in RL_ENTRY_POINTS if outcomes[p].category == "imports"]
    by_category = Counter(o.category for o in outcomes.values())
    return "\n".join(
        [
            *rows,
            "",
            f"{len(imported)} of {len(tried)} files import; RL entry points: "
            f"{len(rl_imported)} of {len(RL_ENTRY_POINTS)}",
            "by outcome: " + ", ".join(f"{k} {v}" for k, v in sorted(by_category.items())),
            "RL entry points that do not import, and why:",
            *(f"  {p}: {why}" for p, why in ENTRY_POINTS_OUT_OF_SCOPE.items()),
        ]
    )


def test_the_report_is_written_and_printed(
    outcomes: dict[str, ImportOutcome],
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    report = _report(outcomes)
    path = tmp_path_factory.getbasetemp() / "port_coverage.txt"
    path.write_text(report + "\n")
    with capsys.disabled():
        print(f"\n--- port coverage (also in {path}) ---\n{report}")
    assert set(outcomes) == set(cookbook_files(COOKBOOK))


def test_the_lists_name_each_file_of_the_cookbook_once() -> None:
    files = set(cookbook_files(COOKBOOK))
    listed = [*EXPECTED_IMPORTS, *KNOWN_GAPS, *ENTRY_POINTS_NOT_IMPORTED]
    assert [p for p, n in Counter(listed).items() if n > 1] == []
    assert sorted(files - set(listed)) == [], "a new cookbook file: list it"
    assert sorted(set(listed) - files) == [], "no longer in the cookbook: unlist it"
    assert {p for p in files if p.endswith("__main__.py")} == ENTRY_POINTS_NOT_IMPORTED


def test_the_rl_entry_points_are_the_cookbooks() -> None:
    trains = {p for p in cookbook_files(COOKBOOK, folders=("recipes",)) if p.endswith("/train.py")}
    assert set(RL_ENTRY_POINTS) == trains | {"recipes/rl_basic.py", "recipes/rl_loop.py"}


def test_every_rl_entry_point_imports_or_says_why_not() -> None:
    unaccounted = [
        p
        for p in RL_ENTRY_POINTS
        if p not in EXPECTED_IMPORTS and p not in ENTRY_POINTS_OUT_OF_SCOPE
    ]
    assert unaccounted == [], "import it, or give its one-line reason in ENTRY_POINTS_OUT_OF_SCOPE"
    assert sorted(set(ENTRY_POINTS_OUT_OF_SCOPE) - set(RL_ENTRY_POINTS)) == []
    assert sorted(set(ENTRY_POINTS_OUT_OF_SCOPE) & EXPECTED_IMPORTS) == [], "it imports: unlist it"
    assert sorted(set(ENTRY_POINTS_OUT_OF_SCOPE) - set(KNOWN_GAPS)) == []


def test_every_expected_file_imports(outcomes: dict[str, ImportOutcome]) -> None:
    broken = {
        p: f"{outcomes[p].category}: {outcomes[p].detail}"
        for p in sorted(EXPECTED_IMPORTS)
        if outcomes[p].category != "imports"
    }
    assert broken == {}, "these imported before: a regression"


def test_every_failure_is_a_known_gap(outcomes: dict[str, ImportOutcome]) -> None:
    fixed = sorted(p for p in KNOWN_GAPS if outcomes[p].category == "imports")
    assert fixed == [], "imports now: remove it from KNOWN_GAPS (and add it to EXPECTED_IMPORTS)"
    failing = {
        o.path: (o.category, o.detail)
        for o in outcomes.values()
        if o.category not in ("imports", "entry point")
    }
    new = {p: failing[p] for p in sorted(failing) if p not in KNOWN_GAPS}
    assert new == {}, "a new gap: fix it, or list it in KNOWN_GAPS"
    changed = {
        p: {"now": failing[p], "listed": KNOWN_GAPS[p]}
        for p in sorted(failing)
        if failing[p] != KNOWN_GAPS[p]
    }
    assert changed == {}, "a known gap fails for another reason now: update KNOWN_GAPS"


def _raised(error: BaseException, *, cause: BaseException | None = None) -> BaseException:
    try:
        raise error from cause
    except BaseException as raised:
        return raised


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            ModuleNotFoundError("No module named 'chromadb'", name="chromadb"),
            ("third-party", "chromadb"),
        ),
        (
            _raised(
                ImportError("math-rl dependencies are required"),
                cause=ModuleNotFoundError("No module named 'pylatexenc'", name="pylatexenc"),
            ),
            ("third-party", "pylatexenc"),
        ),
        (
            ModuleNotFoundError(
                "No module named 'shell.cookbook.supervised'", name="shell.cookbook.supervised"
            ),
            ("cookbook", "supervised"),
        ),
        (
            ImportError(
                "cannot import name 'metrics' from 'shell.cookbook.rl' (/x/rl/__init__.py)"
            ),
            ("cookbook", "rl.metrics"),
        ),
        (
            ImportError(
                "cannot import name 'SupervisedDatasetFromHFDataset' from "
                "'shell.cookbook.supervised.data' (/x/supervised/data.py)"
            ),
            ("cookbook", "supervised.data.SupervisedDatasetFromHFDataset"),
        ),
        (
            ImportError("cannot import name 'Nope' from 'shell.cookbook.rl' (/x/rl/__init__.py)"),
            ("other", "ImportError: cannot import name 'Nope' from 'shell.cookbook.rl'"),
        ),
        (
            ModuleNotFoundError(
                "No module named 'shell.cookbook.nope'", name="shell.cookbook.nope"
            ),
            ("other", "ModuleNotFoundError: No module named 'shell.cookbook.nope'"),
        ),
        (
            ModuleNotFoundError("No module named 'shell.gone'", name="shell.gone"),
            ("other", "ModuleNotFoundError: No module named 'shell.gone'"),
        ),
        (ValueError("bad config\nsecond line"), ("other", "ValueError: bad config")),
    ],
)
def test_an_import_error_is_classified_by_what_is_missing(
    error: BaseException, expected: tuple[Category, str]
) -> None:
    assert classify_import_error(error, cookbook=COOKBOOK) == expected
