"""Datum assembly benchmark: trajectories → advantages → padded arrays / `tinker.Datum`s.

Every implementation gets the same synthetic batch; the script prints median wall times and
ratios measured in the same process (machines here are noisy, so only ratios are compared):

- `rlpure arrays`:   `compute_advantages` + `assemble_batch` → padded numpy arrays.
- `rlpure datums`:   the above + `shell.to_tinker_datums` → `list[tinker.Datum]`.
- `reference`:       a faithful list-based re-implementation of the cookbook algorithm on
                     cookbook-style records (Python lists of ints), building `tinker.Datum`s
                     through the SDK's validating constructors (`rlpure.testing.reference`).
- `cookbook 0.6.1`:  the real `tinker_cookbook.rl.data_processing`, when importable (it needs
                     torch; run this script from a throwaway venv that has it).
- `memcpy floor`:    allocating and writing the same number of bytes as rlpure's padded output.

Run: `.venv/bin/python benchmarks/bench_assembly.py [--quick]`.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import tinker

from rlpure.advantages import compute_advantages
from rlpure.packing import DatumBatch, assemble_batch
from rlpure.records import ModelInput, TokensWithLogprobs, Trajectory, TrajectoryGroup, Transition
from rlpure.testing.reference import (
    reference_assemble_training_data,
    reference_group_centered_advantages,
)
from shell.datums import to_tinker_datums
from shell.to_cookbook import to_cookbook_groups


@dataclass(frozen=True)
class Case:
    name: str
    groups: int
    group_size: int
    turns: int
    ob_tokens: int
    ac_tokens: int
    prefix: bool = True


CASES = (
    Case("small 8x8x(128+256)", 8, 8, 1, 128, 256),
    Case("GRPO 64x16x(300+1000)", 64, 16, 1, 300, 1000),
    Case("multi-turn 32x8x4x(200+200) prefix", 32, 8, 4, 200, 200, prefix=True),
    Case("multi-turn 32x8x4x(200+200) breaks", 32, 8, 4, 200, 200, prefix=False),
)


def make_groups(case: Case, seed: int = 0) -> list[TrajectoryGroup]:
    """Synthetic groups: random tokens, logprobs in (-1, 0], 0/1 rewards."""
    rng = np.random.default_rng(seed)
    groups = []
    for _ in range(case.groups):
        prompt = rng.integers(0, 150_000, case.ob_tokens, dtype=np.int32)
        trajs = []
        for _ in range(case.group_size):
            transitions = []
            history = np.zeros(0, np.int32)
            for turn in range(case.turns):
                new_ob = prompt if turn == 0 else rng.integers(0, 150_000, case.ob_tokens)
                ob = np.concatenate([history, new_ob]) if case.prefix else new_ob
                ac = rng.integers(0, 150_000, case.ac_tokens, dtype=np.int32)
                lp = -rng.random(case.ac_tokens, dtype=np.float32)
                transitions.append(
                    Transition(
                        ob=ModelInput(tokens=ob),
                        ac=TokensWithLogprobs(tokens=ac, logprobs=lp),
                        reward=float(rng.integers(0, 2)) if turn == case.turns - 1 else 0.0,
                        episode_done=turn == case.turns - 1,
                    )
                )
                history = np.concatenate([ob, ac])
            trajs.append(Trajectory(transitions=tuple(transitions)))
        groups.append(
            TrajectoryGroup(
                trajectories_G=tuple(trajs),
                final_rewards_G=(0.0,) * case.group_size,
                metrics_G=({},) * case.group_size,
            )
        )
    return groups


def as_cookbook_style(groups: list[TrajectoryGroup]) -> list[Any]:
    """The same groups with Python lists of ints, as the cookbook's records hold them."""

    def transition(t: Transition) -> SimpleNamespace:
        return SimpleNamespace(
            ob=SimpleNamespace(tokens=t.ob.to_ints()),
            ac=SimpleNamespace(
                tokens=t.ac.tokens.tolist(),
                logprobs=None if t.ac.logprobs is None else t.ac.logprobs.tolist(),
                sequence_id=t.ac.sequence_id,
            ),
            reward=t.reward,
            metrics=t.metrics,
        )

    out = []
    for g in groups:
        trajs = [
            SimpleNamespace(transitions=[transition(t) for t in tr.transitions])
            for tr in g.trajectories_G
        ]
        out.append(
            SimpleNamespace(
                trajectories_G=trajs,
                final_rewards_G=list(g.final_rewards_G),
                get_total_rewards=g.get_total_rewards,
            )
        )
    return out


