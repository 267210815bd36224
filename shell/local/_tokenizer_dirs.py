"""Tokenizer directories that `transformers.AutoTokenizer.from_pretrained(path)` loads offline.

The tinker SDK's `get_tokenizer()` loads the `tokenizer_id` that `get_info` returns with
`AutoTokenizer.from_pretrained`; a server without network access hands out the path of a
directory written here instead of a hub id.

Conventions:
- A `transformers.PreTrainedTokenizerFast` (what the local backend builds for real models) is
  written with its own `save_pretrained` (`tokenizer.json`, `tokenizer_config.json`, the chat
  template in `chat_template.jinja`).
- A `rlpure.model.ByteTokenizer` is written as an equivalent fast tokenizer: a byte-level BPE
  with no merges whose token for byte `b` (GPT-2's printable spelling of `b`) has id `b`, the
  special tokens `<|bos|>`, `<|eos|>`, `<|pad|>` at 256, 257, 258 (in the model's vocabulary
  too, so `vocab_size == len() == 259`), no text split before the bytes, the byte-level
  decoder, and a template that prepends BOS. `encode` (with or without special tokens, with or
  without `split_special_tokens`) and `decode` (of any ids in `[0, 259)`, invalid UTF-8 runs
  included: both write U+FFFD per maximal invalid subpart, and both drop skipped special tokens
  before joining the bytes around them) give what `ByteTokenizer`'s give. Differences:
  `convert_ids_to_tokens` spells byte tokens in GPT-2's alphabet (`"Ġ"` for a space) where
  `ByteTokenizer` writes `"<0x20>"`; text holding a lone surrogate, which `ByteTokenizer.encode`
  refuses with a `ValueError`, is encoded by Hugging Face's tokenizer (as U+FFFD's bytes).
- Writing is atomic and idempotent: the files are written into a hidden sibling
  (`.{name}.tmp-{32 hex}`) and renamed into place, an existing directory first renamed aside
  (`.{name}.old-{32 hex}`) and deleted once the new one is in place. If the directory already
  holds exactly the files that would be written (same content fingerprint), it is left as it
  is (not even its mtime changes). Writers of one directory take turns on an exclusive lock
  (`.{name}.lock` beside it, `fcntl.flock`), under which the leftovers of a writer killed
  mid-write (the hidden siblings above) are removed.
- A `tokenizer_id` must not contain `:` (the SDK's `get_info` cuts it at the first one);
  `tokenizer_dir_name` gives a folder name without one, so a path under a parent without one
  is a valid id. `transformers` is imported when a directory is first written.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from rlpure.model import BOS_ID, EOS_ID, NUM_BYTES, PAD_ID, VOCAB_SIZE, ByteTokenizer
from shell.local._checkpoints import move_into_place
from shell.local._hf_tokenizer import byte_level_alphabet

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

__all__ = ["byte_tokenizer_as_fast", "tokenizer_dir_name", "write_tokenizer_dir"]

_UNSAFE_RUN = re.compile(r"[^A-Za-z0-9._-]+")
_DOT_RUN = re.compile(r"\.{2,}")
_MAX_READABLE = 64
"""Characters of the escaped name kept before the hash (folder names stay short)."""
_HASH_HEX = 16
"""Hex digits of the name's SHA-256 appended to the folder name (64 bits)."""


def tokenizer_dir_name(base_model: str) -> str:
    """A folder name for `base_model`'s tokenizer directory: safe, and distinct per name.

    The name is the base model's name with every run of characters outside `[A-Za-z0-9._-]`
    (and every run of two or more dots) replaced by `_`, without leading or trailing `.`, `_`
    or `-`, cut to 64 characters, then `-` and 16 hex digits of the SHA-256 of the exact name
    (only the hash when nothing readable is left). It holds no `/`, `\\`, `:` or `..`, never
    starts with `.`, and distinct names get distinct folders (up to a 64-bit hash collision).

    Args:
        base_model: the base model's name (any string).

    Returns:
        The folder name.

    Raises:
        TypeError: `base_model` is not a `str`.

    Examples:
        >>> tokenizer_dir_name("HuggingFaceTB/SmolLM2-135M-Instruct")[:-17]
        'HuggingFaceTB_SmolLM2-135M-Instruct'
    """
    if not isinstance(base_model, str):
        raise TypeError(f"tokenizer_dir_name: base_model must be a str, got {type(base_model)}")
    readable = _DOT_RUN.sub("_", _UNSAFE_RUN.sub("_", base_model))
    readable = readable.strip("._-")[:_MAX_READABLE].rstrip("._-")
    digest = hashlib.sha256(base_model.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_HEX]
    return f"{readable}-{digest}" if readable else digest


