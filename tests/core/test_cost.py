"""`rlpure.cost`: USD of token counts, checked against a plain formula; price-table parsing."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpure.cost import (
    PRICE_KEYS,
    TokenCostRates,
    cost_metrics,
    parse_price_table,
    summarize_cost,
)
from rlpure.usage import TOKEN_KINDS, TokenUsage

usages = st.builds(
    TokenUsage,
    sampled=st.integers(0, 10**9),
    prefill_cached=st.integers(0, 10**9),
    prefill_uncached=st.integers(0, 10**9),
    trained=st.integers(0, 10**9),
)
prices = st.floats(0, 100, allow_nan=False, allow_infinity=False)
rates_strategy = st.builds(
    TokenCostRates, prefill=prices, cached_prefill=prices, sample=prices, train=prices
)


def _reference_usd(usage: TokenUsage, rates: TokenCostRates) -> float:
    """The cookbook's formula, written out."""
    return (
        usage.prefill_uncached * rates.prefill
        + usage.prefill_cached * rates.cached_prefill
        + usage.sampled * rates.sample
        + usage.trained * rates.train
    ) / 1e6


@settings(max_examples=60, deadline=None)
@given(usages, rates_strategy)
def test_estimate_equals_the_cookbook_formula(usage: TokenUsage, rates: TokenCostRates) -> None:
    assert math.isclose(rates.estimate_usd(usage), _reference_usd(usage, rates), rel_tol=1e-12)


@settings(max_examples=60, deadline=None)
@given(usages, usages, rates_strategy, st.integers(0, 50))
def test_cost_is_linear_in_the_counts(
    a: TokenUsage, b: TokenUsage, rates: TokenCostRates, k: int
) -> None:
    together = rates.estimate_usd(a + b)
    assert math.isclose(
        together, rates.estimate_usd(a) + rates.estimate_usd(b), rel_tol=1e-9, abs_tol=1e-9
    )
    scaled = TokenUsage(**{kind: k * n for kind, n in a.as_dict().items()})
    assert math.isclose(rates.estimate_usd(scaled), k * rates.estimate_usd(a), rel_tol=1e-9)


@given(rates_strategy)
def test_zero_tokens_cost_nothing(rates: TokenCostRates) -> None:
    assert rates.estimate_usd(TokenUsage()) == 0.0
    assert cost_metrics(TokenUsage(), TokenUsage(), rates) == {
        "cost/step_usd": 0.0,
        "cost/cumulative_usd": 0.0,
    }


def test_each_kind_is_billed_by_its_own_price() -> None:
    rates = TokenCostRates(prefill=1.0, cached_prefill=2.0, sample=3.0, train=4.0)
    for kind, price in zip(TOKEN_KINDS, (3.0, 2.0, 1.0, 4.0), strict=True):
        usage = TokenUsage(**{kind: 1_000_000})
        assert rates.usd_by_kind(usage)[kind] == price
        assert rates.estimate_usd(usage) == price


@settings(max_examples=40, deadline=None)
@given(st.lists(usages, max_size=8), rates_strategy)
def test_the_cumulative_cost_is_the_sum_of_the_steps(
    steps: list[TokenUsage], rates: TokenCostRates
) -> None:
    cumulative = TokenUsage()
    step_usd = []
    last: dict[str, float] = {"cost/cumulative_usd": 0.0}
    for usage in steps:
        cumulative += usage
        last = cost_metrics(usage, cumulative, rates)
        step_usd.append(last["cost/step_usd"])
    assert math.isclose(last["cost/cumulative_usd"], math.fsum(step_usd), rel_tol=1e-9)
    summary = summarize_cost(steps, rates)
    assert summary.total_usd is not None
    assert math.isclose(summary.total_usd, math.fsum(step_usd), rel_tol=1e-9, abs_tol=1e-12)
    assert summary.total_tokens == sum(sum(u.as_dict().values()) for u in steps)
    assert [k.tokens for k in summary.kinds] == list(cumulative.as_dict().values())


