"""A training run's `user_metadata`: what a recipe attaches to its service, read back by path.

Conventions:
- `user_metadata` is the `dict[str, str]` a `ServiceClient` is opened with; the service keeps
  it on every training run it creates (Tinker's `TrainingRun.user_metadata`; the local
  backend records it in each checkpoint), so a checkpoint path leads back to it through the
  REST client's `get_training_run_by_tinker_path`.
- A recipe's metadata is `{"recipe_name": ..., "git_rev": ...}` (tinker-cookbook 0.6.1's
  `recipe_user_metadata` keys); `git_rev` names the code that ran, here this project's
  installed version (the cookbook writes its own version).
- The renderer a run trained with is stored under `RENDERER_NAME_METADATA_KEY`, so a run
  started from its checkpoint can render prompts the same way. Reading it never raises for a
  checkpoint the service does not know or cannot reach: the lookup logs a warning and gives
  None, as the cookbook's `get_renderer_name_from_checkpoint`.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Mapping
from typing import Any, Protocol

import tinker

__all__ = [
    "RENDERER_NAME_METADATA_KEY",
    "check_checkpoint_renderer",
    "checkpoint_renderer_name",
    "checkpoint_renderer_name_async",
    "code_version",
    "recipe_metadata",
    "renderer_metadata",
]

logger = logging.getLogger(__name__)

RENDERER_NAME_METADATA_KEY = "renderer_name"
"""The `user_metadata` key of the renderer a run trained with (the cookbook's)."""

_LOOKUP_ERRORS = (tinker.TinkerError, ValueError)
"""What a failed lookup raises: the SDK's errors, a path the service refuses (the local
backend's `LocalLookupError` is a `ValueError`)."""


class _RestClient(Protocol):
    def get_training_run_by_tinker_path(self, tinker_path: str) -> Any: ...


class _Service(Protocol):
    def create_rest_client(self) -> Any: ...


def code_version() -> str:
    """This project's installed version (`"0.1.0"`), or `"unknown"` when not installed."""
    try:
        return importlib.metadata.version("rlpure")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def recipe_metadata(recipe_name: str) -> dict[str, str]:
    """The `user_metadata` of a recipe's service: its name and the code's version.

    Examples:
        >>> recipe_metadata("math_rl")["recipe_name"]
        'math_rl'
    """
    return {"recipe_name": recipe_name, "git_rev": code_version()}


def renderer_metadata(renderer_name: str | None) -> dict[str, str]:
    """The `user_metadata` entry recording `renderer_name` (none for None or "").

    Examples:
        >>> renderer_metadata("qwen3"), renderer_metadata(None)
        ({'renderer_name': 'qwen3'}, {})
    """
    return {RENDERER_NAME_METADATA_KEY: renderer_name} if renderer_name else {}


def _renderer_of(run: Any) -> str | None:
    metadata: Mapping[str, str] = getattr(run, "user_metadata", None) or {}
    return metadata.get(RENDERER_NAME_METADATA_KEY)


def _warn_lookup_failed(checkpoint_path: str, error: BaseException) -> None:
    logger.warning(
        "Could not fetch renderer metadata for checkpoint %s: %s", checkpoint_path, error
    )


def checkpoint_renderer_name(service_client: _Service, checkpoint_path: str) -> str | None:
    """The renderer recorded in the metadata of the run that saved `checkpoint_path`, or None
    (none recorded, or the lookup failed: logged as a warning)."""
    try:
        rest_client: _RestClient = service_client.create_rest_client()
        run = rest_client.get_training_run_by_tinker_path(checkpoint_path).result()
    except _LOOKUP_ERRORS as error:
        _warn_lookup_failed(checkpoint_path, error)
        return None
    return _renderer_of(run)


async def checkpoint_renderer_name_async(
    service_client: _Service, checkpoint_path: str
) -> str | None:
    """`checkpoint_renderer_name`, awaiting the REST call."""
    try:
        rest_client: _RestClient = service_client.create_rest_client()
        run = await rest_client.get_training_run_by_tinker_path(checkpoint_path)
    except _LOOKUP_ERRORS as error:
        _warn_lookup_failed(checkpoint_path, error)
        return None
    return _renderer_of(run)


def check_checkpoint_renderer(checkpoint_path: str, *, expected: str, recorded: str | None) -> bool:
    """Logs whether the renderer `recorded` for `checkpoint_path` is the `expected` one: info
    when it is or none is recorded, a warning on a mismatch.

    Returns:
        False on a mismatch, else True.
    """
    if recorded is None:
        logger.info("Checkpoint %s has no renderer metadata.", checkpoint_path)
        return True
    if recorded != expected:
        logger.warning(
            "Renderer mismatch for checkpoint %s: checkpoint=%s current=%s",
            checkpoint_path,
            recorded,
            expected,
        )
        return False
    logger.info("Renderer metadata matches for checkpoint %s: %s", checkpoint_path, expected)
    return True
