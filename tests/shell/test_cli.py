"""Tests for the `rlpure` command line (`shell.cli`) and the config loader (`shell.config`)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from shell import cli
from shell.commands import Command, TrainRecipe, by_name
from shell.config import (
    FIELD_HELP,
    AsyncConfig,
    TrainConfig,
    build_config,
    field_choices,
    load_config_file,
)
from shell.errors import ConfigError
from shell.jobs import COMMANDS, TRAIN_RECIPES, gsm8k, toy
from shell.jobs.smollm2 import SMOLLM2_CONFIG_DEFAULTS
from shell.training import load_checkpoints, read_jsonl

REPO = Path(__file__).resolve().parents[2]


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 0
    return capsys.readouterr().out


def test_top_level_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    out = _help(["--help"], capsys)
    assert "train" in out and "COMMAND" in out


def test_train_help_explains_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    out = " ".join(_help(["train", "--help"], capsys).split())
    for name, text in FIELD_HELP.items():
        assert "--" + name.replace("_", "-") in out, name
        assert " ".join(text.split())[:40] in out, name
    assert "--config FILE" in out
    assert "toy" in out  # the built-in recipe is listed


def test_recipe_help_adds_the_recipe_options_and_defaults(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = _help(["train", "toy", "--help"], capsys)
    assert "--group-size" in out and "--max-steps" in out
    assert "(default: 4)" in " ".join(out.split())  # toy's max_tokens default


def test_config_precedence_is_defaults_recipe_file_flags(tmp_path: Path) -> None:
    config_file = tmp_path / "run.toml"
    config_file.write_text(
        'max_tokens = 9\nlearning_rate = 0.5\nloss_fn = "ppo"\n'
        "loss_fn_config = {clip_high_threshold = 1.5}\n"
    )
    parser = cli.build_parser()
    args = parser.parse_args(
        ["train", "toy", "--config", str(config_file), "--learning-rate", "0.25", "--max-steps", "none"]
    )  # fmt: skip
    config = cli._config_from_args(TRAIN_RECIPES["toy"], args)
    assert config.max_tokens == 9  # file beats the recipe default (4)
    assert config.learning_rate == 0.25  # flag beats file
    assert config.save_every == 4  # recipe default beats TrainConfig's 0
    assert config.loss_fn_config == {"clip_high_threshold": 1.5}
    assert config.max_steps is None
    assert config.seed == TrainConfig().seed


def test_options_before_the_recipe_name_work_too() -> None:
    args = cli.build_parser().parse_args(["train", "--seed", "5", "toy", "--max-tokens", "3"])
    config = cli._config_from_args(TRAIN_RECIPES["toy"], args)
    assert (config.seed, config.max_tokens) == (5, 3)


def test_a_nested_record_flag_takes_json() -> None:
    args = cli.build_parser().parse_args(
        ["train", "toy", "--termination", '{"zero_reward_on_limit": true}']
    )
    config = cli._config_from_args(TRAIN_RECIPES["toy"], args)
    assert config.termination is not None and config.termination.zero_reward_on_limit


def test_json_config_files_load_and_bad_files_are_config_errors(tmp_path: Path) -> None:
    (tmp_path / "c.json").write_text(json.dumps({"seed": 3}))
    assert load_config_file(tmp_path / "c.json") == {"seed": 3}
    (tmp_path / "c.yaml").write_text("seed: 3")
    with pytest.raises(ConfigError, match=r"toml or \.json"):
        load_config_file(tmp_path / "c.yaml")
    (tmp_path / "bad.toml").write_text("seed = ")
    with pytest.raises(ConfigError, match=r"bad\.toml"):
        load_config_file(tmp_path / "bad.toml")
    with pytest.raises(ConfigError, match="unknown field `sede`"):
        build_config({"sede": 3})
    with pytest.raises(ConfigError, match=r"TrainConfig\.num_substeps"):
        build_config({"num_substeps": 0})
    with pytest.raises(ConfigError, match="aggregation_length"):
        build_config({"loss_aggregation": "constant_length"})
    # Non-finite floats cannot be recorded in config.json (JSON has no inf/NaN) nor sent to
    # Tinker, so they are refused up front instead of breaking every later resume.
    inf = float("inf")
    with pytest.raises(ConfigError, match=r"aggregation_length: must be finite"):
        build_config({"loss_aggregation": "constant_length", "aggregation_length": inf})
    with pytest.raises(ConfigError, match=r"loss_fn_config: \['clip_high_threshold'\] must be"):
        build_config({"loss_fn_config": {"clip_high_threshold": inf}})
    with pytest.raises(ConfigError, match=r"rollout_timeout: must be finite"):
        build_config({"rollout_strategy": "retry", "rollout_timeout": inf})
    # what the local losses would refuse at the first batch, after the rollouts (a traceback)
    local = {"backend": "local"}
    with pytest.raises(ConfigError, match=r"loss_fn_config: dro: config \['beta'\] must be"):
        build_config({**local, "loss_fn": "dro"})
    with pytest.raises(ConfigError, match=r"importance_sampling: unknown config keys \['bogus'\]"):
        build_config({**local, "loss_fn_config": {"bogus": 1.0}})
    with pytest.raises(ConfigError, match=r"ppo: unknown config keys \['beta'\]"):
        build_config({**local, "async_config": {"max_steps_off_policy": 1, "groups_per_batch": 2,
                      "loss_fn": "ppo"}, "loss_fn_config": {"beta": 0.1}})  # fmt: skip
    assert build_config({**local, "loss_fn": "dro", "loss_fn_config": {"beta": 0.1}})


def test_a_field_constraint_reads_the_same_built_directly_or_decoded() -> None:
    """The constraints live in the field types: msgspec checks them when decoding
    (`build_config`), `TrainConfig` refuses the same values when built directly."""
    cases: dict[str, tuple[object, str]] = {
        "seed": (-1, r"TrainConfig\.seed: must lie in \[0, 9223372036854775807\], got -1$"),
        "adam_beta1": (1.0, r"TrainConfig\.adam_beta1: must lie in \[0, 1\), got 1\.0$"),
        "learning_rate": (float("nan"), r"TrainConfig\.learning_rate: must be finite and > 0"),
        "wandb_project": ("", r"TrainConfig\.wandb_project: must be non-empty \(or null\)"),
        "backend": ("gpu", r"TrainConfig\.backend: must be one of .*'local'.*, got 'gpu'$"),
    }
    for field, (value, message) in cases.items():
        with pytest.raises(ConfigError, match=message):
            TrainConfig(**{field: value})  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=message):
            build_config({field: value})
    bad_async = AsyncConfig(max_steps_off_policy=0, groups_per_batch=0)
    with pytest.raises(ConfigError, match=r"async_config\.groups_per_batch: must be >= 1, got 0"):
        TrainConfig(backend="fake", async_config=bad_async)


def test_only_literal_fields_offer_choices_on_the_command_line() -> None:
    assert field_choices("backend") == ("local", "tinker", "fake")
    assert field_choices("eval_temperature") is None  # it once gave (), refusing every value
    args = cli.build_parser().parse_args(["train", "toy", "--eval-temperature", "0.5"])
    assert cli._config_from_args(TRAIN_RECIPES["toy"], args).eval_temperature == 0.5


def test_invalid_options_exit_with_code_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = cli.main(["train", "toy", "--backend", "fake", "--log-dir", str(tmp_path), "--learning-rate", "-1"])  # fmt: skip
    assert code == 2
    assert "TrainConfig.learning_rate" in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "value", "expected"), [("--seed", "abc", "an integer"), ("--learning-rate", "fast", "a number")])  # fmt: skip
def test_a_numeric_flag_parses_as_its_field_type_and_names_what_it_expected(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flag: str, value: str, expected: str
) -> None:
    parser = cli.build_parser()
    args = parser.parse_args(["train", "toy", "--seed", "3", "--learning-rate", "1e-3"])
    assert (args.seed, args.learning_rate) == (3, 1e-3)  # typed by argparse, not left as text
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "toy", "--backend", "fake", "--log-dir", str(tmp_path), flag, value])
    assert exit_info.value.code == 2
    assert f"argument {flag}: expected {expected}, got {value!r}" in capsys.readouterr().err


def test_another_base_model_for_smollm2_addition_is_one_line_naming_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # its ChatML renderer refused the tokenizer with a ValueError: a traceback
    code = cli.main(["train", "smollm2-addition", "--base-model", "rlpure/tiny", "--max-steps", "1", "--eval-every", "0", "--log-dir", str(tmp_path)])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert "TrainConfig.base_model: 'rlpure/tiny' cannot run this recipe" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_prompt_past_the_context_length_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # max_tokens passes the config check (< the context length), the prompt pushes it past
    code = cli.main(["train", "toy", "--backend", "local", "--max-tokens", "2047", "--max-steps", "1", "--log-dir", str(tmp_path)])  # fmt: skip
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        "rlpure: ContextLengthError: sample: prompt length 3 + max_tokens 2047 exceeds the "
        "model's context length 2048; lower max_tokens or shorten the prompt"
    )
    assert not any("Traceback" in line for line in err)


def test_verbose_before_or_after_serve_is_kept() -> None:
    # serve's own -v defaulted to False and reset `rlpure -v serve`'s
    parser = cli.build_parser()
    verbose = [parser.parse_args(argv).verbose for argv in (["-v", "serve"], ["serve", "-v"], ["serve"])]  # fmt: skip
    assert verbose == [True, True, False]


def test_an_unknown_kl_reference_model_is_named_as_such(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = cli.main(["train", "toy", "--backend", "local", "--kl-penalty-coef", "0.1", "--kl-reference-model", "nosuch/model", "--max-steps", "1", "--log-dir", str(tmp_path)])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert "TrainConfig.kl_reference_model: unknown base_model 'nosuch/model'" in err


def test_tinker_backend_needs_the_api_key_in_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    code = cli.main(["train", "toy", "--backend", "tinker", "--log-dir", str(tmp_path)])
    assert code == 2
    assert "TINKER_API_KEY" in capsys.readouterr().err


def _logged(log_dir: Path) -> list[int | str]:
    """The steps of `log_dir/metrics.jsonl`'s rows; the final evaluation's as `eval@N`, the
    final totals row (the cookbook's `cumulative_metrics()` row) as `totals@N`."""
    return [
        f"eval@{r['step']}"
        if "final_eval" in r
        else f"totals@{r['step']}"
        if "final_totals" in r
        else r["step"]
        for r in read_jsonl(log_dir / "metrics.jsonl")
    ]


def test_toy_recipe_trains_end_to_end_on_the_fake_backend(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log_dir = tmp_path / "toy"
    code = cli.main(
        ["train", "toy", "--backend", "fake", "--log-dir", str(log_dir), "--max-steps", "3",
         "--num-substeps", "2", "--rollout-strategy", "retry"]
    )  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "Step  0 | reward:" in out and "Trained steps 0..2 (3 steps, 3 in total)" in out
    assert _logged(log_dir) == [0, 1, 2, "eval@3", "totals@3"]
    assert (log_dir / "reward_curve.png").exists()
    saved = json.loads((log_dir / "config.json").read_text())
    assert saved["rollout_strategy"] == "retry" and saved["num_substeps"] == 2


def test_main_runs_commands_and_recipes_given_as_records(tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    def hello(args: argparse.Namespace) -> int:
        seen["hello"] = args.name
        return 3

    async def probe(config: TrainConfig, args: argparse.Namespace) -> None:
        seen["config"] = config

    commands = by_name(
        [
            *COMMANDS.values(),
            Command(
                "hello",
                help="Say hello.",
                run=hello,
                add_arguments=lambda p: p.add_argument("--name", default="world"),
            ),
        ]
    )
    recipes = by_name(
        [
            *TRAIN_RECIPES.values(),
            TrainRecipe("probe", "Records its config.", probe, defaults={"max_tokens": 7}),
        ]
    )
    assert cli.main(["hello", "--name", "rl"], commands=commands, recipes=recipes) == 3
    assert seen["hello"] == "rl"
    argv = ["train", "probe", "--log-dir", str(tmp_path), "--seed", "2"]
    assert cli.main(argv, commands=commands, recipes=recipes) == 0
    assert (seen["config"].max_tokens, seen["config"].seed) == (7, 2)
    with pytest.raises(ValueError, match="already registered"):
        by_name([*commands.values(), Command("hello", "again", hello)])
    with pytest.raises(ValueError, match="reserved"):
        Command("train", "shadows rlpure train", hello)
    with pytest.raises(ValueError, match="unknown TrainConfig defaults"):
        TrainRecipe("bad", "x", probe, defaults={"nope": 1})


def test_gsm8k_resume_with_a_changed_recipe_flag_exits_with_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    rows = "".join(
        json.dumps({"question": f"{k} + 1?", "answer": f"#### {k + 1}"}) + "\n" for k in range(4)
    )
    for split in ("train", "test"):
        (data / f"{split}.jsonl").write_text(rows)
    log_dir = tmp_path / "run"
    argv = ["train", "gsm8k", "--backend", "fake", "--data-dir", str(data), "--log-dir",
            str(log_dir), "--cache-dir", str(tmp_path / "cache"), "--max-tokens", "4",
            "--group-size", "2", "--max-test-problems", "0", "--no-progress"]  # fmt: skip
    assert cli.main([*argv, "--batch-size", "2", "--max-steps", "1"]) == 0
    capsys.readouterr()
    assert cli.main([*argv, "--batch-size", "1", "--max-steps", "2"]) == 2
    err = capsys.readouterr().err
    assert "configuration error" in err and "recipe option batch_size: 2 -> 1" in err
    assert _logged(log_dir) == [0, "totals@1"]
    assert cli.main([*argv, "--batch-size", "2", "--max-steps", "2"]) == 0
    assert _logged(log_dir) == [0, 1, "totals@2"]  # the old totals row dropped on resume
    assert [r.step for r in load_checkpoints(log_dir)] == [1, 2]


@pytest.mark.parametrize(
    ("flag", "value", "named"),
    [
        ("--group-size", "3", "recipe option group_size: 2 -> 3"),
        ("--groups-per-batch", "2", "recipe option groups_per_batch: 3 -> 2"),
    ],
)
def test_toy_resume_with_a_changed_recipe_flag_exits_with_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str, named: str
) -> None:
    log_dir = tmp_path / "run"
    base = ["train", "toy", "--backend", "fake", "--log-dir", str(log_dir), "--eval-every", "0",
            "--no-progress", "--num-batches", "4"]  # fmt: skip
    shape = {"--group-size": "2", "--groups-per-batch": "3"}

    def argv(max_steps: int, **changed: str) -> list[str]:
        flags = [part for item in {**shape, **changed}.items() for part in item]
        return [*base, *flags, "--max-steps", str(max_steps)]

    assert cli.main(argv(1)) == 0
    recorded = json.loads((log_dir / "recipe_options.json").read_text())
    assert recorded == {"recipe": "toy", "group_size": 2, "groups_per_batch": 3}
    capsys.readouterr()
    assert cli.main(argv(2, **{flag: value})) == 2
    err = capsys.readouterr().err
    assert "configuration error" in err and named in err
    assert _logged(log_dir) == [0, "totals@1"]
    assert [r.step for r in load_checkpoints(log_dir)] == [1]
    assert json.loads((log_dir / "recipe_options.json").read_text()) == recorded
    # unchanged options resume; so do changes to what may change (toy.TOY_RESUME_MAY_CHANGE)
    assert cli.main(argv(2)) == 0
    assert cli.main([*argv(3), "--num-batches", "6", "--env-latency", "0.001"]) == 0
    assert _logged(log_dir) == [0, 1, 2, "totals@3"]
    assert [r.step for r in load_checkpoints(log_dir)] == [1, 2, 3]


def test_every_toy_flag_is_recorded_or_allowed_to_change_on_resume() -> None:
    """A new toy flag must be recorded for the resume check, or declared free to change."""
    args = cli.build_parser().parse_args(["train", "toy"])
    not_toy = {*TrainConfig.__struct_fields__, "command", "recipe", "verbose", "config"}
    toy_flags = set(vars(args)) - not_toy
    recorded = set(toy.toy_recipe_options(args)) - {"recipe"}
    assert recorded | toy.TOY_RESUME_MAY_CHANGE == toy_flags
    assert not recorded & toy.TOY_RESUME_MAY_CHANGE
    assert toy.toy_recipe_options(args)["recipe"] == "toy"


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["kill", "term"])
def test_a_killed_cli_run_resumes_with_an_intact_metrics_file(
    stop: signal.Signals, tmp_path: Path
) -> None:
    """SIGKILL (or SIGTERM: one line, exit 143) a real `rlpure train` process after its first
    checkpoint, then restart it."""
    log_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "shell.cli", "train", "toy", "--backend", "fake",
            "--log-dir", str(log_dir), "--num-batches", "6", "--save-every", "2",
            "--eval-every", "0", "--no-progress"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    stderr = (tmp_path / "stderr").open("w")
    proc = subprocess.Popen(
        [*argv, "--env-latency", "0.4"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
    )
    try:
        deadline = time.monotonic() + 120

        def logged_after_checkpoint() -> bool:
            steps = [r["step"] for r in read_jsonl(log_dir / "metrics.jsonl")]
            return bool(load_checkpoints(log_dir)) and max(steps, default=-1) >= 2

        while not logged_after_checkpoint():
            assert proc.poll() is None, "the run ended before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint and step 2 within 120 s"
            time.sleep(0.05)
    finally:
        proc.send_signal(stop)
        proc.wait(60)
        stderr.close()
    if stop == signal.SIGTERM:  # stopped as Ctrl-C stops it, said in one line
        assert proc.returncode == 143
        lines = (tmp_path / "stderr").read_text().splitlines()
        assert lines[-1] == "rlpure: terminated" and "Traceback" not in "\n".join(lines)
    else:
        assert proc.returncode == -signal.SIGKILL
    first = load_checkpoints(log_dir)
    assert [r.step for r in first] == [2] and not first[0].final
    before = (log_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in before][:3] == [0, 1, 2]  # 2: after the save

    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resuming at step 2" in done.stderr
    after = (log_dir / "metrics.jsonl").read_text().splitlines()
    assert after[:2] == before[:2]
    assert _logged(log_dir) == [0, 1, 2, 3, 4, 5, "totals@6"]
    assert [r.step for r in load_checkpoints(log_dir)] == [2, 4, 6]


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"rollout_strategy": "retry", "min_viable_group": 3}, "min_viable_group"),
    ],
)
def test_options_the_chosen_strategy_would_ignore_are_refused(options, field):
    from shell.config import build_config
    from shell.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"TrainConfig\.{field}: only applies to"):
        build_config(options)


