"""Hugging Face fast tokenizers for real models: from a checkpoint directory or a GGUF file.

Both return a `transformers.PreTrainedTokenizerFast` (chat template, special tokens,
`encode(..., add_special_tokens=False)`, `decode`, `apply_chat_template`), which is what the
cookbook's renderers and Tinker code expect from `get_tokenizer()`.

- `tokenizer_from_directory`: `transformers.AutoTokenizer` over the directory's
  `tokenizer.json` (+ `tokenizer_config.json`, `special_tokens_map.json`), local files only.
- `tokenizer_from_gguf`: built here with `tokenizers` from the file's metadata
  (`tokenizer.ggml.*`: vocabulary, merges, token types, special token ids, `add_bos_token`,
  `tokenizer.chat_template`). transformers' own GGUF path (`AutoTokenizer.from_pretrained(dir,
  gguf_file=...)`) imports torch, which the project's install does not have, so the same
  construction is written here over `tokenizers`; `tests/parity/test_smollm2_parity.py` pins
  identical token ids against transformers' on varied text and the chat template.

Conventions: only byte-level BPE vocabularies (`tokenizer.ggml.model` `gpt2`: Llama 3, Qwen,
SmolLM) are built from GGUF; the text is split before BPE the way the vocabulary was trained
(`tokenizer.ggml.pre`, see `_PRE_TOKENIZERS`); tokens marked CONTROL become special tokens and
USER_DEFINED ones plain added tokens, so both are matched whole. Every failure the caller can
fix is a `ConfigError` naming the file and the field. `transformers` is imported when a tokenizer
is first built (importing it costs about a second), not when this module is.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gguf import TokenType
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from shell.errors import ConfigError
from shell.local._gguf import open_gguf
from shell.local._gguf_file import GGUFFile

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

__all__ = [
    "byte_level_alphabet",
    "tokenizer_from_directory",
    "tokenizer_from_gguf",
]

# Split patterns of the byte-level vocabularies (the patterns their tokenizer.json files state).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _split_then_bytes(pattern: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _smollm() -> pre_tokenizers.PreTokenizer:
    # SmolLM's tokenizer.json: digits one by one, then GPT-2's byte-level split.
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )


# `tokenizer.ggml.pre` → the pre-tokenizer its vocabulary was trained with.
_PRE_TOKENIZERS: Mapping[str, Any] = {
    "default": _gpt2,
    "gpt2": _gpt2,
    "smollm": _smollm,
    "llama3": functools.partial(_split_then_bytes, _LLAMA3_SPLIT),
    "llama-v3": functools.partial(_split_then_bytes, _LLAMA3_SPLIT),
    "llama-bpe": functools.partial(_split_then_bytes, _LLAMA3_SPLIT),
    "qwen2": functools.partial(_split_then_bytes, _QWEN2_SPLIT),
}


@functools.cache
def byte_level_alphabet() -> tuple[str, ...]:
    """GPT-2's byte-level alphabet: the printable character that spells each byte 0..255.

    Printable Latin-1 bytes (`!`..`~`, `¡`..`¬`, `®`..`ÿ`) spell themselves; the other 68
    bytes take the code points 256, 257, ... in byte order (so a space is `Ġ`, U+0120).
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    spelled = dict.fromkeys(range(256), "")
    extra = 0
    for byte in range(256):
        if byte in printable:
            spelled[byte] = chr(byte)
        else:
            spelled[byte] = chr(256 + extra)
            extra += 1
    return tuple(spelled[byte] for byte in range(256))


