"""Cost accounting: USD of token counts under a price table (pure arithmetic, no IO).

Conventions:
- Prices are USD per million tokens, one per billed kind, with the names of the columns of
  Tinker's Models & Pricing page and its `models.json` (what tinker-cookbook 0.6.1's
  `utils/cost_estimation.py` downloads): `prefill`, `cached_prefill`, `sample`, `train`. They
  price the `rlpure.usage.TokenUsage` kinds `prefill_uncached`, `prefill_cached`, `sampled` and
  `trained` (`RATE_OF_KIND`).
- `usd = (prefill_uncached * prefill + prefill_cached * cached_prefill + sampled * sample +
  trained * train) / 1e6`, the cookbook's `TokenCostRates.estimate_usd`.
- A model's rates are all four prices or none: there is never a partial USD figure (as the
  cookbook, which logs token counts only when an entry is incomplete).
- A price table is parsed here from already-decoded data (a TOML/JSON table or the
  `models.json` list); reading the file is the shell's (`shell.cost`). Models are matched on
  their exact name, a `:peft:<ctx>` suffix included (long-context variants have their own
  prices).

Metrics (`cost_metrics`): `cost/step_usd`, `cost/cumulative_usd` and, when a discarded total is
given, `cost/discarded_usd`, the cookbook's `CostTracker` keys.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import msgspec

from rlpure.usage import TOKEN_KINDS, TokenUsage

__all__ = [
    "PRICE_KEYS",
    "RATE_OF_KIND",
    "TOKENS_PER_MILLION",
    "CostSummary",
    "KindCost",
    "ModelPrice",
    "PriceTable",
    "TokenCostRates",
    "cost_metrics",
    "parse_price_table",
    "summarize_cost",
]

TOKENS_PER_MILLION = 1_000_000
"""Prices are USD per this many tokens."""

PRICE_KEYS = ("prefill", "cached_prefill", "sample", "train")
"""The four prices of a model, named as the columns of Tinker's pricing page."""

RATE_OF_KIND: Mapping[str, str] = {
    "sampled": "sample",
    "prefill_cached": "cached_prefill",
    "prefill_uncached": "prefill",
    "trained": "train",
}
"""`TokenUsage` kind → the price that bills it."""


class TokenCostRates(msgspec.Struct, frozen=True, kw_only=True):
    """USD per million tokens for each billed kind (the cookbook's `TokenCostRates`).

    Attributes:
        prefill: uncached prompt tokens.
        cached_prefill: prompt tokens that hit the prefix cache.
        sample: sampled tokens.
        train: tokens of the datums sent to `forward_backward`.
    """

    prefill: float
    cached_prefill: float
    sample: float
    train: float

    def usd_by_kind(self, usage: TokenUsage) -> dict[str, float]:
        """`{kind: USD}` of `usage`, in `TOKEN_KINDS` order.

        Examples:
            >>> rates = TokenCostRates(prefill=1.0, cached_prefill=0.2, sample=3.0, train=3.0)
            >>> rates.usd_by_kind(TokenUsage(sampled=2_000_000))["sampled"]
            6.0
        """
        counts = usage.as_dict()
        return {
            kind: counts[kind] * getattr(self, RATE_OF_KIND[kind]) / TOKENS_PER_MILLION
            for kind in TOKEN_KINDS
        }

    def estimate_usd(self, usage: TokenUsage) -> float:
        """USD of `usage`: each kind's count times its price, over one million.

        Examples:
            >>> rates = TokenCostRates(prefill=1.0, cached_prefill=0.2, sample=3.0, train=3.0)
            >>> rates.estimate_usd(TokenUsage(prefill_uncached=500_000, trained=1_000_000))
            3.5
        """
        return math.fsum(self.usd_by_kind(usage).values())


class ModelPrice(msgspec.Struct, frozen=True, kw_only=True):
    """One model's entry of a price table.

    Attributes:
        model: the model's exact name (a Tinker ID such as `Qwen/Qwen3-8B`, or a local config
            name such as `rlpure/tiny`).
        rates: its four prices, or None when the entry lacks some (`missing` says which).
        missing: the price keys the entry lacks (only entries of a `models.json` list may be
            incomplete; a hand-written table must be complete).
    """

    model: str
    rates: TokenCostRates | None
    missing: tuple[str, ...] = ()