def test_the_discarded_total_gets_its_own_key() -> None:
    rates = TokenCostRates(prefill=1.0, cached_prefill=0.0, sample=0.0, train=0.0)
    metrics = cost_metrics(
        TokenUsage(), TokenUsage(), rates, discarded=TokenUsage(prefill_uncached=2_000_000)
    )
    assert metrics["cost/discarded_usd"] == 2.0


def test_a_summary_without_rates_counts_tokens_only() -> None:
    summary = summarize_cost([TokenUsage(sampled=4), TokenUsage(trained=6)], None)
    assert (summary.total_usd, summary.usd_per_step, summary.tokens_per_step) == (None, None, 5.0)
    assert all(k.usd is None for k in summary.kinds)
    empty = summarize_cost([], None)
    assert (empty.num_steps, empty.tokens_per_step) == (0, 0.0)


def test_both_table_forms_read_the_same_rates() -> None:
    table = parse_price_table(
        {
            "models": {
                "Qwen/Qwen3-8B": {
                    "prefill": 0.13,
                    "cached_prefill": 0.026,
                    "sample": 0.4,
                    "train": 0.4,
                }
            }
        },
        where="p.toml",
    )
    listed = parse_price_table(
        [
            {
                "tinker_id": "Qwen/Qwen3-8B",
                "prefill": "$0.13",
                "cached_prefill": "$0.026",
                "sample": "$0.40",
                "train": "$0.40",
                "note": "x",
                "context": "32K",
            },
            {"tinker_id": "other", "prefill": "$1"},  # incomplete: only an error when asked for
        ],
        where="models.json",
    )
    assert table.rates_for("Qwen/Qwen3-8B") == listed.rates_for("Qwen/Qwen3-8B")
    with pytest.raises(ValueError, match=r"models.json: the entry of model 'other' lacks"):
        listed.rates_for("other")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"models": {"m": {"prefill": 1, "sample": 1, "train": 1}}},
            r"^t: models.m: missing price\(s\) \['cached_prefill'\]",
        ),
        (
            {
                "models": {
                    "m": {"prefill": 1, "cached_prefill": 1, "sample": 1, "train": 1, "trian": 2}
                }
            },
            r"^t: models.m: unknown key\(s\) \['trian'\]",
        ),
        (
            {"models": {"m": {"prefill": -1, "cached_prefill": 1, "sample": 1, "train": 1}}},
            r"^t: models.m.prefill: expected a finite price >= 0, got -1",
        ),
        (
            {"models": {"m": {"prefill": "cheap", "cached_prefill": 1, "sample": 1, "train": 1}}},
            r"^t: models.m.prefill: expected a price such as",
        ),
        (
            {"models": {"m": {"prefill": True, "cached_prefill": 1, "sample": 1, "train": 1}}},
            r"^t: models.m.prefill: expected a price",
        ),
        ({"models": {"a/b": 3}}, r'^t: models."a/b": expected a table of prices'),
        ({"models": {}}, r"^t: expected a non-empty 'models' table"),
        ({"prices": {}}, r"^t: unknown top-level key\(s\) \['prices'\]"),
        ([{"prefill": "$1"}], r"^t: \[0\].tinker_id: expected the model's name"),
        ([{"tinker_id": "m", "prefill": "$x"}], r"^t: \[0\] \(m\).prefill: expected a price"),
        ([{"tinker_id": "m"}, {"tinker_id": "m"}], r"^t: model 'm' is listed twice"),
        ([], r"^t: lists no models"),
        (3, r"^t: expected a 'models' table or a models.json list, got int"),
    ],
)
def test_a_malformed_table_is_one_line_naming_the_key(data: object, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        parse_price_table(data, where="t")
    assert "\n" not in str(info.value)


def test_a_missing_model_names_the_listed_ones() -> None:
    table = parse_price_table(
        {"models": {"a": dict.fromkeys(PRICE_KEYS, 1.0), "b": dict.fromkeys(PRICE_KEYS, 1.0)}},
        where="t",
    )
    with pytest.raises(
        ValueError,
        match=r"^t: no prices for model 'rlpure/tiny' \(the table "
        r"lists 'a', 'b'\); add a \[models.\"rlpure/tiny\"\] table",
    ):
        table.rates_for("rlpure/tiny")