def test_gsm8k_help_shows_the_real_defaults_per_backend(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = " ".join(_help(["train", "gsm8k", "--help"], capsys).split())
    assert "(default: 256; 16 on --backend local)" in text
    assert "(default: 'Qwen/Qwen3.5-9B-Base'; 'rlpure/tiny' on --backend local)" in text
    train_text = " ".join(_help(["train", "--help"], capsys).split())
    smollm2_max_tokens = SMOLLM2_CONFIG_DEFAULTS["max_tokens"]  # the recipe's own default
    assert (
        f"(default: 256; gsm8k --backend local: 16; smollm2-addition: {smollm2_max_tokens}; toy: 4)"
    ) in train_text


def test_recipe_options_may_go_in_the_config_file_and_flags_win(tmp_path: Path) -> None:
    seen: dict[str, Any] = {}
    config_file = tmp_path / "run.toml"
    config_file.write_text('data_dir = "from-file"\nbatch_size = 3\nfewshot = false\n')
    recipe = gsm8k.RECIPE
    fake = TrainRecipe(
        "g",
        help="g",
        run=lambda config, args: seen.update(vars(args), max_tokens=config.max_tokens),
        add_arguments=recipe.add_arguments,
        defaults=recipe.defaults,
        backend_defaults=recipe.backend_defaults,
    )
    argv = ["train", "g", "--backend", "local", "--log-dir", str(tmp_path / "r"),
            "--config", str(config_file), "--batch-size", "5"]  # fmt: skip
    assert cli.main(argv, recipes={"g": fake}) == 0
    assert seen["data_dir"] == "from-file" and seen["fewshot"] is False
    assert seen["batch_size"] == 5 and seen["max_tokens"] == 16
    config_file.write_text('batch_size = "many"\n')
    assert cli.main(argv, recipes={"g": fake}) == 2


def test_a_finished_run_rerun_says_nothing_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["train", "toy", "--backend", "fake", "--log-dir", str(tmp_path / "t"),
            "--max-steps", "2", "--no-progress"]  # fmt: skip
    assert cli.main(argv) == 0
    first = capsys.readouterr().out.strip().splitlines()[-1]
    assert first.startswith("Trained steps 0..1 (2 steps, 2 in total) in ")
    assert "final eval: " in first and "checkpoint: " in first
    assert cli.main(argv) == 0
    again = capsys.readouterr().out.strip().splitlines()[-1]
    assert again.startswith(f"Nothing to do: {tmp_path / 't'} already trained 2 steps")


_SLOW_EXIT = """
import atexit, sys, time
from shell.cli import main
from shell.commands import Command

def wait(args):
    print("ready", flush=True)
    time.sleep(60)

def slow_exit_hook():  # as JAX's exit hooks, or a client closing, can take a while
    print("exiting", flush=True)
    time.sleep(60)

atexit.register(slow_exit_hook)
raise SystemExit(main(["wait"], commands={"wait": Command("wait", "waits", wait)}))
"""


@pytest.mark.parametrize("first", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "term"])
def test_a_second_signal_while_stopping_exits_at_once_in_one_line(first: signal.Signals) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_EXIT],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(first)
        assert proc.stdout.readline().strip() == "exiting"  # stopping: in its exit hook
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert "Traceback" not in stderr, stderr
    stopped = "rlpure: terminated" if first == signal.SIGTERM else "rlpure: interrupted"
    assert stderr.splitlines()[-2:] == [stopped, "rlpure: interrupted again; exiting now"]
