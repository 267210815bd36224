"""`tinker_cookbook.utils.cost_estimation`: token counts and their USD, for a training loop.

The cookbook 0.6.1 names over the project's cost accounting: USD is `rlpure.cost`'s
(`TokenCostRates.estimate_usd`), a `models.json` entry is read by `rlpure.cost.parse_price_table`
and a saved `models.json` file by `shell.cost.load_models_json`. `TokenUsage` and
`TokenCostRates` keep the cookbook's dataclass shapes (its field names, `dataclasses.asdict`
works on them, as the cookbook's `rl.train` does when it checkpoints the totals); `CostTracker`
keeps the cookbook's running totals and metric names (`tokens/<kind>`,
`tokens/cumulative/<kind>`, `tokens/discarded/<kind>`, `cost/step_usd`, `cost/cumulative_usd`,
`cost/discarded_usd`).

Deliberate differences: this project never fetches prices. `load_model_pricing` /
`fetch_model_pricing` read `url` when it names a local file (a saved `models.json`, a path or
`file://`), and otherwise log once that prices are not fetched and return None, which is what
the cookbook does when its download fails: the run logs token counts only. USD sums the four
kinds with `math.fsum` (the cookbook adds them left to right: the last bits may differ). Counts
must be >= 0 when priced.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rlpure import cost as pure_cost
from rlpure import usage as pure_usage
from shell.cost import load_models_json
from shell.errors import ConfigError

__all__ = [
    "PRICING_URL",
    "TOKENS_PER_MILLION",
    "CostTracker",
    "TokenCostRates",
    "TokenUsage",
    "fetch_model_pricing",
    "load_model_pricing",
    "rates_from_pricing_entry",
]

logger = logging.getLogger(__name__)

TOKENS_PER_MILLION = pure_cost.TOKENS_PER_MILLION
PRICING_URL = "https://tinker-docs.thinkingmachines.ai/tinker/models.json"
"""Where the cookbook downloads prices from (never fetched here; see the module docstring)."""


@dataclass(frozen=True)
class TokenUsage:
    """Billed token counts by kind (the cookbook's dataclass)."""

    sampled: int = 0
    prefill_cached: int = 0
    prefill_uncached: int = 0
    trained: int = 0

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            sampled=self.sampled + other.sampled,
            prefill_cached=self.prefill_cached + other.prefill_cached,
            prefill_uncached=self.prefill_uncached + other.prefill_uncached,
            trained=self.trained + other.trained,
        )

    def metrics(self, prefix: str) -> dict[str, int]:
        """The counts as `<prefix>/<kind>` metrics."""
        return {f"{prefix}/{kind}": count for kind, count in dataclasses.asdict(self).items()}


def _ours(usage: TokenUsage | pure_usage.TokenUsage) -> pure_usage.TokenUsage:
    if isinstance(usage, pure_usage.TokenUsage):
        return usage
    return pure_usage.TokenUsage(**dataclasses.asdict(usage))


@dataclass(frozen=True)
class TokenCostRates:
    """USD per million tokens of each billed kind (the cookbook's field names)."""

    prefill_usd_per_million: float
    cached_prefill_usd_per_million: float
    sample_usd_per_million: float
    train_usd_per_million: float

    def estimate_usd(self, usage: TokenUsage | pure_usage.TokenUsage) -> float:
        """USD of `usage`: each kind's count times its price, over one million."""
        rates = pure_cost.TokenCostRates(
            prefill=self.prefill_usd_per_million,
            cached_prefill=self.cached_prefill_usd_per_million,
            sample=self.sample_usd_per_million,
            train=self.train_usd_per_million,
        )
        return rates.estimate_usd(_ours(usage))


def rates_from_pricing_entry(entry: Mapping[str, object]) -> TokenCostRates | None:
    """The rates of one `models.json` object (`"$1.87"` prices), or None when a price is
    missing or malformed."""
    prices = {key: entry.get(key) for key in pure_cost.PRICE_KEYS}
    try:
        table = pure_cost.parse_price_table([{"tinker_id": "entry", **prices}], where="entry")
        rates = table.rates_for("entry")
    except ValueError:
        return None
    return TokenCostRates(
        prefill_usd_per_million=rates.prefill,
        cached_prefill_usd_per_million=rates.cached_prefill,
        sample_usd_per_million=rates.sample,
        train_usd_per_million=rates.train,
    )


