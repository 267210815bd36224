"""Cost accounting against tinker-cookbook 0.6.1's `utils/cost_estimation.py`: the same USD for
the same counts and prices, the same rates from a `models.json` entry, and `rlpure cost` /
`rlpure report` reading a log dir the cookbook's own `rl.train.main` wrote (on the local
backend, its pricing fetch replaced by fixed rates: about a minute on 2 shared cores)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.parity.porting import require_cookbook

require_cookbook()

from tinker_cookbook.utils import cost_estimation as cb  # noqa: E402

from rlpure.cost import TokenCostRates, cost_metrics, parse_price_table  # noqa: E402
from rlpure.usage import TOKEN_KINDS, TokenUsage  # noqa: E402
from shell.cli import main as rlpure_main  # noqa: E402
from shell.training import read_jsonl  # noqa: E402
from tests.parity.test_cross_resume import MICRO, _cookbook_main, on_local  # noqa: E402, F401

counts = st.fixed_dictionaries({kind: st.integers(0, 10**9) for kind in TOKEN_KINDS})
prices = st.fixed_dictionaries(
    {
        key: st.floats(0, 50, allow_nan=False, allow_infinity=False)
        for key in ("prefill", "cached_prefill", "sample", "train")
    }
)


def _cookbook_rates(p: dict[str, float]) -> Any:
    return cb.TokenCostRates(
        prefill_usd_per_million=p["prefill"],
        cached_prefill_usd_per_million=p["cached_prefill"],
        sample_usd_per_million=p["sample"],
        train_usd_per_million=p["train"],
    )


@settings(max_examples=80, deadline=None)
@given(st.lists(counts, min_size=1, max_size=5), prices)
def test_the_step_and_cumulative_usd_equal_the_cookbooks_cost_tracker(
    steps: list[dict[str, int]], p: dict[str, float]
) -> None:
    tracker = cb.CostTracker(_cookbook_rates(p))
    rates = TokenCostRates(**p)
    cumulative = TokenUsage()
    for step in steps:
        expected = tracker.record_step(cb.TokenUsage(**step))
        cumulative += TokenUsage(**step)
        ours = cost_metrics(TokenUsage(**step), cumulative, rates)
        for key, value in ours.items():
            assert math.isclose(value, expected[key], rel_tol=1e-12, abs_tol=1e-12), key


@given(prices, st.sampled_from(["$", ""]))
def test_a_models_json_entry_gives_the_cookbooks_rates(p: dict[str, float], sign: str) -> None:
    entry = {"tinker_id": "m", "note": "x", **{k: f"{sign}{v}" for k, v in p.items()}}
    expected = cb.rates_from_pricing_entry(entry)
    ours = parse_price_table([entry], where="models.json").rates_for("m")
    assert expected is not None
    assert (ours.prefill, ours.cached_prefill, ours.sample, ours.train) == (
        expected.prefill_usd_per_million,
        expected.cached_prefill_usd_per_million,
        expected.sample_usd_per_million,
        expected.train_usd_per_million,
    )


def test_an_incomplete_models_json_entry_is_no_rates_in_both() -> None:
    entry = {"tinker_id": "m", "prefill": "$1", "sample": "$2", "train": "$3"}
    assert cb.rates_from_pricing_entry(entry) is None
    with pytest.raises(ValueError, match="lacks the price"):
        parse_price_table([entry], where="models.json").rates_for("m")


PRICES = {"prefill": 1.5, "cached_prefill": 0.25, "sample": 3.0, "train": 4.5}


@pytest.mark.slow
@pytest.mark.usefixtures("on_local")  # the cookbook's main on the local backend
def test_rlpure_cost_and_report_read_a_log_dir_the_cookbooks_main_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    import tinker_cookbook.rl.train as cookbook_train

    monkeypatch.setattr(
        cookbook_train, "fetch_model_pricing", lambda model_name: _cookbook_rates(PRICES)
    )
    log_path = tmp_path / "run"
    _cookbook_main(log_path, 2)
    rows = read_jsonl(log_path / "metrics.jsonl")
    recorded = [r["cost/cumulative_usd"] for r in rows if "cost/cumulative_usd" in r]
    assert recorded, "the cookbook logged no cost"
    table = tmp_path / "prices.toml"
    table.write_text(f'[models."{MICRO}"]\n' + "".join(f"{k} = {v}\n" for k, v in PRICES.items()))
    capsys.readouterr()
    assert rlpure_main(["cost", str(log_path), "--prices", str(table)]) == 0
    out = capsys.readouterr().out
    assert ": 2 steps, model " + MICRO in out.splitlines()[0]  # the cookbook's config.json
    total = next(line for line in out.splitlines() if line.startswith("total"))
    assert float(total.split()[-1].replace(",", "")) == pytest.approx(recorded[-1], abs=1e-6)
    assert rlpure_main(["report", str(log_path)]) == 0
    written = [Path(line) for line in capsys.readouterr().out.split()]
    assert [p.name for p in written] == ["report_curves.png", "report_timing_000001.png"]
    assert all(p.stat().st_size > 10_000 for p in written)
