"""Tests of `shell.jobs.gsm8k`: loading the real GSM8K files, schema errors, determinism, envs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from rlpure.model import EOS_ID, ByteTokenizer
from rlpure.render import get_renderer
from rlpure.tasks.math_grading import GSM8K_QUESTION_SUFFIX, gsm8k_ground_truth
from shell.jobs.gsm8k._data import (
    DatasetUnavailableError,
    Gsm8kDataError,
    Gsm8kDataset,
    Gsm8kDatasetBuilder,
    Gsm8kEnv,
    Gsm8kProblem,
    Gsm8kSplits,
    load_gsm8k,
    load_gsm8k_splits,
    problems_from_rows,
    shuffle_problems,
)

GSM8K_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k"
TOKENIZER = ByteTokenizer()
RENDERER = get_renderer("role_colon", TOKENIZER)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hf_cache")


@pytest.fixture(scope="module")
def real_splits(cache_dir: Path) -> dict[str, tuple[Gsm8kProblem, ...]]:
    if not (GSM8K_DIR / "train.jsonl").is_file():
        pytest.skip(f"GSM8K data folder {GSM8K_DIR} is absent (expected ../shared/data/gsm8k/)")
    return {
        split: load_gsm8k(split, data_dir=GSM8K_DIR, cache_dir=cache_dir)  # type: ignore[arg-type]
        for split in ("train", "test")
    }


def _write_jsonl(path: Path, rows: Sequence[object]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


GOOD = {"question": "What is 1+1?", "answer": "1+1=2\n#### 2"}


# --- loading -----------------------------------------------------------------------------------


def test_real_splits_load_in_file_order(real_splits: dict[str, tuple[Gsm8kProblem, ...]]) -> None:
    for split, rows in (("train", 7473), ("test", 1319)):
        problems = real_splits[split]
        assert len(problems) == rows
        with (GSM8K_DIR / f"{split}.jsonl").open(encoding="utf-8") as f:
            raw = [json.loads(line) for line in f]
        for i, (problem, row) in enumerate(zip(problems, raw, strict=True)):
            assert problem.row == i
            assert problem.source == str(GSM8K_DIR / f"{split}.jsonl")
            assert problem.question == row["question"]
            assert problem.answer == row["answer"]
            assert problem.ground_truth == gsm8k_ground_truth(row["answer"])


def test_shuffle_is_deterministic_by_seed(
    real_splits: dict[str, tuple[Gsm8kProblem, ...]], cache_dir: Path
) -> None:
    train = real_splits["train"]
    first = shuffle_problems(train, seed=0)
    assert first == shuffle_problems(train, seed=0)
    assert first != shuffle_problems(train, seed=1)
    assert first != train
    assert sorted(p.row for p in first) == list(range(len(train)))  # a permutation
    # Golden: pin the order so a changed RNG stream is noticed.
    assert [p.row for p in first[:5]] == [
        int(i) for i in np.random.default_rng(0).permutation(len(train))[:5]
    ]
    test = real_splits["test"]
    assert load_gsm8k("test", data_dir=GSM8K_DIR, seed=3, cache_dir=cache_dir) == (
        shuffle_problems(test, seed=3)
    )


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        ([GOOD, GOOD, {"question": "q", "answer": "no marker"}], r"row 2: .*no '####'"),
        ([GOOD, {"question": "q", "answer": "#### seven"}], r"row 1: final answer 'seven'"),
        ([GOOD, {"question": "  ", "answer": "#### 7"}], r"row 1: empty question"),
        ([GOOD, {"question": "q", "answer": 7}], r"row 1: field 'answer' must be a string"),
        ([GOOD, {"question": "q"}], r"row 1: field 'answer' must be a string, got NoneType"),
        ([{"problem": "q", "solution": "#### 1"}], r"missing column\(s\) \['answer', 'question'\]"),
    ],
)
def test_schema_errors_name_file_and_row(
    tmp_path: Path, cache_dir: Path, rows: list[object], match: str
) -> None:
    path = _write_jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(Gsm8kDataError, match=match) as info:
        load_gsm8k("train", data_dir=tmp_path, cache_dir=cache_dir)
    assert str(path) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_invalid_jsonl_is_a_data_error(tmp_path: Path, cache_dir: Path) -> None:
    (tmp_path / "test.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n{oops\n')
    with pytest.raises(Gsm8kDataError, match=r"test.jsonl: not a valid JSONL file"):
        load_gsm8k("test", data_dir=tmp_path, cache_dir=cache_dir)


def test_missing_file_and_unknown_split(tmp_path: Path) -> None:
    with pytest.raises(DatasetUnavailableError, match=r"no test file at .*test.jsonl"):
        load_gsm8k("test", data_dir=tmp_path)
    with pytest.raises(ValueError, match="split must be one of"):
        load_gsm8k("validation", data_dir=tmp_path)  # type: ignore[arg-type]


def test_hub_unreachable_suggests_data_dir(
    monkeypatch: pytest.MonkeyPatch, cache_dir: Path
) -> None:
    """The real hub call, in `datasets`' offline mode so it fails at once instead of retrying
    DNS for ~25 s (this machine has no hub access either way)."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(DatasetUnavailableError, match=r"openai/gsm8k.*--data-dir") as info:
        load_gsm8k("train", cache_dir=cache_dir)
    assert isinstance(info.value, OSError)


