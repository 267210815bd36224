"""`tinker_cookbook.tokenizer_utils`: re-exported from `shell.tokenizers`."""

from shell.errors import (
    ConfigError,
)
from shell.tokenizers import (
    LOCAL_TOKENIZER_NAMES,
    Tokenizer,
    encode_without_special_tokens,
    get_registered_tokenizer_names,
    get_tokenizer,
    is_tokenizer_registered,
    register_tokenizer,
    unregister_tokenizer,
)

__all__ = [
    "LOCAL_TOKENIZER_NAMES",
    "ConfigError",
    "Tokenizer",
    "encode_without_special_tokens",
    "get_registered_tokenizer_names",
    "get_tokenizer",
    "is_tokenizer_registered",
    "register_tokenizer",
    "unregister_tokenizer",
]