def tokenizer_from_directory(directory: Path) -> PreTrainedTokenizerFast:
    """The fast tokenizer of a Hugging Face checkpoint directory (local files only).

    Args:
        directory: holds `tokenizer.json` (and usually `tokenizer_config.json` with the chat
            template and special tokens).

    Returns:
        The `transformers` fast tokenizer `AutoTokenizer` builds from those files.

    Raises:
        ConfigError: no `tokenizer.json`, or transformers cannot read the files.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if not (directory / "tokenizer.json").is_file():
        raise ConfigError(
            f"{directory}: no tokenizer.json (a fast tokenizer file is required; slow "
            "sentencepiece/vocab files alone are not read)"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"{directory}: cannot load the tokenizer files ({error})") from None
    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        raise ConfigError(
            f"{directory}: transformers built a {type(tokenizer).__name__}, not a fast tokenizer"
        )
    return tokenizer


def _contents(file: GGUFFile, key: str, path: Path, *, required: bool = True) -> Any:
    if key not in file.fields:
        if required:
            raise ConfigError(f"{path}: GGUF metadata field {key!r} is missing")
        return None
    return file.fields[key]


def _token_name(tokens: Sequence[str], key: str, value: Any, path: Path) -> str | None:
    if value is None:
        return None
    if not 0 <= int(value) < len(tokens):
        raise ConfigError(
            f"{path}: GGUF metadata field {key!r} is {value}, outside the {len(tokens)} tokens"
        )
    return tokens[int(value)]


def tokenizer_from_gguf(path: Path, *, file: GGUFFile | None = None) -> PreTrainedTokenizerFast:
    """Build the fast tokenizer a GGUF file's metadata describes (byte-level BPE only).

    Args:
        path: the `.gguf` file.
        file: the file already opened (`shell.local._gguf.open_gguf`), to skip re-parsing.

    Returns:
        A `PreTrainedTokenizerFast` with the file's vocabulary, merges, special tokens (BOS,
        EOS, UNK, PAD by `tokenizer.ggml.*_token_id`) and chat template; BOS/EOS are added by
        `encode` only when `tokenizer.ggml.add_bos_token` / `add_eos_token` say so.

    Raises:
        ConfigError: a tokenizer model other than `gpt2`, an unknown `tokenizer.ggml.pre`,
            or a missing or malformed field (naming the file and the field).
    """
    from transformers import PreTrainedTokenizerFast

    if file is None:
        file = open_gguf(path)

    pre = _pre_tokenizer_name(file, path)
    tokens = list(_contents(file, "tokenizer.ggml.tokens", path))
    merges_field = _contents(file, "tokenizer.ggml.merges", path)
    types = _token_types(file, path, num_tokens=len(tokens))
    vocab = _byte_level_vocab(tokens)
    backend = _bpe_backend(
        vocab, _merge_pairs(merges_field, path), tokens=tokens, types=types, pre=pre
    )
    special = _special_tokens(file, tokens, path)
    add_bos = bool(_contents(file, "tokenizer.ggml.add_bos_token", path, required=False))
    add_eos = bool(_contents(file, "tokenizer.ggml.add_eos_token", path, required=False))
    backend.post_processor = _post_processor(
        bos=special["bos_token"] if add_bos else None,
        eos=special["eos_token"] if add_eos else None,
        vocab=vocab,
        path=path,
    )
    chat_template = _contents(file, "tokenizer.chat_template", path, required=False)
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend,
        chat_template=chat_template,
        clean_up_tokenization_spaces=False,
        **{name: token for name, token in special.items() if token is not None},
    )
    tokenizer.name_or_path = str(path)
    return tokenizer


def _pre_tokenizer_name(file: GGUFFile, path: Path) -> str:
    """The file's `tokenizer.ggml.pre` (a key of `_PRE_TOKENIZERS`), for a `gpt2` model only."""
    model = _contents(file, "tokenizer.ggml.model", path)
    if model != "gpt2":
        raise ConfigError(
            f"{path}: GGUF metadata field 'tokenizer.ggml.model' is {model!r}; only byte-level "
            "BPE ('gpt2') tokenizers are built from GGUF; load the Hugging Face checkpoint "
            "directory (its tokenizer.json) instead"
        )
    pre = _contents(file, "tokenizer.ggml.pre", path, required=False) or "default"
    if pre not in _PRE_TOKENIZERS:
        raise ConfigError(
            f"{path}: GGUF metadata field 'tokenizer.ggml.pre' is {pre!r}; known: "
            f"{', '.join(sorted(_PRE_TOKENIZERS))}"
        )
    return str(pre)