def byte_tokenizer_as_fast(tokenizer: ByteTokenizer) -> PreTrainedTokenizerFast:
    """The Hugging Face fast tokenizer equivalent to `ByteTokenizer` (see the module docstring).

    Args:
        tokenizer: the byte tokenizer (stateless; its special tokens are read from it).

    Returns:
        A `PreTrainedTokenizerFast` with ids `0..255` the bytes, BOS/EOS/PAD at 256/257/258 and
        a template that prepends BOS.
    """
    from transformers import PreTrainedTokenizerFast

    specials = {
        tokenizer.bos_token: BOS_ID,
        tokenizer.eos_token: EOS_ID,
        tokenizer.pad_token: PAD_ID,
    }
    vocab = {char: byte for byte, char in enumerate(byte_level_alphabet())}
    assert len(vocab) == NUM_BYTES and not vocab.keys() & specials.keys()
    vocab.update(specials)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    # No split before the bytes: a BPE without merges gives one token per byte either way, and
    # one piece per text keeps every byte's id the byte.
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(
        [AddedToken(text, normalized=False, special=True) for text in specials]
    )
    bos = tokenizer.bos_token
    backend.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A:0", pair=f"{bos} $A:0 {bos} $B:1", special_tokens=[(bos, BOS_ID)]
    )
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend,
        bos_token=tokenizer.bos_token,
        eos_token=tokenizer.eos_token,
        pad_token=tokenizer.pad_token,
        clean_up_tokenization_spaces=False,
    )
    assert len(fast) == VOCAB_SIZE, len(fast)
    return fast


def _as_fast_tokenizer(tokenizer: Any) -> PreTrainedTokenizerFast:
    if isinstance(tokenizer, ByteTokenizer):
        return byte_tokenizer_as_fast(tokenizer)
    from transformers import PreTrainedTokenizerFast

    if isinstance(tokenizer, PreTrainedTokenizerFast):
        return tokenizer
    kind = type(tokenizer)
    raise TypeError(
        "write_tokenizer_dir: tokenizer must be a rlpure.model.ByteTokenizer or a "
        f"transformers.PreTrainedTokenizerFast, got {kind.__module__}.{kind.__qualname__}"
    )


def _fingerprint(directory: Path) -> str:
    """SHA-256 over the relative paths and contents of every file under `directory`."""
    digest = hashlib.sha256()
    for path in sorted(directory.rglob("*")):
        relative = path.relative_to(directory).as_posix().encode("utf-8", "surrogateescape")
        if path.is_symlink() or not path.is_file():
            digest.update(b"D" if path.is_dir() else b"L")
            digest.update(len(relative).to_bytes(8, "little") + relative)
            continue
        content = path.read_bytes()
        digest.update(b"F" + len(relative).to_bytes(8, "little") + relative)
        digest.update(len(content).to_bytes(8, "little") + content)
    return digest.hexdigest()


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """Holds an exclusive `flock` on `lock_path` (created if missing) for the block."""
    with open(lock_path, "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _remove_leftovers(directory: Path) -> None:
    """Removes the hidden siblings a writer of `directory` killed mid-write left (the caller
    holds the lock, so no live writer of this directory owns one)."""
    leftover = re.compile(rf"\.{re.escape(directory.name)}\.(?:tmp|old)-[0-9a-f]{{32}}")
    for path in directory.parent.iterdir():
        if leftover.fullmatch(path.name) and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)


def write_tokenizer_dir(tokenizer: Any, directory: Path) -> Path:
    """Writes `tokenizer` as a directory `AutoTokenizer.from_pretrained` loads offline.

    Atomic and idempotent (see the module docstring): a directory that already holds the same
    files is left untouched; one that differs (or any other file or link at that path) is
    replaced whole.

    Args:
        tokenizer: a `transformers.PreTrainedTokenizerFast` (saved as it is, chat template
            included) or a `rlpure.model.ByteTokenizer` (saved as its equivalent fast
            tokenizer).
        directory: where to write it; its parent is created if missing.

    Returns:
        The directory as an absolute path (a `tokenizer_id` a client in another working
        directory can load).

    Raises:
        TypeError: `tokenizer` is neither, naming its type.
        OSError: the directory or its siblings cannot be written.
    """
    fast = _as_fast_tokenizer(tokenizer)
    directory = Path(directory).absolute()
    directory.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(directory.parent / f".{directory.name}.lock"):
        _remove_leftovers(directory)
        staging = directory.parent / f".{directory.name}.tmp-{uuid.uuid4().hex}"
        try:
            staging.mkdir()
            fast.save_pretrained(str(staging))
            unchanged = (
                directory.is_dir()
                and not directory.is_symlink()
                and _fingerprint(directory) == _fingerprint(staging)
            )
            if not unchanged:
                move_into_place(staging, directory)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return directory
