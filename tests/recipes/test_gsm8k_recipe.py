"""Tests of `shell.jobs.gsm8k`: defaults per backend, the Tinker path against scripted SDK
fakes down to the `forward_backward` / `optim_step` calls, and the offline end-to-end run."""

from __future__ import annotations

import asyncio
import doctest
import json
import math
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
import tinker
from tinker.lib.retry_handler import RetryConfig

from rlpure.model import BOS_ID, ByteTokenizer
from rlpure.tasks.math_grading import GSM8K_QUESTION_SUFFIX, gsm8k_ground_truth
from shell import cli
from shell.config import TrainConfig
from shell.errors import ConfigError
from shell.fakes import (
    FakeCheckpointStore,
    FakeFuture,
    FakeSamplingClient,
    FakeServiceClient,
    FakeTrainingClient,
)
from shell.jobs import TRAIN_RECIPES
from shell.jobs.gsm8k import DatasetUnavailableError
from shell.jobs.gsm8k import _recipe as recipe
from shell.jobs.gsm8k._recipe import (
    GSM8K_TINKER_MODEL,
    Gsm8kOptions,
    default_gsm8k_options,
    gsm8k_config,
    run_gsm8k,
)
from shell.training import read_jsonl

GSM8K_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k"
TOKENIZER = ByteTokenizer()


def _logged(log_dir: Path) -> list[int | str]:
    """The steps of `log_dir/metrics.jsonl`'s rows; the final evaluation's as `eval@N`, the
    final totals row (the cookbook's `cumulative_metrics()` row after the last step) as
    `totals@N`."""
    return [
        f"eval@{r['step']}"
        if "final_eval" in r
        else f"totals@{r['step']}"
        if "final_totals" in r
        else r["step"]
        for r in read_jsonl(log_dir / "metrics.jsonl")
    ]


def gsm8k_main(argv: list[str]) -> int:
    """`rlpure train gsm8k ARGV...`; the exit code."""
    return cli.main(["train", "gsm8k", *argv])


STOP = "\n\nUser:"
FAKE_KEY = "tk-test-not-a-real-key-1234"

needs_data = pytest.mark.skipif(
    not (GSM8K_DIR / "train.jsonl").is_file(),
    reason=f"GSM8K data folder {GSM8K_DIR} is absent (expected ../shared/data/gsm8k/)",
)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hf_cache")


