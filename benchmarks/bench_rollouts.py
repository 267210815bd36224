"""Rollout concurrency: 512 rollouts with 100 ms of simulated env latency each.

If rollouts run concurrently the batch takes about one latency; run one after another it would
take 512. Prints the wall time of a batch of 64 groups x 8 envs as a ratio to one env latency,
for each rollout strategy (target: < 1.5), after a warm-up batch: the median of 5 runs, with
the best and worst (the CPU work per rollout — records, tasks — is what stretches a run on a
busy machine, so the load average is printed too).

    .venv/bin/python benchmarks/bench_rollouts.py
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time

from shell.env import Env
from shell.fakes import ScriptedEnv, ScriptedGroupBuilder, ScriptedPolicy
from shell.rollouts import (
    FailFast,
    MinViableGroup,
    RetryOnFailure,
    RolloutStrategy,
    do_batch_rollouts,
)

LATENCY_S = 0.1
GROUPS = 64
GROUP_SIZE = 8
TARGET_RATIO = 1.5
REPEATS = 5
_CPU_SECONDS: list[float] = []


def _make_env(i: int) -> Env:
    return ScriptedEnv(prompt=[1, 2, 3, i % 100], rewards=[1.0], latency=LATENCY_S)


async def _batch_seconds(strategy: RolloutStrategy) -> float:
    builders = [ScriptedGroupBuilder(_make_env, group_size=GROUP_SIZE) for _ in range(GROUPS)]
    policy = ScriptedPolicy(actions=[[4, 5, 6]])
    start, cpu_start = time.perf_counter(), time.process_time()
    outcomes = await do_batch_rollouts(
        builders, policy, strategy=strategy, max_concurrent_groups=GROUPS
    )
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    assert len(outcomes) == GROUPS and all(o.unwrap() for o in outcomes)
    _CPU_SECONDS.append(cpu)
    return elapsed


def main() -> None:
    asyncio.run(_batch_seconds(FailFast()))  # warm-up (imports, first task creation)
    strategies: list[RolloutStrategy] = [
        FailFast(),
        RetryOnFailure(max_retries=3),
        MinViableGroup(max_retries=3),
    ]
    rollouts = GROUPS * GROUP_SIZE
    print(
        f"{rollouts} rollouts ({GROUPS} groups x {GROUP_SIZE}), env latency {LATENCY_S:.3f} s, "
        f"{REPEATS} runs each; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"
    )
    worst_median = 0.0
    for strategy in strategies:
        _CPU_SECONDS.clear()
        ratios = sorted(asyncio.run(_batch_seconds(strategy)) / LATENCY_S for _ in range(REPEATS))
        median = statistics.median(ratios)
        worst_median = max(worst_median, median)
        cpu_us = statistics.median(_CPU_SECONDS) / rollouts * 1e6
        print(
            f"  {type(strategy).__name__:<16} wall / one latency: median {median:.2f}x, "
            f"best {ratios[0]:.2f}x, worst {ratios[-1]:.2f}x (sequential: {rollouts}x); "
            f"CPU {cpu_us:.0f} us per rollout"
        )
    verdict = "OK" if worst_median < TARGET_RATIO else "FAIL"
    print(f"worst median ratio {worst_median:.2f} (target < {TARGET_RATIO}): {verdict}")


if __name__ == "__main__":
    main()