def test_problems_from_rows_refuses_non_objects() -> None:
    with pytest.raises(Gsm8kDataError, match=r"GSM8K src row 1: expected an object"):
        problems_from_rows([GOOD, ["q", "a"]], source="src")  # type: ignore[list-item]
    (problem,) = problems_from_rows([{**GOOD, "answer": "#### 1,234"}], source="src")
    assert problem.ground_truth == "1234"


# --- environments --------------------------------------------------------------------------------

PROBLEM = Gsm8kProblem(
    question="Natalia sold 48 clips in April and half as many in May. How many in total?",
    answer="48/2 = 24\n48+24 = 72\n#### 72",
    ground_truth="72",
    source="inline",
    row=0,
)


def _step(env: Gsm8kEnv, text: str, *, eos: bool = False) -> tuple[float, dict]:
    tokens = [*TOKENIZER.encode(text, add_special_tokens=False)] + [EOS_ID] * eos
    result = asyncio.run(env.step(tokens))  # actions reach Env.step as list[int]
    assert result.episode_done
    return result.reward, result.metrics


def test_env_prompt_is_the_tutorials() -> None:
    env = Gsm8kEnv(PROBLEM, RENDERER)
    prompt, stop = asyncio.run(env.initial_observation())
    assert stop == ("\n\nUser:",)
    text = TOKENIZER.decode(prompt.to_ints())
    assert text.startswith("<|bos|>User: How many r's are in strawberry?" + GSM8K_QUESTION_SUFFIX)
    assert text.endswith(f"\n\nUser: {PROBLEM.question}{GSM8K_QUESTION_SUFFIX}\n\nAssistant:")
    assert text.count("User:") == 2
    bare, _ = asyncio.run(Gsm8kEnv(PROBLEM, RENDERER, convo_prefix=()).initial_observation())
    assert TOKENIZER.decode(bare.to_ints()) == (
        f"<|bos|>User: {PROBLEM.question}{GSM8K_QUESTION_SUFFIX}\n\nAssistant:"
    )


@pytest.mark.parametrize(
    ("text", "eos", "reward", "fmt", "correct"),
    [
        (" 48 + 24 = \\boxed{72}\n\nUser:", False, 1.0, 1.0, 1.0),
        (" so \\boxed{72.00} dollars\n\nUser:", False, 1.0, 1.0, 1.0),
        (" \\boxed{71}\n\nUser:", False, 0.0, 1.0, 0.0),
        (" 72\n\nUser:", False, -0.1, 0.0, 0.0),  # no box: format fails
        (" \\boxed{72}", True, 0.9, 0.0, 1.0),  # EOS, not the stop sequence (strict format)
        (" \\boxed{72", False, -0.1, 0.0, 0.0),  # truncated
    ],
)
def test_env_rewards(text: str, eos: bool, reward: float, fmt: float, correct: float) -> None:
    got, metrics = _step(Gsm8kEnv(PROBLEM, RENDERER), text, eos=eos)
    assert got == pytest.approx(reward)
    assert metrics == {"format": fmt, "correct": correct}


# --- datasets ----------------------------------------------------------------------------------


def _problems(n: int) -> tuple[Gsm8kProblem, ...]:
    rows = [{"question": f"q{i}?", "answer": f"#### {i}"} for i in range(n)]
    return problems_from_rows(rows, source="inline")


async def _batch_questions(dataset: Gsm8kDataset, index: int) -> list[list[str]]:
    groups = []
    for builder in dataset.get_batch(index):
        envs = await builder.make_envs()
        groups.append([env.problem.question for env in envs])  # type: ignore[attr-defined]
    return groups


def test_dataset_batches_are_same_problem_groups() -> None:
    dataset = Gsm8kDataset(_problems(10), batch_size=4, group_size=3, renderer=RENDERER)
    assert len(dataset) == 3
    batches = [asyncio.run(_batch_questions(dataset, i)) for i in range(3)]
    assert batches[0] == [[f"q{i}?"] * 3 for i in range(4)]
    assert batches[2] == [["q8?"] * 3, ["q9?"] * 3]  # the last batch is short
    assert dataset.get_batch(0)[0].logging_tags() == ["gsm8k"]
    with pytest.raises(IndexError, match=r"index 3 not in \[0, 3\)"):
        dataset.get_batch(3)
    with pytest.raises(ValueError, match=r"Gsm8kDataset\.group_size"):
        Gsm8kDataset(_problems(2), batch_size=1, group_size=0, renderer=RENDERER)