def reference_datums(groups: list[Any]) -> list[tinker.Datum]:
    """The cookbook algorithm on lists, ending in `tinker.Datum`s built from lists."""
    advantages = reference_group_centered_advantages(groups)
    datums = []
    for d in reference_assemble_training_data(groups, advantages):
        datums.append(
            tinker.Datum(
                model_input=tinker.ModelInput.from_ints(d["model_input"]),
                loss_fn_inputs={
                    "target_tokens": tinker.TensorData.from_numpy(np.array(d["target_tokens"])),
                    "logprobs": tinker.TensorData.from_numpy(np.array(d["logprobs"], np.float32)),
                    "advantages": tinker.TensorData.from_numpy(
                        np.array(d["advantages"], np.float32)
                    ),
                    "mask": tinker.TensorData.from_numpy(np.array(d["mask"], np.float32)),
                },
            )
        )
    return datums


def cookbook_runner(groups: list[TrajectoryGroup]) -> Callable[[], Any] | None:
    """The real cookbook 0.6.1 on its own records, or None when it is not importable."""
    try:
        from tinker_cookbook.rl import data_processing as cb
    except ImportError:
        return None
    cb_groups = to_cookbook_groups(groups)
    return lambda: cb.assemble_training_data(cb_groups, cb.compute_advantages(cb_groups))


def rlpure_arrays(groups: list[TrajectoryGroup]) -> DatumBatch:
    return assemble_batch(groups, compute_advantages(groups))


def output_bytes(batch: DatumBatch) -> int:
    """Bytes of memory the padded `[D, T]` arrays occupy (views of one buffer counted once: the
    inputs and targets share theirs), i.e. what the memcpy floor has to write."""
    buffers: dict[int, int] = {}
    for name in (
        "input_tokens_D_T",
        "target_tokens_D_T",
        "logprobs_D_T",
        "advantages_D_T",
        "mask_D_T",
    ):
        root = np.asarray(getattr(batch, name))
        while isinstance(root.base, np.ndarray):
            root = root.base
        buffers[id(root)] = root.nbytes
    return sum(buffers.values())


def memcpy_floor(nbytes: int) -> Callable[[], np.ndarray]:
    source = np.ones(nbytes, np.uint8)

    def run() -> np.ndarray:
        out = np.empty_like(source)
        np.copyto(out, source)
        return out

    return run


def median_seconds(fn: Callable[[], Any], *, repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        # Start every repetition from a collected heap, so that a full collection of the many
        # record objects alive here does not land at random inside one timed call (GC stays on).
        gc.collect()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run_case(case: Case, *, repeats: int, slow_repeats: int) -> dict[str, float]:
    groups = make_groups(case)
    cookbook_style = as_cookbook_style(groups)
    batch = rlpure_arrays(groups)
    times = {
        "rlpure arrays": median_seconds(lambda: rlpure_arrays(groups), repeats=repeats),
        "rlpure datums": median_seconds(
            lambda: to_tinker_datums(rlpure_arrays(groups)), repeats=repeats
        ),
        "reference": median_seconds(lambda: reference_datums(cookbook_style), repeats=slow_repeats),
        "memcpy floor": median_seconds(memcpy_floor(output_bytes(batch)), repeats=repeats),
    }
    cookbook = cookbook_runner(groups)
    if cookbook is not None:
        times["cookbook 0.6.1"] = median_seconds(cookbook, repeats=slow_repeats)
    tokens = int(np.asarray(batch.length_D).sum())
    print(
        f"\n## {case.name}: {batch.num_datums} datums, {tokens:,} tokens, padded {batch.shape}, "
        f"{output_bytes(batch) / 1e6:.1f} MB of output"
    )
    slow = times.get("cookbook 0.6.1", times["reference"])
    slow_name = "cookbook 0.6.1" if "cookbook 0.6.1" in times else "reference"
    for name, seconds in times.items():
        print(f"  {name:<15} {seconds * 1e3:9.2f} ms")
    print(
        f"  speed-up vs {slow_name}: arrays {slow / times['rlpure arrays']:.0f}x, "
        f"datums {slow / times['rlpure datums']:.0f}x"
    )
    print(f"  rlpure arrays / memcpy floor: {times['rlpure arrays'] / times['memcpy floor']:.2f}x")
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (smoke run)")
    parser.add_argument("--case", default=None, help="run only cases whose name contains this")
    args = parser.parse_args(argv)
    repeats, slow_repeats = (3, 1) if args.quick else (15, 3)
    print(f"python {sys.version.split()[0]}, numpy {np.__version__}, tinker {tinker.__version__}")
    for case in CASES:
        if args.case is None or args.case in case.name:
            run_case(case, repeats=repeats, slow_repeats=slow_repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