def _token_types(file: GGUFFile, path: Path, *, num_tokens: int) -> list[int]:
    """Each token's `TokenType` (`tokenizer.ggml.token_type`; default all NORMAL)."""
    types = _contents(file, "tokenizer.ggml.token_type", path, required=False)
    types = list(types) if types is not None else [int(TokenType.NORMAL)] * num_tokens
    if len(types) != num_tokens:
        raise ConfigError(
            f"{path}: GGUF metadata field 'tokenizer.ggml.token_type' has {len(types)} entries "
            f"for {num_tokens} tokens"
        )
    return types


def _byte_level_vocab(tokens: Sequence[str]) -> dict[str, int]:
    """Token spelled in the byte alphabet → id.

    A byte-level vocabulary spells every token in the byte alphabet; any token that is not (a
    few files store added tokens as raw text) is respelled from its UTF-8 bytes.
    """
    alphabet = byte_level_alphabet()
    letters = frozenset(alphabet)
    return {
        (token if set(token) <= letters else "".join(alphabet[b] for b in token.encode())): i
        for i, token in enumerate(tokens)
    }


def _merge_pairs(merges_field: Sequence[str], path: Path) -> list[tuple[str, str]]:
    """`tokenizer.ggml.merges` (`"a b"` strings) as BPE merge pairs."""
    merges = []
    for i, merge in enumerate(merges_field):
        pair = merge.split(" ")
        if len(pair) != 2:
            raise ConfigError(
                f"{path}: GGUF metadata field 'tokenizer.ggml.merges' entry {i} is {merge!r}, "
                "not two tokens separated by one space"
            )
        merges.append((pair[0], pair[1]))
    return merges


def _bpe_backend(
    vocab: dict[str, int],
    merges: list[tuple[str, str]],
    *,
    tokens: Sequence[str],
    types: Sequence[int],
    pre: str,
) -> Tokenizer:
    """The byte-level BPE `Tokenizer`; CONTROL tokens special, USER_DEFINED ones plain added."""
    letters = frozenset(byte_level_alphabet())
    backend = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
        )
    )
    backend.pre_tokenizer = _PRE_TOKENIZERS[pre]()
    backend.decoder = decoders.ByteLevel()
    control = [
        AddedToken(token, normalized=False, special=True)
        for token, kind in zip(tokens, types, strict=True)
        if kind == TokenType.CONTROL and set(token) <= letters
    ]
    backend.add_special_tokens(control)
    user_defined = [
        AddedToken(token, normalized=False, special=False)
        for token, kind in zip(tokens, types, strict=True)
        if kind == TokenType.USER_DEFINED
    ]
    backend.add_tokens(user_defined)
    return backend


def _special_tokens(file: GGUFFile, tokens: Sequence[str], path: Path) -> dict[str, str | None]:
    """`bos_token`, `eos_token`, `unk_token`, `pad_token` → the token its id field names."""
    return {
        name: _token_name(
            tokens,
            f"tokenizer.ggml.{key}",
            _contents(file, f"tokenizer.ggml.{key}", path, required=False),
            path,
        )
        for name, key in (
            ("bos_token", "bos_token_id"),
            ("eos_token", "eos_token_id"),
            ("unk_token", "unknown_token_id"),
            ("pad_token", "padding_token_id"),
        )
    }


def _post_processor(
    *, bos: str | None, eos: str | None, vocab: Mapping[str, int], path: Path
) -> processors.PostProcessor:
    def piece(token: str, field: str) -> tuple[str, int]:
        if token not in vocab:
            raise ConfigError(
                f"{path}: GGUF metadata field {field!r} names a token not in the vocabulary"
            )
        return token, vocab[token]

    head = [bos] if bos is not None else []
    tail = [eos] if eos is not None else []
    specials = [piece(t, "tokenizer.ggml.bos_token_id") for t in head] + [
        piece(t, "tokenizer.ggml.eos_token_id") for t in tail
    ]
    single = [*head, "$A:0", *tail]
    pair = [*head, "$A:0", *tail, *head, "$B:1", *tail]
    return processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=list(dict.fromkeys(specials))
    )