@pytest.fixture(scope="module")
def truths() -> dict[str, str]:
    """question → ground truth, over both real splits."""
    out = {}
    for split in ("train", "test"):
        with (GSM8K_DIR / f"{split}.jsonl").open(encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                out[row["question"]] = gsm8k_ground_truth(row["answer"])
    return out


# --- defaults and option precedence --------------------------------------------------------------


def test_docstring_examples_run() -> None:
    result = doctest.testmod(recipe)
    assert result.attempted >= 4 and result.failed == 0


def test_tinker_defaults_are_the_tutorials() -> None:
    config = gsm8k_config("tinker")
    assert (config.backend, config.base_model, config.lora_rank) == (
        "tinker",
        GSM8K_TINKER_MODEL,
        32,
    )
    assert (config.learning_rate, config.adam_beta1, config.adam_beta2) == (4e-5, 0.9, 0.95)
    assert (config.loss_fn, config.max_tokens) == ("importance_sampling", 256)
    assert config.remove_constant_reward_groups  # the tutorial skips degenerate groups
    assert (config.eval_every, config.advantage_estimator) == (20, "group_centered")
    options = default_gsm8k_options("tinker")
    assert (options.batch_size, options.group_size, options.max_test_problems) == (16, 8, None)
    local = gsm8k_config("local", explicit={"max_steps": 2})
    assert (local.base_model, local.max_tokens, local.max_steps) == ("rlpure/tiny", 16, 2)
    assert local.learning_rate == 4e-5 and local.loss_fn == "importance_sampling"
    local_options = default_gsm8k_options("local")
    assert (local_options.batch_size, local_options.group_size) == (4, 4)
    assert local_options.max_test_problems == 4
    with pytest.raises(ConfigError, match="--group-size: must be >= 1"):
        Gsm8kOptions(group_size=0)


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[tuple[TrainConfig, Gsm8kOptions]]:
    """Replaces `run_gsm8k` so the CLI's resolved config and options can be inspected."""
    calls: list[tuple[TrainConfig, Gsm8kOptions]] = []

    async def fake_run(config: TrainConfig, *, options: Gsm8kOptions, **_: Any) -> int:
        calls.append((config, options))
        return 0

    monkeypatch.setattr(recipe, "run_gsm8k", fake_run)
    return calls


@pytest.mark.parametrize(
    ("argv", "config_fields", "option_fields"),
    [
        (
            ["--backend", "local"],
            {"base_model": "rlpure/tiny", "max_tokens": 16, "lora_rank": 32},
            {"batch_size": 4, "group_size": 4, "max_test_problems": 4, "data_dir": None},
        ),
        (
            ["--backend", "local", "--max-tokens", "64", "--base-model", "rlpure/small"],
            {"base_model": "rlpure/small", "max_tokens": 64},
            {"batch_size": 4},
        ),
        (
            ["--backend", "local", "--batch-size", "2", "--max-test-problems", "0"],
            {"max_tokens": 16},
            {"batch_size": 2, "group_size": 4, "max_test_problems": 0},
        ),
        (
            ["--backend", "tinker", "--data-dir", "d", "--no-fewshot", "--seed", "3"],
            {"base_model": GSM8K_TINKER_MODEL, "max_tokens": 256, "seed": 3},
            {"batch_size": 16, "group_size": 8, "max_test_problems": None, "data_dir": "d"},
        ),
        (
            [],  # the recipe's default backend is Tinker
            {"backend": "tinker", "base_model": GSM8K_TINKER_MODEL, "log_dir": "runs/gsm8k"},
            {"fewshot": True, "format_coef": 0.1},
        ),
    ],
)
def test_cli_resolves_defaults_per_backend(
    captured: list[tuple[TrainConfig, Gsm8kOptions]],
    argv: list[str],
    config_fields: dict[str, Any],
    option_fields: dict[str, Any],
) -> None:
    assert gsm8k_main(argv) == 0
    ((config, options),) = captured
    assert {k: getattr(config, k) for k in config_fields} == config_fields
    assert {k: getattr(options, k) for k in option_fields} == option_fields
    if "--no-fewshot" in argv:
        assert not options.fewshot


def test_config_file_values_beat_local_defaults(
    captured: list[tuple[TrainConfig, Gsm8kOptions]], tmp_path: Path
) -> None:
    (tmp_path / "run.toml").write_text('max_tokens = 48\nbase_model = "rlpure/small"\n')
    assert gsm8k_main(["--backend", "local", "--config", str(tmp_path / "run.toml")]) == 0
    ((config, _),) = captured
    assert (config.base_model, config.max_tokens) == ("rlpure/small", 48)


def test_bad_recipe_option_is_a_config_error(
    captured: list[tuple[TrainConfig, Gsm8kOptions]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert gsm8k_main(["--backend", "local", "--group-size", "0"]) == 2
    assert "--group-size: must be >= 1" in capsys.readouterr().err
    assert not captured


def test_registered_with_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert TRAIN_RECIPES["gsm8k"] is recipe.RECIPE
    assert recipe.RECIPE.run is recipe.run_gsm8k_recipe
    with pytest.raises(SystemExit) as info:
        cli.main(["train", "gsm8k", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for flag in (
        "--data-dir",
        "--batch-size",
        "--group-size",
        "--max-test-problems",
        "--max-steps",
    ):
        assert flag in out


def test_missing_key_fails_before_reading_data(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TINKER_API_KEY", raising=False)

    def no_data(**_: Any) -> None:
        raise AssertionError("data was read before the key check")

    monkeypatch.setattr(recipe, "load_gsm8k_splits", no_data)
    assert gsm8k_main(["--data-dir", str(GSM8K_DIR), "--max-steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "TINKER_API_KEY" in err and "--backend local" in err


def test_bad_data_dir_fails_before_opening_a_training_client(tmp_path: Path) -> None:
    service = FakeServiceClient()
    config = gsm8k_config("fake", explicit={"log_dir": str(tmp_path / "run")})
    options = default_gsm8k_options("fake", data_dir=str(tmp_path / "nowhere"))
    with pytest.raises(DatasetUnavailableError, match=r"no train file at .*nowhere"):
        asyncio.run(run_gsm8k(config, options=options, service_client=service))
    assert service.events == []


# --- the Tinker path, against scripted SDK fakes -------------------------------------------------


class AnsweringSampler(FakeSamplingClient):
    """A fake Tinker sampler that reads the GSM8K question from the prompt and answers it:
    greedy (temperature 0) always right; sampled, the k-th sample of each question is right for
    even k and wrong (the truth with a "1" appended) for odd k, whatever the call order."""

    def __init__(self, truths: dict[str, str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.truths = truths
        self.seen: dict[str, int] = {}

    def sample(
        self,
        prompt: tinker.ModelInput,
        num_samples: int,
        sampling_params: tinker.SamplingParams,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        topk_sample_logprobs: int = 0,
        target_prompt_logprobs: tinker.TensorData | None = None,
        prompt_alt_tokens_k: int = 0,
        prompt_logprobs_last_n: int | None = None,
    ) -> FakeFuture[tinker.SampleResponse]:
        ids = prompt.to_ints()
        self.sample_calls.append((ids, num_samples, sampling_params))
        text = TOKENIZER.decode(ids)
        question = text.rsplit("User: ", 1)[1].split(GSM8K_QUESTION_SUFFIX)[0]
        truth = self.truths[question]
        k = self.seen[question] = self.seen.get(question, -1) + 1
        right = sampling_params.temperature == 0 or k % 2 == 0
        answer = truth if right else truth + "1"
        tokens = TOKENIZER.encode(
            f" So the answer is \\boxed{{{answer}}}.{STOP}", add_special_tokens=False
        )
        sequences = [
            tinker.SampledSequence(
                stop_reason="stop",
                sequence_id=f"v{self.version}-{question[:8]}-{k}-{i}",
                tokens_np=np.asarray(tokens, np.int32),
                logprobs_np=np.full(len(tokens), -0.5, np.float32),
            )
            for i in range(num_samples)
        ]
        return FakeFuture(
            tinker.SampleResponse(sequences=sequences), events=self.events, label="sample"
        )


class AnsweringTrainer(FakeTrainingClient):
    def __init__(
        self, truths: dict[str, str], samplers: list[AnsweringSampler], **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.truths = truths
        self.samplers = samplers

    def save_weights_and_get_sampling_client(
        self,
        name: str | None = None,
        retry_config: RetryConfig | None = None,
        record_stability_info: bool = False,
        kind: tinker.types.SamplingClientKind = "snapshot",
    ) -> FakeFuture[FakeSamplingClient]:
        self.events.append(("save_weights_and_get_sampling_client", self.optim_steps))
        sampler = AnsweringSampler(self.truths, version=self.optim_steps, events=self.events)
        self.samplers.append(sampler)
        return FakeFuture(sampler, events=self.events, label="sampling_client")


class AnsweringService(FakeServiceClient):
    """`tinker.ServiceClient` stand-in whose training clients sample `AnsweringSampler`s."""

    def __init__(self, truths: dict[str, str], store: FakeCheckpointStore) -> None:
        super().__init__(store=store, vocab_size=259)
        self.truths = truths
        self.samplers: list[AnsweringSampler] = []

    def _training_client(self, base_model: str, rank: int) -> FakeTrainingClient:
        # The one constructor behind both `create_lora_training_client` and
        # `create_training_client_from_state_with_optimizer` (so resumed runs answer too).
        client = AnsweringTrainer(
            self.truths,
            self.samplers,
            base_model=base_model,
            rank=rank,
            store=self.store,
            events=self.events,
            vocab_size=259,
        )
        self.training_clients.append(client)
        return client


@pytest.fixture
def fake_tinker(monkeypatch: pytest.MonkeyPatch, truths: dict[str, str]) -> list[AnsweringService]:
    """`tinker.ServiceClient()` builds an `AnsweringService` (states shared across "processes")."""
    monkeypatch.setenv("TINKER_API_KEY", FAKE_KEY)
    store = FakeCheckpointStore()
    services: list[AnsweringService] = []

    def service_client(*_: Any, **__: Any) -> AnsweringService:
        services.append(AnsweringService(truths, store))
        return services[-1]

    monkeypatch.setattr(tinker, "ServiceClient", service_client)
    return services


@needs_data
def test_tinker_path_calls_the_sdk_as_the_tutorial(
    fake_tinker: list[AnsweringService], tmp_path: Path, cache_dir: Path, truths: dict[str, str]
) -> None:
    log_dir = tmp_path / "run"
    argv = ["--data-dir", str(GSM8K_DIR), "--cache-dir", str(cache_dir), "--log-dir", str(log_dir)]
    assert gsm8k_main([*argv, "--max-steps", "1", "--max-test-problems", "3", "--no-progress"]) == 0
    (service,) = fake_tinker
    events = service.events
    # One training session, with the tutorial's model and rank.
    creates = [e for e in events if e[0].startswith("create_")]
    assert creates == [("create_lora_training_client", GSM8K_TINKER_MODEL, 32)]
    # Exactly one forward_backward then one optim_step, both submitted before either is awaited.
    calls = [e for e in events if e[0] in ("forward_backward", "optim_step")]
    assert calls == [
        ("forward_backward", 128, "importance_sampling", None),  # 16 problems x 8 samples
        (
            "optim_step",
            tinker.AdamParams(
                learning_rate=4e-5,
                beta1=0.9,
                beta2=0.95,
                eps=1e-8,
                weight_decay=0.0,
                grad_clip_norm=0.0,
            ),
        ),
    ]
    fb = events.index(calls[0])
    assert events[fb + 1][0] == "optim_step"
    assert events[fb + 2 : fb + 4] == [("await", "forward_backward#1"), ("await", "optim_step#2")]

    # The datums (already checked by the fake against the SDK's own validation and wire format).
    (trainer,) = service.training_clients
    (datums,) = trainer.sent_data
    for datum in datums:
        assert set(datum.loss_fn_inputs) == {"target_tokens", "logprobs", "advantages"}
        inputs = datum.model_input.to_ints()
        targets = datum.loss_fn_inputs["target_tokens"].to_numpy()
        advantages = datum.loss_fn_inputs["advantages"].to_numpy()
        logprobs = datum.loss_fn_inputs["logprobs"].to_numpy()
        assert inputs[0] == BOS_ID and targets.shape == advantages.shape == (len(inputs),)
        text = TOKENIZER.decode([*inputs, int(targets[-1])])
        prompt, response = text.rsplit("\n\nAssistant:", 1)
        n_action = len(TOKENIZER.encode(response, add_special_tokens=False))
        assert response.endswith(STOP) and "\\boxed{" in response
        # position i predicts token i + 1: the last n_action targets are the response
        np.testing.assert_array_equal(advantages[:-n_action], 0.0)
        np.testing.assert_array_equal(logprobs[:-n_action], 0.0)
        np.testing.assert_array_equal(logprobs[-n_action:], -0.5)
        assert set(np.unique(advantages[-n_action:]).tolist()) <= {-0.5, 0.5}
        truth = truths[prompt.rsplit("User: ", 1)[1].removesuffix(GSM8K_QUESTION_SUFFIX)]
        sign = 1.0 if f"\\boxed{{{truth}}}" in response else -1.0
        np.testing.assert_array_equal(advantages[-n_action:], 0.5 * sign)

    # Sampling: max_tokens 256, the role_colon stop sequence, T=1 for training, greedy eval.
    params = [p for sampler in service.samplers for _, _, p in sampler.sample_calls]
    assert len(params) == 3 + 128 + 3  # eval before step 0, the step, the final eval
    assert {(p.max_tokens, tuple(p.stop or ())) for p in params} == {(256, (STOP,))}
    assert sorted({p.temperature for p in params}) == [0.0, 1.0]

    # Metrics: half the training samples right, greedy evaluation all right (3 + 3 problems).
    assert _logged(log_dir) == [0, "eval@1", "totals@1"]
    step0, final, _ = read_jsonl(log_dir / "metrics.jsonl")
    assert step0["env/all/correct"] == pytest.approx(0.5)
    assert step0["batch/num_datums"] == 128 and step0["batch/degenerate_groups_frac"] == 0.0
    assert step0["test/env/all/correct"] == 1.0 and step0["test/num_groups"] == 3.0
    assert final["final_eval"] == 1 and final["test/env/all/reward/total"] == 1.0
    assert (log_dir / "reward_curve.png").stat().st_size > 0
    config = json.loads((log_dir / "config.json").read_text())
    assert (config["base_model"], config["backend"], config["max_tokens"]) == (
        GSM8K_TINKER_MODEL,
        "tinker",
        256,
    )
    for path in log_dir.rglob("*"):
        if path.is_file():
            assert FAKE_KEY.encode() not in path.read_bytes(), f"API key leaked into {path}"

    # Re-running with the same log dir resumes from the final checkpoint in one session.
    assert gsm8k_main([*argv, "--max-steps", "2", "--max-test-problems", "0", "--no-progress"]) == 0
    resumed = fake_tinker[1]
    creates = [e for e in resumed.events if e[0].startswith("create_")]
    assert [e[0] for e in creates] == ["create_training_client_from_state_with_optimizer"]
    assert [e[1] for e in resumed.events if e[0] == "forward_backward"] == [128]
    assert _logged(log_dir) == [0, 1, "totals@2"]  # the first call's eval@1, totals@1 dropped


# --- resuming: one training session, and the recipe's options checked ---------------------------


def write_tiny_gsm8k(folder: Path, *, num_train: int = 8, num_test: int = 2) -> Path:
    """A GSM8K-schema data folder of `k + k` questions (no hub, no shared data needed)."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", num_train), ("test", num_test)):
        rows = [
            {"question": f"What is {k} + {k}?", "answer": f"{k} + {k} = {2 * k}\n#### {2 * k}"}
            for k in range(count)
        ]
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _tiny_run(log_dir: Path, max_steps: int) -> TrainConfig:
    return gsm8k_config(
        "fake",
        explicit={
            "log_dir": str(log_dir),
            "max_steps": max_steps,
            "max_tokens": 4,
            "eval_every": 0,
            "progress": False,
        },
    )


def test_recipe_records_its_options_and_resumes_in_one_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_tiny_gsm8k(tmp_path / "data")
    log_dir = tmp_path / "run"
    store = FakeCheckpointStore()
    options = default_gsm8k_options(
        "fake",
        data_dir=str(data),
        batch_size=2,
        group_size=2,
        max_test_problems=1,
        cache_dir=str(tmp_path / "cache"),
    )
    first = FakeServiceClient(store=store)
    asyncio.run(run_gsm8k(_tiny_run(log_dir, 1), options=options, service_client=first))
    assert json.loads((log_dir / "recipe_options.json").read_text()) == {
        "recipe": "gsm8k",
        "data_dir": str(data.resolve()),
        "batch_size": 2,
        "group_size": 2,
        "fewshot": True,
        "format_coef": 0.1,
    }
    assert [e[0] for e in first.events if "training_client" in e[0]] == [
        "create_lora_training_client"
    ]

    # Same recipe options (data_dir now relative, from another directory); the evaluation size
    # and the cache folder may change.
    monkeypatch.chdir(tmp_path)
    same = msgspec.structs.replace(
        options, data_dir="data", max_test_problems=0, cache_dir=str(tmp_path / "cache2")
    )
    service = FakeServiceClient(store=store)
    result = asyncio.run(run_gsm8k(_tiny_run(log_dir, 2), options=same, service_client=service))
    assert (result.start_step, result.end_step) == (1, 2)
    creates = [e[0] for e in service.events if "training_client" in e[0]]
    assert creates == ["create_training_client_from_state_with_optimizer"]
    assert len(service.training_clients) == 1  # the recipe's client is the one the loop used
    assert _logged(log_dir) == [0, 1, "totals@2"]


@pytest.mark.parametrize(
    ("option", "value", "shown"),
    [
        ("batch_size", 4, "2 -> 4"),
        ("group_size", 3, "2 -> 3"),
        ("fewshot", False, "True -> False"),
        ("format_coef", 0.5, "0.1 -> 0.5"),
        ("data_dir", "other", r"'.*data' -> '.*other'"),
    ],
)
def test_resuming_with_a_changed_recipe_option_is_refused_before_any_session(
    tmp_path: Path, option: str, value: Any, shown: str
) -> None:
    data = write_tiny_gsm8k(tmp_path / "data")
    write_tiny_gsm8k(tmp_path / "other")
    log_dir = tmp_path / "run"
    store = FakeCheckpointStore()
    options = default_gsm8k_options(
        "fake", data_dir=str(data), batch_size=2, group_size=2, cache_dir=str(tmp_path / "cache")
    )
    service = FakeServiceClient(store=store)
    asyncio.run(run_gsm8k(_tiny_run(log_dir, 1), options=options, service_client=service))
    metrics = (log_dir / "metrics.jsonl").read_bytes()

    if option == "data_dir":
        value = str(tmp_path / value)
    changed = msgspec.structs.replace(options, **{option: value})
    service = FakeServiceClient(store=store)
    with pytest.raises(ConfigError, match=rf"{log_dir}: .*recipe option {option}: {shown}"):
        asyncio.run(run_gsm8k(_tiny_run(log_dir, 2), options=changed, service_client=service))
    assert service.events == []  # refused before a training session is opened
    assert (log_dir / "metrics.jsonl").read_bytes() == metrics
    assert json.loads((log_dir / "recipe_options.json").read_text())[option] != value


# --- offline, end to end -------------------------------------------------------------------------


@needs_data
@pytest.mark.slow
def test_offline_run_end_to_end(tmp_path: Path, cache_dir: Path) -> None:
    """`rlpure train gsm8k --backend local --data-dir ../shared/data/gsm8k --max-steps 2`."""
    log_dir = tmp_path / "run"
    code = gsm8k_main(
        [
            "--backend",
            "local",
            "--data-dir",
            str(GSM8K_DIR),
            "--max-steps",
            "2",
            "--log-dir",
            str(log_dir),
            "--cache-dir",
            str(cache_dir),
        ]
    )
    assert code == 0
    assert _logged(log_dir) == [0, 1, "eval@2", "totals@2"]
    for name in ("logs.log", "timing_spans.jsonl", "iteration_000000/train.html",
                 "iteration_000000/eval_test.html", "iteration_000001/train.html"):  # fmt: skip
        assert (log_dir / name).is_file(), name
    step0, step1, final, _ = read_jsonl(log_dir / "metrics.jsonl")
    for record in (step0, step1):
        assert record["batch/num_groups"] == 4
        assert -0.1 <= record["env/all/reward/total"] <= 1.0
        # The untrained tiny model rarely produces a gradeable answer: a step where every
        # group is constant is not trained (the recipe drops constant groups, as Tutorial 104).
        if record.get("progress/no_signal"):
            assert record["batch/degenerate_groups_frac"] == 1.0
            assert "train/loss:sum" not in record
        else:
            assert math.isfinite(record["train/loss:sum"])
    assert step0["test/num_groups"] == 4.0 and "test/num_groups" not in step1
    assert final["final_eval"] == 1 and final["test/num_groups"] == 4.0
    config = json.loads((log_dir / "config.json").read_text())
    assert (config["backend"], config["base_model"], config["max_tokens"]) == (
        "local",
        "rlpure/tiny",
        16,
    )
    samples = read_jsonl(log_dir / "samples.jsonl")
    assert samples and samples[0]["turns"][0]["ob"].endswith(
        GSM8K_QUESTION_SUFFIX + "\n\nAssistant:"
    )
    assert (log_dir / "reward_curve.png").stat().st_size > 0
    assert [r["step"] for r in read_jsonl(log_dir / "checkpoints.jsonl")] == [2]
