"""The GSM8K recipe's data and environments (Tinker tutorial 104, "first RL").

Conventions:
- Data comes from local JSONL files (`data_dir/{split}.jsonl`, rows `{"question", "answer"}`,
  the answer ending in `#### <number>`) read with `datasets.load_dataset("json", ...)`, or,
  without `data_dir`, from the hub (`datasets.load_dataset("openai/gsm8k", "main")`), which
  needs network access. Every row is validated on load; an error names the file and the row
  (0-based; in a JSONL file row `i` is line `i + 1`).
- Problems are `Gsm8kProblem` records, in file order unless a `seed` is given, in which case
  they are permuted by `numpy.random.default_rng(seed)` (PCG64: the same order on every
  machine and numpy version that keeps PCG64's stream, which numpy guarantees).
- `load_gsm8k_splits` reads a run's problems (train shuffled by seed, test in file order, the
  first N only if asked) into a `Gsm8kSplits`; `Gsm8kDatasetBuilder(preloaded=...)` builds the
  datasets from them, so a caller can validate the data before it has a renderer.
- Batch `i` of a dataset is problems `[i * batch_size, (i + 1) * batch_size)` (the last batch
  may be short); each problem becomes one `ProblemGroupBuilder` of `group_size` envs that all
  see the SAME problem. The test split is never shuffled and uses `test_group_size` (1).
- Grading and the prompt text are pure and live in `rlpure.tasks.math_grading`: the question gets the
  tutorial's suffix, the conversation the strawberry few-shot prefix, the reward is
  `format_coef * (format - 1) + correct` (`shell.env.ProblemEnv`), where `format` is
  "ended on the stop sequence and has a boxed answer (a closed `\\boxed{}`, or the cookbook's
  unbraced `\\boxed 7`)" and `correct` is exact numeric
  equality of the last box with the ground truth.
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal, TypeVar

import msgspec
import numpy as np

from rlpure.render import Renderer
from rlpure.tasks.math_grading import (
    grade_boxed_response,
    gsm8k_fewshot_prefix,
    gsm8k_ground_truth,
    gsm8k_question,
    has_boxed_answer,
    normalize_numeric_answer,
)
from shell.env import (
    EnvGroupBuilder,
    ProblemEnv,
    ProblemGroupBuilder,
    RLDataset,
    RLDatasetBuilder,
)
from shell.errors import RlpureError

__all__ = [
    "GSM8K_HUB_CONFIG",
    "GSM8K_HUB_PATH",
    "DatasetUnavailableError",
    "Gsm8kDataError",
    "Gsm8kDataset",
    "Gsm8kDatasetBuilder",
    "Gsm8kEnv",
    "Gsm8kProblem",
    "Gsm8kSplits",
    "load_gsm8k",
    "load_gsm8k_splits",
    "problems_from_rows",
    "shuffle_problems",
    "without_stop_iteration",
]

GSM8K_HUB_PATH = "openai/gsm8k"
GSM8K_HUB_CONFIG = "main"
Split = Literal["train", "test"]
_SPLITS: tuple[str, ...] = ("train", "test")


class Gsm8kDataError(RlpureError, ValueError):
    """A GSM8K file or row does not have the expected schema; the message names file and row."""


class DatasetUnavailableError(RlpureError, OSError):
    """The dataset cannot be read: a missing local file, or the hub is unreachable."""


class Gsm8kProblem(msgspec.Struct, frozen=True, kw_only=True):
    """One GSM8K problem.

    Attributes:
        question: the question text, as in the data.
        answer: the worked solution, ending in `#### <number>`.
        ground_truth: the final answer (`rlpure.tasks.math_grading.gsm8k_ground_truth(answer)`).
        source: where the row came from (a file path, or `openai/gsm8k:main/<split>`).
        row: the 0-based row index in `source`.
    """

    question: str
    answer: str
    ground_truth: str
    source: str
    row: int


def problems_from_rows(
    rows: Iterable[Mapping[str, Any]], *, source: str
) -> tuple[Gsm8kProblem, ...]:
    """Validates GSM8K rows and turns them into problems.

    Args:
        rows: mappings with string `question` and `answer` (extra keys are ignored).
        source: named in errors and stored on each problem.

    Returns:
        One problem per row, in order.

    Raises:
        Gsm8kDataError: naming `source` and the row, for a missing or non-string field, an
            empty question, an answer without `####`, or a final answer that is not a number.
    """
    problems = []
    for i, row in enumerate(rows):
        where = f"GSM8K {source} row {i}"
        if not isinstance(row, Mapping):
            raise Gsm8kDataError(f"{where}: expected an object, got {type(row).__name__}")
        for key in ("question", "answer"):
            if key not in row:
                raise Gsm8kDataError(f"{where}: missing field {key!r} (has {sorted(row)})")
            if not isinstance(row[key], str):
                raise Gsm8kDataError(
                    f"{where}: field {key!r} must be a string, got {type(row[key]).__name__}"
                )
        if not row["question"].strip():
            raise Gsm8kDataError(f"{where}: empty question")
        try:
            truth = gsm8k_ground_truth(row["answer"])
        except ValueError as err:
            raise Gsm8kDataError(f"{where}: {err}") from None
        if normalize_numeric_answer(truth) is None:
            raise Gsm8kDataError(f"{where}: final answer {truth!r} is not a number")
        problems.append(
            Gsm8kProblem(
                question=row["question"],
                answer=row["answer"],
                ground_truth=truth,
                source=source,
                row=i,
            )
        )
    return tuple(problems)


def shuffle_problems(problems: Sequence[Gsm8kProblem], *, seed: int) -> tuple[Gsm8kProblem, ...]:
    """`problems` permuted by `numpy.random.default_rng(seed)`; the same seed, the same order."""
    order = np.random.default_rng(seed).permutation(len(problems))
    return tuple(problems[int(i)] for i in order)


def load_gsm8k(
    split: Split,
    *,
    data_dir: Path | str | None = None,
    seed: int | None = None,
    cache_dir: Path | str | None = None,
) -> tuple[Gsm8kProblem, ...]:
    """Loads and validates one GSM8K split.

    Args:
        split: `"train"` or `"test"`.
        data_dir: a folder with `train.jsonl` / `test.jsonl` (e.g. `../shared/data/gsm8k`);
            None reads `openai/gsm8k` (config `main`) from the Hugging Face hub.
        seed: if given, the problems are shuffled with it (`shuffle_problems`).
        cache_dir: the `datasets` cache folder (default: the `datasets` default).

    Returns:
        The split's problems.

    Raises:
        ValueError: for an unknown split.
        DatasetUnavailableError: the local file is missing, or the hub cannot be reached
            (the message suggests `--data-dir`).
        Gsm8kDataError: a file that is not JSONL, a file or split without rows, or a row with
            the wrong schema.
    """
    if split not in _SPLITS:
        raise ValueError(f"load_gsm8k: split must be one of {_SPLITS}, got {split!r}")
    import datasets  # heavy import (~3 s), only when data is actually loaded

    cache = None if cache_dir is None else str(cache_dir)
    if data_dir is not None:
        path = Path(data_dir) / f"{split}.jsonl"
        if not path.is_file():
            raise DatasetUnavailableError(
                f"GSM8K: no {split} file at {path} (expected {split}.jsonl in --data-dir)"
            )
        source = str(path)
        if _is_blank(path):
            # `datasets` raises a bare StopIteration on a file without rows, which cannot
            # cross `asyncio.to_thread` (the awaiting task would hang forever).
            raise Gsm8kDataError(
                f"GSM8K {source}: the file has no rows (expected one JSON object per line)"
            )
        try:
            ds = datasets.load_dataset(
                "json", data_files={split: str(path)}, split=split, cache_dir=cache
            )
        except datasets.exceptions.DatasetGenerationError as err:
            cause = err.__cause__ or err
            raise Gsm8kDataError(f"GSM8K {source}: not a valid JSONL file: {cause}") from err
        except StopIteration:
            raise Gsm8kDataError(f"GSM8K {source}: the file has no rows") from None
    else:
        source = f"{GSM8K_HUB_PATH}:{GSM8K_HUB_CONFIG}/{split}"
        try:
            ds = datasets.load_dataset(
                GSM8K_HUB_PATH, GSM8K_HUB_CONFIG, split=split, cache_dir=cache
            )
        except OSError as err:  # ConnectionError, offline mode, missing files
            raise DatasetUnavailableError(
                f"GSM8K: cannot load {GSM8K_HUB_PATH} ({GSM8K_HUB_CONFIG}) from the Hugging Face "
                f"hub: {err}. Without hub access, pass a folder of local JSONL files with "
                "--data-dir (e.g. --data-dir ../shared/data/gsm8k)."
            ) from err
    missing = {"question", "answer"} - set(ds.column_names)
    if missing:
        raise Gsm8kDataError(
            f"GSM8K {source}: missing column(s) {sorted(missing)}; has {ds.column_names}"
        )
    problems = problems_from_rows(ds.select_columns(["question", "answer"]), source=source)
    if not problems:
        raise Gsm8kDataError(f"GSM8K {source}: the split has no rows")
    return problems if seed is None else shuffle_problems(problems, seed=seed)


def _is_blank(path: Path) -> bool:
    """Whether the file holds nothing but whitespace (read in chunks: GSM8K files are MBs)."""
    with path.open("rb") as file:
        while chunk := file.read(1 << 16):
            if chunk.strip():
                return False
    return True


_T = TypeVar("_T")


def without_stop_iteration(fn: Callable[..., _T]) -> Callable[..., _T]:
    """`fn` for `asyncio.to_thread`: a `StopIteration` it raises becomes a `RuntimeError`.

    A `StopIteration` raised in a worker thread cannot be set on the awaiting future (asyncio
    refuses it with a `TypeError` inside the thread), so the await would never return; it is
    re-raised as a `RuntimeError` (a bug in a dependency, with its traceback).
    """

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> _T:
        try:
            return fn(*args, **kwargs)
        except StopIteration as err:
            raise RuntimeError(f"{fn.__name__}: unexpected StopIteration: {err!r}") from err

    return call


class Gsm8kSplits(msgspec.Struct, frozen=True, kw_only=True):
    """The problems of a run: the training split (shuffled) and the evaluation split.

    Attributes:
        train: training problems, in the order batches take them.
        test: evaluation problems, in file order (possibly the first N only); may be empty.
    """

    train: tuple[Gsm8kProblem, ...]
    test: tuple[Gsm8kProblem, ...]


def load_gsm8k_splits(
    *,
    data_dir: Path | str | None = None,
    seed: int = 0,
    max_test_problems: int | None = None,
    cache_dir: Path | str | None = None,
) -> Gsm8kSplits:
    """Loads both splits as a run uses them: train shuffled by `seed`, test in file order.

    Args:
        data_dir: as in `load_gsm8k` (None: the hub).
        seed: the training shuffle seed.
        max_test_problems: keep only the first N test problems (None: all; 0: no test set).
        cache_dir: the `datasets` cache folder.

    Raises:
        ValueError: `max_test_problems` < 0.
        DatasetUnavailableError, Gsm8kDataError: as `load_gsm8k`.
    """
    if max_test_problems is not None and max_test_problems < 0:
        raise ValueError(
            f"load_gsm8k_splits: max_test_problems must be >= 0, got {max_test_problems}"
        )
    train = load_gsm8k("train", data_dir=data_dir, seed=seed, cache_dir=cache_dir)
    if max_test_problems == 0:
        return Gsm8kSplits(train=train, test=())
    test = load_gsm8k("test", data_dir=data_dir, cache_dir=cache_dir)
    if max_test_problems is not None:
        test = test[:max_test_problems]
    return Gsm8kSplits(train=train, test=test)


# --- environments ------------------------------------------------------------------------------


class Gsm8kEnv(ProblemEnv):
    """One GSM8K question, answered in `\\boxed{}` (single turn).

    Args:
        problem: the problem.
        renderer: renders the conversation and parses the response (`role_colon`).
        convo_prefix: messages before the question; by default the strawberry few-shot.
        format_coef: penalty for a malformed response (reward `format_coef * (format - 1)`).
        require_stop_sequence_for_format: `format` also requires the `"\\n\\nUser:"` stop.
    """

    def __init__(
        self,
        problem: Gsm8kProblem,
        renderer: Renderer,
        *,
        convo_prefix: Sequence[Mapping[str, str]] | None = None,
        format_coef: float = 0.1,
        require_stop_sequence_for_format: bool = True,
    ) -> None:
        prefix = gsm8k_fewshot_prefix() if convo_prefix is None else list(convo_prefix)
        super().__init__(
            renderer,
            convo_prefix=[{"role": m["role"], "content": m["content"]} for m in prefix],
            format_coef=format_coef,
            require_stop_sequence_for_format=require_stop_sequence_for_format,
        )
        self.problem = problem

    def get_question(self) -> str:
        return gsm8k_question(self.problem.question)

    def check_format(self, sample_str: str) -> bool:
        return has_boxed_answer(sample_str)

    def check_answer(self, sample_str: str) -> bool:
        return grade_boxed_response(sample_str, self.problem.ground_truth)

    def get_reference_answer(self) -> str:
        return self.problem.ground_truth


class Gsm8kDataset(RLDataset):
    """Batches of GSM8K problems; each problem is a group of `group_size` same-problem envs.

    Args:
        problems: the problems, already in the order to use (shuffle before if wanted).
        batch_size: problems per batch (>= 1); the last batch may be short.
        group_size: envs per problem (>= 1).
        renderer: passed to every env.
        convo_prefix: messages before each question; None means the strawberry few-shot,
            `()` means none.
        format_coef: passed to every env.
        dataset_name: logging tag of the groups.
    """

    def __init__(
        self,
        problems: Sequence[Gsm8kProblem],
        *,
        batch_size: int,
        group_size: int,
        renderer: Renderer,
        convo_prefix: Sequence[Mapping[str, str]] | None = None,
        format_coef: float = 0.1,
        dataset_name: str = "gsm8k",
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"Gsm8kDataset.batch_size: expected >= 1, got {batch_size}")
        if group_size < 1:
            raise ValueError(f"Gsm8kDataset.group_size: expected >= 1, got {group_size}")
        if not problems:
            raise ValueError("Gsm8kDataset.problems: empty")
        self.problems = tuple(problems)
        self.batch_size = batch_size
        self.group_size = group_size
        self.renderer = renderer
        self.convo_prefix = None if convo_prefix is None else tuple(convo_prefix)
        self.format_coef = format_coef
        self.dataset_name = dataset_name

    def __len__(self) -> int:
        return math.ceil(len(self.problems) / self.batch_size)

    def batch_problems(self, index: int) -> tuple[Gsm8kProblem, ...]:
        """The problems of batch `index`."""
        if not 0 <= index < len(self):
            raise IndexError(f"Gsm8kDataset.get_batch: index {index} not in [0, {len(self)})")
        return self.problems[index * self.batch_size : (index + 1) * self.batch_size]

    def get_batch(self, index: int) -> list[EnvGroupBuilder]:
        return [
            ProblemGroupBuilder(
                env_thunk=partial(
                    Gsm8kEnv,
                    problem,
                    self.renderer,
                    convo_prefix=self.convo_prefix,
                    format_coef=self.format_coef,
                ),
                num_envs=self.group_size,
                dataset_name=self.dataset_name,
            )
            for problem in self.batch_problems(index)
        ]


@dataclass(frozen=True)
class Gsm8kDatasetBuilder(RLDatasetBuilder):
    """Builds the GSM8K train dataset (shuffled by `seed`) and test dataset (file order).

    Attributes:
        batch_size: problems per training batch (the tutorial: 16).
        group_size: envs per problem in training (the tutorial: 8).
        renderer: the renderer of every env.
        data_dir: local JSONL folder, or None for the hub.
        seed: training shuffle seed.
        fewshot: prepend the strawberry example (the tutorial does).
        format_coef: penalty for malformed responses.
        test_group_size: envs per test problem (1, as the cookbook).
        test_batch_size: problems per test batch (default: `batch_size`).
        max_test_problems: evaluate on the first N test problems only (None: all 1319; 0: no
            test dataset).
        cache_dir: the `datasets` cache folder.
        preloaded: problems already loaded (`load_gsm8k_splits`); when set, `data_dir`,
            `seed`, `max_test_problems` and `cache_dir` are not used. Lets a caller read and
            validate the data before it has a renderer (e.g. before creating a training client).
    """

    batch_size: int
    group_size: int
    renderer: Renderer
    data_dir: Path | None = None
    seed: int = 0
    fewshot: bool = True
    format_coef: float = 0.1
    test_group_size: int = 1
    test_batch_size: int | None = None
    max_test_problems: int | None = None
    cache_dir: Path | None = field(default=None)
    preloaded: Gsm8kSplits | None = None

    async def __call__(self) -> tuple[Gsm8kDataset, Gsm8kDataset | None]:
        splits = self.preloaded
        if splits is None:
            splits = await asyncio.to_thread(
                without_stop_iteration(load_gsm8k_splits),
                data_dir=self.data_dir,
                seed=self.seed,
                max_test_problems=self.max_test_problems,
                cache_dir=self.cache_dir,
            )
        prefix = None if self.fewshot else ()
        common: dict[str, Any] = {
            "renderer": self.renderer,
            "convo_prefix": prefix,
            "format_coef": self.format_coef,
        }
        train_ds = Gsm8kDataset(
            splits.train, batch_size=self.batch_size, group_size=self.group_size, **common
        )
        if not splits.test:
            return train_ds, None
        test_ds = Gsm8kDataset(
            splits.test,
            batch_size=self.test_batch_size or self.batch_size,
            group_size=self.test_group_size,
            dataset_name="gsm8k_test",
            **common,
        )
        return train_ds, test_ds
