"""Benchmark of the offline GRPO demo (`rlpure demo`): the README's accuracy and time targets.

Runs the demo's default recipe from scratch (no cached base model) for seeds 0, 1, 2 and
prints, per seed, held-out greedy accuracy before and after GRPO, wall seconds (`wall_s` of
the summary, compilation included, and the whole process's, interpreter start and imports
included: the time target applies to the latter), the pretraining/GRPO split and GRPO steps
per second. Targets (issue 5): accuracy
≤ 0.4 before and ≥ 0.9 after for 3 of 3 seeds, ≤ 180 s per seed on 2 cores.

Each seed runs in a fresh subprocess, so every seed pays its own compilation, as a user running
`rlpure demo --seed N` would.

Usage:
    .venv/bin/python benchmarks/bench_demo.py [--seeds 0,1,2] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_BEFORE = 0.4
TARGET_AFTER = 0.9
TARGET_SECONDS = 180.0


def _run_seed(seed: int, log_dir: Path) -> tuple[dict[str, object], float]:
    """Runs one seed in a fresh interpreter; returns its summary and the process's seconds."""
    code = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from shell.jobs.demo import run_demo\n"
        f"summary = run_demo(seed={seed}, log_dir=Path({str(log_dir)!r}), progress=False)\n"
        "print(json.dumps(summary))\n"
    )
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    return json.loads(done.stdout.strip().splitlines()[-1]), seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2", help="Comma-separated seeds.")
    parser.add_argument("--out", type=Path, default=None, help="Parent of the log dirs.")
    args = parser.parse_args()
    out = args.out if args.out is not None else Path(tempfile.mkdtemp(prefix="bench-demo-"))
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"log dirs under {out}")
    header = (
        f"{'seed':>4} | {'acc before':>10} | {'acc after':>9} | {'wall s':>7} | {'process s':>9} | "
        f"{'pretrain s':>10} | {'GRPO s':>7} | {'GRPO steps/s':>12} | target met"
    )
    print(header)
    print("-" * len(header))
    met = 0
    for seed in seeds:
        summary, process_s = _run_seed(seed, out / f"seed{seed}")
        before = float(summary["accuracy_before"])  # type: ignore[arg-type]
        after = float(summary["accuracy_after"])  # type: ignore[arg-type]
        wall = float(summary["wall_s"])  # type: ignore[arg-type]
        ok = before <= TARGET_BEFORE and after >= TARGET_AFTER and process_s <= TARGET_SECONDS
        met += ok
        print(
            f"{seed:>4} | {before:>10.2f} | {after:>9.2f} | {wall:>7.1f} | {process_s:>9.1f} | "
            f"{float(summary['pretrain_s']):>10.1f} | {float(summary['rl_s']):>7.1f} | "  # type: ignore[arg-type]
            f"{float(summary['rl_steps_per_s']):>12.2f} | {'yes' if ok else 'NO'}",  # type: ignore[arg-type]
            flush=True,
        )
    print(f"targets met for {met} of {len(seeds)} seeds")
    return 0 if met == len(seeds) else 1


if __name__ == "__main__":
    raise SystemExit(main())