_pricing: list[dict[str, object]] | None = None
_pricing_read = False


def _local_file(url: str) -> Path | None:
    if url.startswith("file://"):
        return Path(url.removeprefix("file://"))
    return None if "://" in url else Path(url)


def load_model_pricing(
    *, url: str = PRICING_URL, timeout: float = 5.0
) -> list[dict[str, object]] | None:
    """The `models.json` entries, read once per process from `url` when it is a local file;
    None otherwise (prices are not fetched) or when the file is unusable, logged once."""
    global _pricing, _pricing_read
    del timeout  # nothing is downloaded
    if not _pricing_read:
        _pricing_read = True
        file = _local_file(url)
        if file is None:
            logger.warning(
                "Model prices are not fetched (%s); logging token counts only. To log USD, "
                "save models.json and pass its path as url=",
                url,
            )
        else:
            try:
                _pricing = load_models_json(file)
            except ConfigError as error:
                logger.warning("%s; logging token counts only", error)
    return _pricing


def fetch_model_pricing(
    model_name: str, *, url: str = PRICING_URL, timeout: float = 5.0
) -> TokenCostRates | None:
    """The complete rates of `model_name` (its exact `tinker_id`) in the pricing entries, or
    None (no entries, model unlisted or incomplete: a warning). Never raises."""
    entries = load_model_pricing(url=url, timeout=timeout)
    if entries is None:
        return None
    for entry in entries:
        if entry.get("tinker_id") == model_name:
            rates = rates_from_pricing_entry(entry)
            if rates is None:
                logger.warning(
                    "Pricing entry for %s in %s is incomplete (%s); logging token counts only",
                    model_name,
                    url,
                    entry,
                )
                return None
            note = entry.get("note")
            logger.info("Pricing for %s: %s%s", model_name, rates, f" ({note})" if note else "")
            return rates
    logger.warning("Model %s is not listed in %s; logging token counts only", model_name, url)
    return None


class CostTracker:
    """Running token totals and their `tokens/` and `cost/` metrics (the cookbook's).

    Args:
        rates: the model's prices (None: token counts only).
        cumulative: totals already accounted for (a resumed run's).
        discarded: the part of them sampled for groups dropped before training.
    """

    def __init__(
        self,
        rates: TokenCostRates | None = None,
        *,
        cumulative: TokenUsage = TokenUsage(),
        discarded: TokenUsage = TokenUsage(),
    ) -> None:
        self.rates = rates
        self.cumulative = cumulative
        """Running totals, discarded sampling included."""
        self.discarded = discarded
        """The part of `cumulative` sampled for groups dropped before training."""
        self.step = TokenUsage()
        """The usage of the latest step recorded."""

    def record_discarded_sampling(self, usage: TokenUsage) -> None:
        """Adds a dropped group's sampling to `cumulative` and `discarded` (no step)."""
        self.cumulative += usage
        self.discarded += usage

    def cumulative_metrics(self) -> dict[str, float]:
        """`tokens/cumulative/<kind>`, `tokens/discarded/<kind>` and, with rates, their USD."""
        metrics: dict[str, float] = {
            **self.cumulative.metrics("tokens/cumulative"),
            **self.discarded.metrics("tokens/discarded"),
        }
        if self.rates is not None:
            metrics["cost/cumulative_usd"] = self.rates.estimate_usd(self.cumulative)
            metrics["cost/discarded_usd"] = self.rates.estimate_usd(self.discarded)
        return metrics

    def record_step(self, usage: TokenUsage) -> dict[str, float]:
        """Adds one step's usage; returns its `tokens/`, `tokens/cumulative/` and, with rates,
        `cost/step_usd` and `cost/cumulative_usd`."""
        self.step = usage
        self.cumulative += usage
        return self._step_metrics()

    def extend_step(self, usage: TokenUsage) -> dict[str, float]:
        """Adds usage known after the step was recorded; returns the step's metrics again."""
        self.step += usage
        self.cumulative += usage
        return self._step_metrics()

    def _step_metrics(self) -> dict[str, float]:
        metrics: dict[str, float] = {
            **self.step.metrics("tokens"),
            **self.cumulative.metrics("tokens/cumulative"),
        }
        if self.rates is not None:
            metrics["cost/step_usd"] = self.rates.estimate_usd(self.step)
            metrics["cost/cumulative_usd"] = self.rates.estimate_usd(self.cumulative)
        return metrics