class PriceTable(msgspec.Struct, frozen=True, kw_only=True):
    """Prices by model (`parse_price_table` builds one).

    Attributes:
        entries: one per model, in the table's order; names are unique.
        source: where the table came from (a file's path), named in errors.
    """

    entries: tuple[ModelPrice, ...]
    source: str = "price table"

    @property
    def models(self) -> tuple[str, ...]:
        """The models the table lists, in its order."""
        return tuple(entry.model for entry in self.entries)

    def rates_for(self, model: str) -> TokenCostRates:
        """The complete rates of `model`.

        Raises:
            ValueError: `model` is not listed (naming the models that are), or its entry lacks
                a price; both name `source`.

        Examples:
            >>> table = parse_price_table({"models": {"m": {"prefill": 1, "cached_prefill": 0,
            ...     "sample": 2, "train": 2}}}, where="t.toml")
            >>> table.rates_for("m").sample
            2.0
        """
        for entry in self.entries:
            if entry.model == model:
                if entry.rates is None:
                    raise ValueError(
                        f"{self.source}: the entry of model {model!r} lacks the price(s) "
                        f"{list(entry.missing)}; all of {list(PRICE_KEYS)} are needed"
                    )
                return entry.rates
        listed = ", ".join(repr(m) for m in self.models[:8])
        more = f" and {len(self.models) - 8} more" if len(self.models) > 8 else ""
        raise ValueError(
            f"{self.source}: no prices for model {model!r} (the table lists {listed or 'no models'}"
            f"{more}); add a [models.{_toml_key(model)}] table with {', '.join(PRICE_KEYS)}"
        )


def _toml_key(name: str) -> str:
    return name if name.replace("_", "").replace("-", "").isalnum() else f'"{name}"'


def _price(value: object, *, where: str) -> float:
    """A price: a number or a `"$1.87"` string (models.json's), finite and >= 0."""
    if isinstance(value, bool):
        raise ValueError(f"{where}: expected a price in USD per million tokens, got {value!r}")
    if isinstance(value, str):
        text = value.strip().removeprefix("$").replace(",", "")
        try:
            number = float(text)
        except ValueError:
            raise ValueError(
                f'{where}: expected a price such as 0.4 or "$0.40", got {value!r}'
            ) from None
    elif isinstance(value, (int, float)):
        number = float(value)
    else:
        raise ValueError(
            f"{where}: expected a price in USD per million tokens, got {type(value).__name__} "
            f"{value!r}"
        )
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{where}: expected a finite price >= 0, got {value!r}")
    return number


def _entry(
    model: str, prices: Mapping[str, object], *, where: str, complete: bool, skip: frozenset[str]
) -> ModelPrice:
    unknown = sorted(set(prices) - set(PRICE_KEYS) - skip)
    if unknown:
        raise ValueError(
            f"{where}: unknown key(s) {unknown}; a model's prices are {list(PRICE_KEYS)}"
        )
    missing = tuple(k for k in PRICE_KEYS if prices.get(k) in (None, ""))
    if missing and complete:
        raise ValueError(
            f"{where}: missing price(s) {list(missing)}; all of {list(PRICE_KEYS)} are needed"
        )
    if missing:
        for key in PRICE_KEYS:  # still refuse a present but malformed price
            if key not in missing:
                _price(prices[key], where=f"{where}.{key}")
        return ModelPrice(model=model, rates=None, missing=missing)
    values = {key: _price(prices[key], where=f"{where}.{key}") for key in PRICE_KEYS}
    return ModelPrice(model=model, rates=TokenCostRates(**values))


_MODELS_JSON_KEYS = frozenset(
    {"tinker_id", "name", "type", "arch", "architecture", "size", "context", "note", "model"}
)


def parse_price_table(data: object, *, where: str) -> PriceTable:
    """Reads a price table from decoded TOML/JSON.

    Two forms are accepted:

    - a table `{"models": {MODEL: {"prefill": P, "cached_prefill": C, "sample": S, "train":
      T}}}` (in TOML: `[models."Qwen/Qwen3-8B"]` with four keys), every entry complete;
    - Tinker's `models.json` list, `[{"tinker_id": MODEL, "prefill": "$0.13", ...}, ...]`, as
      the cookbook downloads it; an entry without all four prices is kept as incomplete (an
      error only for a run of that model), other keys of an entry (`note`, `context`, ...)
      are ignored.

    Prices are numbers or `"$1.87"` strings, finite and >= 0, USD per million tokens.

    Args:
        data: the decoded file.
        where: what to name in errors (the file's path).

    Raises:
        ValueError: one line naming `where`, the key (`models."m".train`) and what was wrong.

    Examples:
        >>> parse_price_table([{"tinker_id": "m", "prefill": "$1", "cached_prefill": "$0.2",
        ...     "sample": "$3", "train": "$3"}], where="models.json").rates_for("m").prefill
        1.0
    """
    entries: list[ModelPrice] = []
    if isinstance(data, list):
        for i, item in enumerate(data):
            at = f"{where}: [{i}]"
            if not isinstance(item, Mapping):
                raise ValueError(f"{at}: expected an object, got {type(item).__name__}")
            model = item.get("tinker_id")
            if not isinstance(model, str) or not model:
                raise ValueError(f"{at}.tinker_id: expected the model's name, got {model!r}")
            entries.append(
                _entry(
                    model,
                    {k: v for k, v in item.items() if k in PRICE_KEYS},
                    where=f"{at} ({model})",
                    complete=False,
                    skip=frozenset(),
                )
            )
    elif isinstance(data, Mapping):
        extra = sorted(set(data) - {"models"})
        if extra:
            raise ValueError(
                f"{where}: unknown top-level key(s) {extra}; expected a 'models' table"
            )
        models = data.get("models")
        if not isinstance(models, Mapping) or not models:
            raise ValueError(
                f"{where}: expected a non-empty 'models' table of model name -> prices, got "
                f"{models!r}"
            )
        for model, prices in models.items():
            at = f"{where}: models.{_toml_key(str(model))}"
            if not isinstance(prices, Mapping):
                raise ValueError(f"{at}: expected a table of prices, got {prices!r}")
            entries.append(
                _entry(str(model), prices, where=at, complete=True, skip=frozenset({"note"}))
            )
    else:
        raise ValueError(
            f"{where}: expected a 'models' table or a models.json list, got {type(data).__name__}"
        )
    seen: set[str] = set()
    for entry in entries:
        if entry.model in seen:
            raise ValueError(f"{where}: model {entry.model!r} is listed twice")
        seen.add(entry.model)
    if not entries:
        raise ValueError(f"{where}: lists no models")
    return PriceTable(entries=tuple(entries), source=where)