def test_builder_on_the_real_files(cache_dir: Path) -> None:
    if not (GSM8K_DIR / "train.jsonl").is_file():
        pytest.skip(f"GSM8K data folder {GSM8K_DIR} is absent")

    def build(seed: int) -> tuple[Gsm8kDataset, Gsm8kDataset | None]:
        builder = Gsm8kDatasetBuilder(
            batch_size=16,
            group_size=8,
            renderer=RENDERER,
            data_dir=GSM8K_DIR,
            seed=seed,
            max_test_problems=50,
            cache_dir=cache_dir,
        )
        return asyncio.run(builder())

    train, test = build(0)
    again, _ = build(0)
    other, _ = build(1)
    assert len(train) == 468  # ceil(7473 / 16)
    assert train.batch_problems(0) == again.batch_problems(0)
    assert train.batch_problems(0) != other.batch_problems(0)
    groups = asyncio.run(_batch_questions(train, 0))
    assert len(groups) == 16 and all(len(g) == 8 and len(set(g)) == 1 for g in groups)
    assert test is not None
    assert [p.row for p in test.problems] == list(range(50))  # file order, not shuffled
    assert len(test) == 4  # ceil(50 / 16)
    assert all(len(g) == 1 for g in asyncio.run(_batch_questions(test, 0)))


def test_load_splits_and_preloaded_builder(tmp_path: Path, cache_dir: Path) -> None:
    rows = [{"question": f"q{i}?", "answer": f"#### {i}"} for i in range(6)]
    _write_jsonl(tmp_path / "train.jsonl", rows)
    _write_jsonl(tmp_path / "test.jsonl", rows[:3])
    splits = load_gsm8k_splits(data_dir=tmp_path, seed=5, max_test_problems=2, cache_dir=cache_dir)
    assert [p.row for p in splits.train] == [
        int(i) for i in np.random.default_rng(5).permutation(6)
    ]
    assert [p.row for p in splits.test] == [0, 1]  # file order, first N
    none = load_gsm8k_splits(data_dir=tmp_path, max_test_problems=0, cache_dir=cache_dir)
    assert none.test == () and len(none.train) == 6
    with pytest.raises(ValueError, match="max_test_problems must be >= 0"):
        load_gsm8k_splits(data_dir=tmp_path, max_test_problems=-1)

    # `preloaded` problems are used as given: no file is read (data_dir points nowhere).
    builder = Gsm8kDatasetBuilder(
        batch_size=4,
        group_size=2,
        renderer=RENDERER,
        data_dir=tmp_path / "nowhere",
        preloaded=Gsm8kSplits(train=splits.train, test=()),
    )
    train, test = asyncio.run(builder())
    assert test is None and train.problems == splits.train and len(train) == 2


@pytest.mark.parametrize("content", ["", "\n  \n"])
@pytest.mark.parametrize("empty_split", ["train", "test"])
def test_an_empty_split_file_is_a_data_error_not_a_hang(
    tmp_path: Path, cache_dir: Path, content: str, empty_split: str
) -> None:
    # `datasets` raised a bare StopIteration on an empty file; through `asyncio.to_thread` that
    # hung the awaiting task forever, so this test bounds the await.
    rows = [{"question": f"q{i}?", "answer": f"#### {i}"} for i in range(3)]
    for split in ("train", "test"):
        _write_jsonl(tmp_path / f"{split}.jsonl", rows)
    empty = tmp_path / f"{empty_split}.jsonl"
    empty.write_text(content)
    builder = Gsm8kDatasetBuilder(
        batch_size=2, group_size=2, renderer=RENDERER, data_dir=tmp_path, cache_dir=cache_dir
    )

    async def build() -> object:
        return await asyncio.wait_for(builder(), timeout=60)

    with pytest.raises(Gsm8kDataError, match="has no rows") as info:
        asyncio.run(build())
    assert str(empty) in str(info.value)


def test_a_stop_iteration_in_the_loader_thread_cannot_hang_the_await(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from shell.jobs.gsm8k import _data

    def raise_stop(*args: object, **kwargs: object) -> None:
        raise StopIteration

    monkeypatch.setattr(_data, "load_gsm8k", raise_stop)

    async def load() -> object:
        return await asyncio.wait_for(
            asyncio.to_thread(
                _data.without_stop_iteration(_data.load_gsm8k_splits), data_dir=tmp_path
            ),
            timeout=30,
        )

    with pytest.raises(RuntimeError, match="unexpected StopIteration"):
        asyncio.run(load())
