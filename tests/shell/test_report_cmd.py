"""`rlpure cost` and `rlpure report` on log dirs in the loop's (and the cookbook's) format."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shell.cli import main
from shell.jobs import COMMANDS

PRICES = (
    '[models."Qwen/Qwen3-8B"]\nprefill = 1.0\ncached_prefill = 0.5\nsample = 2.0\ntrain = 4.0\n'
)
STEP_TOKENS = [
    {"sampled": 100, "prefill_cached": 40, "prefill_uncached": 60, "trained": 150},
    {"sampled": 200, "prefill_cached": 0, "prefill_uncached": 100, "trained": 250},
    {"sampled": 300, "prefill_cached": 10, "prefill_uncached": 90, "trained": 350},
]


def _spans(step: int, *, with_training: bool = True) -> dict[str, Any]:
    """One `timing_spans.jsonl` line in the cookbook 0.6.1 schema (`IterationWindow`)."""
    spans = [("sampling", 0.0, 1.5)]
    if with_training:
        spans += [
            ("assemble_training_data", 1.5, 1.6),
            ("train/fwd_bwd_substep_0_mb_0_enqueue", 1.6, 2.4),
            ("train/optim_substep_0_enqueue", 2.4, 2.5),
            ("train_step", 1.6, 2.6),
        ]
    return {
        "step": step,
        "spans": [
            {"name": n, "duration": e - s, "wall_start": s, "wall_end": e} for n, s, e in spans
        ],
    }


def _log_dir(
    root: Path,
    *,
    discarded: int = 0,
    totals_discarded: int | None = None,
    timing: bool = True,
    config: dict[str, Any] | None = None,
) -> Path:
    """A 3-step run's log dir: train rows (reward, token counts), an eval at step 0 and a
    final eval row at step 3, timing spans per step, config.json."""
    root.mkdir(parents=True, exist_ok=True)
    rows, cumulative = [], dict.fromkeys(STEP_TOKENS[0], 0)
    for step, tokens in enumerate(STEP_TOKENS):
        for kind, count in tokens.items():
            cumulative[kind] += count
        cumulative["sampled"] += discarded if step == 1 else 0
        row: dict[str, Any] = {
            "step": step,
            "progress/batch": step,
            "env/all/reward/total": 0.1 * step,
            **{f"tokens/{k}": v for k, v in tokens.items()},
            **{f"tokens/cumulative/{k}": v for k, v in cumulative.items()},
        }
        if step == 0:
            row |= {"test/env/all/reward/total": 0.05, "test/env/all/correct": 0.0}
        rows.append(row)
    rows.append(
        {"step": 3, "final_eval": 1, "test/env/all/reward/total": 0.4, "test/env/all/correct": 0.5}
    )
    if totals_discarded is not None:  # the cookbook's final totals row (cumulative_metrics())
        cumulative["sampled"] += totals_discarded
        rows.append(
            {
                "step": 3,
                **{f"tokens/cumulative/{k}": v for k, v in cumulative.items()},
                **{f"tokens/discarded/{k}": 0 for k in cumulative},
                "tokens/discarded/sampled": discarded + totals_discarded,
            }
        )
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if timing:
        lines = [_spans(s) for s in range(3)] + [_spans(3, with_training=False)]
        (root / "timing_spans.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    recorded = {"base_model": "Qwen/Qwen3-8B", "price_table": None} | (config or {})
    (root / "config.json").write_text(json.dumps(recorded))
    return root


def _prices(tmp_path: Path, text: str = PRICES, name: str = "prices.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_both_commands_are_registered() -> None:
    assert {"cost", "report"} <= set(COMMANDS)


# --- rlpure cost -------------------------------------------------------------------------------


def _expected_usd(tokens: dict[str, int]) -> float:
    return (
        tokens["prefill_uncached"] * 1.0
        + tokens["prefill_cached"] * 0.5
        + tokens["sampled"] * 2.0
        + tokens["trained"] * 4.0
    ) / 1e6


def test_cost_prints_each_kind_the_total_and_the_step_mean(tmp_path: Path, capsys) -> None:
    log_dir = _log_dir(tmp_path / "run")
    assert main(["cost", str(log_dir), "--prices", str(_prices(tmp_path))]) == 0
    out = capsys.readouterr().out.splitlines()
    totals = {k: sum(t[k] for t in STEP_TOKENS) for k in STEP_TOKENS[0]}
    table = {line.split()[0]: line.split()[1:] for line in out[2:]}
    for kind, count in totals.items():
        usd = _expected_usd({**dict.fromkeys(totals, 0), kind: count})
        assert table[kind] == [f"{count:,}", f"{usd:,.6f}"], kind
    total_usd = _expected_usd(totals)
    assert table["total"] == [f"{sum(totals.values()):,}", f"{total_usd:,.6f}"]
    assert out[-1].split()[-1] == f"{total_usd / 3:,.6f}"
    assert "3 steps, model Qwen/Qwen3-8B, prices from" in out[0]


def test_cost_counts_tokens_outside_steps_in_the_total(tmp_path: Path, capsys) -> None:
    log_dir = _log_dir(tmp_path / "run", discarded=1000)
    assert main(["cost", str(log_dir), "--prices", str(_prices(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "includes 1,000 tokens counted in no step" in out
    sampled = next(line for line in out.splitlines() if line.startswith("sampled"))
    assert sampled.split()[1] == f"{600 + 1000:,}"


def test_cost_reads_the_final_totals_row_and_does_not_count_it_as_a_step(
    tmp_path: Path, capsys
) -> None:
    log_dir = _log_dir(tmp_path / "run", totals_discarded=500)
    assert main(["cost", str(log_dir), "--prices", str(_prices(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert ": 3 steps," in out.splitlines()[0]
    assert "includes 500 tokens counted in no step" in out
    assert main(["report", str(log_dir), "--out", str(tmp_path / "pics")]) == 0
    assert capsys.readouterr().out.split()[-1].endswith("report_timing_000002.png")


def test_cost_without_prices_counts_tokens_and_uses_the_runs_own_table(
    tmp_path: Path, capsys
) -> None:
    bare = _log_dir(tmp_path / "bare")
    assert main(["cost", str(bare)]) == 0
    out = capsys.readouterr().out
    assert "token counts only" in out
    assert next(line for line in out.splitlines() if line.startswith("total")).split()[-1] == "-"
    table = _prices(tmp_path)
    own = _log_dir(tmp_path / "own", config={"price_table": str(table)})
    assert main(["cost", str(own)]) == 0
    assert f"prices from {table}" in capsys.readouterr().out


def test_cost_of_a_cookbook_config_reads_model_name(tmp_path: Path, capsys) -> None:
    log_dir = _log_dir(tmp_path / "run")
    (log_dir / "config.json").write_text(json.dumps({"model_name": "Qwen/Qwen3-8B"}))
    assert main(["cost", str(log_dir), "--prices", str(_prices(tmp_path))]) == 0
    assert "model Qwen/Qwen3-8B" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("setup", "args", "message"),
    [
        (lambda d: None, [], r"log dir .*/missing: no such directory"),
        (lambda d: d.mkdir(), [], r"no metrics.jsonl \(not a training run's log dir\?\)"),
        (
            lambda d: (d.mkdir(), (d / "metrics.jsonl").write_text("")),
            [],
            r"metrics.jsonl: no training steps logged yet",
        ),
        (
            lambda d: (d.mkdir(), (d / "metrics.jsonl").write_text('{"step": 0, "x": 1}\n')),
            [],
            r"step 0 has no token counts .*written before token accounting",
        ),
    ],
)
def test_cost_refuses_a_log_dir_it_cannot_read_in_one_line(
    tmp_path: Path, capsys, setup: Any, args: list[str], message: str
) -> None:
    log_dir = tmp_path / "missing"
    setup(log_dir)
    assert main(["cost", str(log_dir), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("rlpure: configuration error: ")
    assert __import__("re").search(message, err), err


def test_cost_names_a_model_missing_from_the_table_and_a_malformed_table(
    tmp_path: Path, capsys
) -> None:
    log_dir = _log_dir(tmp_path / "run", config={"base_model": "rlpure/tiny"})
    assert main(["cost", str(log_dir), "--prices", str(_prices(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert "no prices for model 'rlpure/tiny' (the table lists 'Qwen/Qwen3-8B')" in err
    bad = _prices(tmp_path, PRICES.replace("train = 4.0", "train = -4"), name="bad.toml")
    assert main(["cost", str(log_dir), "--prices", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f'--prices {bad}: models."Qwen/Qwen3-8B".train: expected a finite price >= 0' in err
    broken = _prices(tmp_path, "[models\n", name="broken.toml")
    assert main(["cost", str(log_dir), "--prices", str(broken)]) == 2
    assert f"--prices {broken}: malformed TOML" in capsys.readouterr().err
    (log_dir / "config.json").unlink()
    assert main(["cost", str(log_dir), "--prices", str(_prices(tmp_path))]) == 2
    assert "pass --model NAME" in capsys.readouterr().err


# --- rlpure report -----------------------------------------------------------------------------


def _is_a_real_picture(path: Path) -> bool:
    """A PNG that decodes, is not blank, and has drawn (non-white) pixels in several colours."""
    from matplotlib import image

    pixels = image.imread(path)[..., :3]
    drawn = pixels[(pixels < 0.95).any(axis=-1)]
    colours = {tuple(np.round(p, 1)) for p in drawn[:: max(1, len(drawn) // 2000)]}
    return (
        path.stat().st_size > 10_000
        and len(drawn) / pixels[..., 0].size > 0.01
        and (len(colours) >= 4)
    )


def test_report_draws_the_curves_and_the_last_trained_steps_gantt(tmp_path: Path, capsys) -> None:
    log_dir = _log_dir(tmp_path / "run")
    assert main(["report", str(log_dir)]) == 0
    printed = [Path(line) for line in capsys.readouterr().out.splitlines()]
    # the last spans line is the final evaluation's (step 3): the default is the last trained
    assert printed == [log_dir / "report_curves.png", log_dir / "report_timing_000002.png"]
    assert all(_is_a_real_picture(path) for path in printed)


def test_report_step_and_out(tmp_path: Path, capsys) -> None:
    log_dir = _log_dir(tmp_path / "run")
    out = tmp_path / "pictures"
    assert main(["report", str(log_dir), "--step", "0", "--out", str(out)]) == 0
    assert capsys.readouterr().out.split() == [
        str(out / "report_curves.png"),
        str(out / "report_timing_000000.png"),
    ]
    assert not (log_dir / "report_curves.png").exists()
    for name in ("report_curves.png", "report_timing_000000.png"):
        (out / name).unlink()
    assert main(["report", str(log_dir), "--step", "9", "--out", str(out)]) == 2
    assert "no spans for step 9 (steps 0..3; 4 recorded)" in capsys.readouterr().err
    assert list(out.iterdir()) == []  # refused before anything was drawn


def test_report_without_timing_spans_draws_the_curves_and_says_so(tmp_path: Path, capsys) -> None:
    log_dir = _log_dir(tmp_path / "run", timing=False)
    assert main(["report", str(log_dir)]) == 0
    captured = capsys.readouterr()
    assert captured.out.split() == [str(log_dir / "report_curves.png")]
    assert "no timing_spans.jsonl; no timing chart drawn" in captured.err
    assert main(["report", str(log_dir), "--step", "1"]) == 2
    assert "no timing_spans.jsonl" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("spans", "named"),
    [([], "step 1 has no spans"), ([{"name": "a", "wall_start": "x", "wall_end": 1}], "wall_start is not a number")],
)  # fmt: skip
def test_report_refuses_malformed_timing_spans_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spans: list[Any], named: str
) -> None:
    # an empty span list or a non-numeric time crashed the Gantt with a traceback
    log_dir = _log_dir(tmp_path / "run", timing=False)
    (log_dir / "timing_spans.jsonl").write_text(json.dumps({"step": 1, "spans": spans}) + "\n")
    assert main(["report", str(log_dir), "--step", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "timing_spans.jsonl: " in err and named in err and len(err.splitlines()) == 1


def test_report_curves_take_a_steps_last_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # a step logged twice was drawn twice (a jump at that step), though the summary reads its
    # last row only
    import shell.report

    log_dir = _log_dir(tmp_path / "run", timing=False)
    with (log_dir / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 1, "env/all/reward/total": 0.9}) + "\n")
    seen: list[list[dict[str, Any]]] = []
    original = shell.report.curve_panels

    def recording(rows: list[dict[str, Any]]) -> Any:
        seen.append(rows)
        return original(rows)

    monkeypatch.setattr(shell.report, "curve_panels", recording)
    assert main(["report", str(log_dir)]) == 0
    [rows] = seen
    rewards = [(r["step"], r["env/all/reward/total"]) for r in rows if "env/all/reward/total" in r]
    assert rewards == [(0, 0.0), (1, 0.9), (2, 0.2)]


def test_report_refuses_a_missing_or_empty_log_dir(tmp_path: Path, capsys) -> None:
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "nope: no such directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "metrics.jsonl").write_text("")
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "no training steps logged yet" in capsys.readouterr().err


# --- a fake-SDK run priced by its price_table ---------------------------------------------------


def _fake_run(log_dir: Path, **options: Any) -> Any:
    import asyncio

    from shell.config import build_config
    from shell.fakes import FakeServiceClient, ScriptedDataset, ScriptedEnv, ScriptedGroupBuilder
    from shell.training import train

    def builder(batch: int, problem: int) -> ScriptedGroupBuilder:
        target = 3 + (batch + problem) % 5
        return ScriptedGroupBuilder(
            lambda _: ScriptedEnv(
                prompt=[1, 2, target],
                reward_fn=lambda action: float(np.mean(action == target)) if len(action) else 0.0,
                stop=(),
            ),
            group_size=3,
        )

    config = build_config(
        {"log_dir": str(log_dir), "backend": "fake", "progress": False, "max_tokens": 3},
        options,
    )
    dataset = ScriptedDataset(builder, num_batches=3, groups_per_batch=2)
    return asyncio.run(train(config, dataset=dataset, service_client=FakeServiceClient()))


@pytest.mark.slow  # a fake run: its first JAX compilations take seconds alone
def test_a_run_with_a_price_table_logs_its_cost_and_rlpure_cost_agrees(
    tmp_path: Path, capsys
) -> None:
    from rlpure.cost import TokenCostRates
    from rlpure.usage import TokenUsage

    table = _prices(tmp_path, PRICES.replace("Qwen/Qwen3-8B", "rlpure/tiny"))
    log_dir = tmp_path / "run"
    _fake_run(log_dir, price_table=str(table))
    rows = [
        r
        for r in (json.loads(x) for x in (log_dir / "metrics.jsonl").open())
        if "tokens/sampled" in r
    ]
    rates = TokenCostRates(prefill=1.0, cached_prefill=0.5, sample=2.0, train=4.0)
    step_usd = []
    for row in rows:
        step = TokenUsage(**{k: row[f"tokens/{k}"] for k in STEP_TOKENS[0]})
        cumulative = TokenUsage(**{k: row[f"tokens/cumulative/{k}"] for k in STEP_TOKENS[0]})
        assert row["cost/step_usd"] == pytest.approx(rates.estimate_usd(step))
        assert row["cost/cumulative_usd"] == pytest.approx(rates.estimate_usd(cumulative))
        step_usd.append(row["cost/step_usd"])
    assert rows[-1]["cost/cumulative_usd"] == pytest.approx(sum(step_usd))
    assert main(["cost", str(log_dir)]) == 0  # the run's own price_table
    total = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("total"))
    assert float(total.split()[-1]) == pytest.approx(rows[-1]["cost/cumulative_usd"], abs=1e-6)


def test_a_run_whose_model_is_not_in_the_table_is_refused_before_it_trains(
    tmp_path: Path,
) -> None:
    from shell.errors import ConfigError

    table = _prices(tmp_path)
    with pytest.raises(ConfigError, match=r"no prices for model 'rlpure/tiny'"):
        _fake_run(tmp_path / "run", price_table=str(table))
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