def cost_metrics(
    step: TokenUsage,
    cumulative: TokenUsage,
    rates: TokenCostRates,
    *,
    discarded: TokenUsage | None = None,
) -> dict[str, float]:
    """One step's `cost/*` metrics (the cookbook's `CostTracker` keys).

    Args:
        step: the step's usage (what `tokens/<kind>` reports).
        cumulative: the running totals after the step, discarded sampling included (what
            `tokens/cumulative/<kind>` reports).
        rates: the model's prices.
        discarded: the running total of discarded sampling; adds `cost/discarded_usd`.

    Returns:
        `{"cost/step_usd": ..., "cost/cumulative_usd": ...}` (+ `cost/discarded_usd`).

    Examples:
        >>> rates = TokenCostRates(prefill=1.0, cached_prefill=0.1, sample=2.0, train=2.0)
        >>> cost_metrics(TokenUsage(sampled=10**6), TokenUsage(sampled=3 * 10**6), rates)
        {'cost/step_usd': 2.0, 'cost/cumulative_usd': 6.0}
    """
    metrics = {
        "cost/step_usd": rates.estimate_usd(step),
        "cost/cumulative_usd": rates.estimate_usd(cumulative),
    }
    if discarded is not None:
        metrics["cost/discarded_usd"] = rates.estimate_usd(discarded)
    return metrics


class KindCost(msgspec.Struct, frozen=True, kw_only=True):
    """One token kind of a `CostSummary`.

    Attributes:
        kind: a `TOKEN_KINDS` name.
        tokens: its count over the summarized steps.
        usd: its USD, or None without rates.
    """

    kind: str
    tokens: int
    usd: float | None


class CostSummary(msgspec.Struct, frozen=True, kw_only=True):
    """What a run's steps used and cost (`summarize_cost`).

    Attributes:
        num_steps: the steps summarized.
        kinds: one `KindCost` per token kind, in `TOKEN_KINDS` order.
        total_tokens: all kinds together.
        total_usd: the run's USD, or None without rates.
        usd_per_step: `total_usd / num_steps` (None without rates or steps).
        tokens_per_step: `total_tokens / num_steps` (0.0 without steps).
    """

    num_steps: int
    kinds: tuple[KindCost, ...]
    total_tokens: int
    total_usd: float | None
    usd_per_step: float | None
    tokens_per_step: float


def summarize_cost(
    steps: Sequence[TokenUsage],
    rates: TokenCostRates | None,
    *,
    extra: TokenUsage | None = None,
) -> CostSummary:
    """Totals of a run's per-step usage, priced by `rates` when given.

    Args:
        steps: each step's usage (`tokens/<kind>` of each metrics row).
        rates: the model's prices, or None for token counts only.
        extra: usage outside any step that the totals include (discarded sampling).

    Examples:
        >>> rates = TokenCostRates(prefill=1.0, cached_prefill=0.1, sample=2.0, train=2.0)
        >>> s = summarize_cost([TokenUsage(sampled=10**6)] * 2, rates)
        >>> (s.total_tokens, s.total_usd, s.usd_per_step)
        (2000000, 4.0, 2.0)
    """
    total = TokenUsage()
    for usage in steps:
        total += usage
    if extra is not None:
        total += extra
    counts = total.as_dict()
    by_kind = rates.usd_by_kind(total) if rates is not None else None
    kinds = tuple(
        KindCost(kind=kind, tokens=counts[kind], usd=None if by_kind is None else by_kind[kind])
        for kind in TOKEN_KINDS
    )
    total_tokens = sum(counts.values())
    total_usd = None if by_kind is None else math.fsum(by_kind.values())
    n = len(steps)
    return CostSummary(
        num_steps=n,
        kinds=kinds,
        total_tokens=total_tokens,
        total_usd=total_usd,
        usd_per_step=None if total_usd is None or n == 0 else total_usd / n,
        tokens_per_step=total_tokens / n if n else 0.0,
    )
