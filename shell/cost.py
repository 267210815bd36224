"""Price tables from files: the IO around `rlpure.cost` (TOML or JSON, USD per million tokens).

Conventions:
- A `.toml` or `.json` file holds either a `models` table (one complete entry per model, the
  keys `prefill`, `cached_prefill`, `sample`, `train`) or Tinker's `models.json` list (the file
  the cookbook downloads from the Models & Pricing page, saved by hand: this project never
  fetches prices). See `rlpure.cost.parse_price_table`.
- Every problem is one `ConfigError` line naming the file, the key and what was wrong, raised
  before a run trains (`rates_for_run`), so a typo in a price never costs a run.
- This module imports nothing of `shell.training`, so the loop may import it.

Example table (`prices.toml`)::

    [models."Qwen/Qwen3-8B"]
    prefill = 0.13
    cached_prefill = 0.026
    sample = 0.40
    train = 0.40
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

from rlpure.cost import PriceTable, TokenCostRates, parse_price_table
from shell.errors import ConfigError

__all__ = ["load_models_json", "load_price_table", "rates_for_run"]


def load_price_table(path: str | os.PathLike[str], *, option: str = "price_table") -> PriceTable:
    """Reads and checks the price table at `path`.

    Args:
        path: a `.toml` or `.json` file (see the module docstring).
        option: the option that named the file, for errors (`price_table`, `--prices`).

    Raises:
        ConfigError: a missing or unreadable file, another extension, malformed TOML/JSON, or
            a malformed table (naming the key and what was wrong).
    """
    file = Path(path)
    where = f"{option} {file}"
    if file.suffix not in (".toml", ".json"):
        raise ConfigError(f"{where}: expected a .toml or .json file")
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such file") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{where}: not UTF-8 text ({err.reason})") from None
    except OSError as err:
        raise ConfigError(f"{where}: cannot read it: {err.strerror}") from None
    try:
        data: object = tomllib.loads(text) if file.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{where}: malformed {file.suffix[1:].upper()}: {err}") from None
    try:
        return parse_price_table(data, where=where)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def load_models_json(
    path: str | os.PathLike[str], *, option: str = "url"
) -> list[dict[str, object]]:
    """Tinker's `models.json` list as decoded (a copy of the pricing file saved by hand), for
    code that reads its entries itself (the cookbook's `load_model_pricing`).

    Args:
        path: the saved file.
        option: the option that named the file, for errors.

    Raises:
        ConfigError: a missing or unreadable file, malformed JSON, or not a list of objects.
    """
    file = Path(path)
    where = f"{option} {file}"
    try:
        data: object = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{where}: cannot read it: {err}") from None
    except json.JSONDecodeError as err:
        raise ConfigError(f"{where}: malformed JSON: {err}") from None
    if not isinstance(data, list) or not all(isinstance(entry, dict) for entry in data):
        raise ConfigError(f"{where}: expected a JSON list of objects (models.json)")
    return data


def rates_for_run(
    price_table: str | os.PathLike[str] | None, model: str, *, option: str = "price_table"
) -> TokenCostRates | None:
    """The rates of `model` from the table at `price_table`, or None when no table is given.

    What the loop calls once, before its first step (`TrainConfig.price_table`,
    `TrainConfig.base_model`); `rlpure.cost.cost_metrics` then prices each step.

    Raises:
        ConfigError: the table is malformed (`load_price_table`), or lists no complete entry
            for `model` (naming the models it does list).
    """
    if price_table is None:
        return None
    table = load_price_table(price_table, option=option)
    try:
        return table.rates_for(model)
    except ValueError as err:
        raise ConfigError(str(err)) from None
