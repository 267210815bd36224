"""A resolved base model: its config, and loaders for its weights and tokenizer.

`BaseModel` is what `shell.local._models.resolve_base_model` returns for a `base_model` name
and what the local service keeps, one per name, so that base weights are read once per service
and shared by every client. `open_checkpoint` opens a local path (a Hugging Face checkpoint
directory or a `.gguf` file) into one.

Conventions:
- Opening is cheap and checks what it can without reading weights: `config.json` or the GGUF
  metadata (architecture, sizes), so a bad `base_model` fails at client creation. Weights are
  read when asked (`load_tensors`, `load_params`); the tokenizer is built when asked
  (`load_tokenizer`).
- `kind` is `"toy"` for the byte-level models of `rlpure.model.MODEL_CONFIGS` (no pretrained
  weights: the service initialises them; `ByteTokenizer`), `"hf"` for a checkpoint directory,
  `"gguf"` for a GGUF file.
- Every failure the caller can fix is a `ConfigError` naming the file and the field or tensor
  (`rlpure.model`'s `ValueError`s are re-raised as `ConfigError` prefixed with the file).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec
import numpy as np

from rlpure import model as model_lib
from rlpure.model import ByteTokenizer, ModelConfig, Params
from shell.errors import ConfigError
from shell.local._gguf import GGUFCheckpoint, gguf_hf_tensors, read_gguf
from shell.local._hf import CONFIG_FILE, read_hf_config, read_hf_tensors
from shell.local._hf_tokenizer import tokenizer_from_directory, tokenizer_from_gguf

__all__ = ["BaseModel", "BaseModelKind", "open_checkpoint", "toy_base_model"]

BaseModelKind = Literal["toy", "hf", "gguf"]


class BaseModel(msgspec.Struct, frozen=True, kw_only=True):
    """A resolved `base_model`: where it comes from, its config, and how to load it.

    Attributes:
        name: the `base_model` string it was resolved from.
        kind: `"toy"`, `"hf"` (checkpoint directory) or `"gguf"` (GGUF file).
        path: the directory or file; None for a toy model.
        hf_config: the Hugging Face config (`config.json`, or built from GGUF metadata);
            None for a toy model.
        toy_config: the `ModelConfig` of a toy model; None otherwise.
        gguf: the opened GGUF file (kept open: re-opening parses its vocabulary again);
            None unless `kind == "gguf"`.
    """

    name: str
    kind: BaseModelKind
    path: Path | None = None
    hf_config: Mapping[str, Any] | None = None
    toy_config: ModelConfig | None = None
    gguf: GGUFCheckpoint | None = None

    @property
    def source(self) -> str:
        """Where the weights come from, for messages and logs."""
        return "rlpure.model.MODEL_CONFIGS (random init)" if self.path is None else str(self.path)

    def model_config(
        self,
        *,
        dtype: Literal["float32", "bfloat16"] = "float32",
        max_seq_len: int | None = None,
    ) -> ModelConfig:
        """The pure model's config (`rlpure.model.config_from_hf` of `hf_config`).

        Args:
            dtype: params dtype of a pretrained model (a toy model keeps its own config).
            max_seq_len: bounds the context (default: the checkpoint's
                `max_position_embeddings`).

        Raises:
            ConfigError: `rlpure.model` refuses a field (the message names the file).
        """
        if self.toy_config is not None:
            return self.toy_config
        assert self.hf_config is not None
        try:
            return model_lib.config_from_hf(self.hf_config, dtype=dtype, max_seq_len=max_seq_len)
        except ValueError as error:
            raise ConfigError(f"{self._config_source()}: {error}") from None

    def _config_source(self) -> str:
        if self.kind == "hf":
            assert self.path is not None
            return str(self.path / CONFIG_FILE)
        return f"{self.path} (metadata)"

    def load_tensors(self) -> dict[str, np.ndarray]:
        """Read the pretrained weights: Hugging Face name → float32 numpy, HF layout.

        Raises:
            ConfigError: a toy model (it has no pretrained weights), or a bad checkpoint file
                (see `shell.local._hf.read_hf_tensors`, `shell.local._gguf.gguf_hf_tensors`).
        """
        if self.kind == "hf":
            assert self.path is not None and self.hf_config is not None
            return read_hf_tensors(self.path, self.hf_config)
        if self.kind == "gguf":
            assert self.gguf is not None
            return gguf_hf_tensors(self.gguf)
        raise ConfigError(f"base_model {self.name!r} is a toy model: it has no pretrained weights")

    def load_params(self, config: ModelConfig) -> Params:
        """Read the pretrained weights as the pure model's params (`rlpure.model.params_from_hf`).

        Args:
            config: from `model_config` (its dtype is the params').

        Raises:
            ConfigError: see `load_tensors`; or the tensors do not fit `config`.
        """
        tensors = self.load_tensors()
        try:
            return model_lib.params_from_hf(config, tensors)
        except ValueError as error:
            raise ConfigError(f"{self.source}: {error}") from None

    def load_tokenizer(self) -> Any:
        """The tokenizer: `ByteTokenizer` for a toy model, else a `PreTrainedTokenizerFast`.

        Raises:
            ConfigError: the tokenizer files or GGUF fields are missing or malformed.
        """
        if self.kind == "hf":
            assert self.path is not None
            return tokenizer_from_directory(self.path)
        if self.kind == "gguf":
            assert self.gguf is not None
            return tokenizer_from_gguf(self.gguf.path, file=self.gguf.file)
        return ByteTokenizer()


def toy_base_model(name: str, config: ModelConfig) -> BaseModel:
    """The `BaseModel` of a toy config (random init by the service, byte-level tokenizer)."""
    return BaseModel(name=name, kind="toy", toy_config=config)


def open_checkpoint(path: Path, *, name: str | None = None) -> BaseModel:
    """Open a local checkpoint: a Hugging Face directory, a `.gguf` file, or a directory
    holding exactly one `.gguf` file and no `config.json`.

    Args:
        path: the directory or file.
        name: the `base_model` string to record (default: `str(path)`).

    Returns:
        The `BaseModel` (config read and checked; weights not read yet).

    Raises:
        ConfigError: the path does not exist, is neither kind, or its config is malformed or
            unsupported (naming the file and the field).
    """
    path = Path(path).expanduser()
    label = str(path) if name is None else name
    if path.is_file():
        if path.suffix != ".gguf":
            raise ConfigError(
                f"{path}: not a .gguf file; pass a .gguf file or a Hugging Face checkpoint "
                "directory (config.json, *.safetensors, tokenizer.json)"
            )
        checkpoint = read_gguf(path)
        return BaseModel(
            name=label, kind="gguf", path=path, hf_config=checkpoint.hf_config, gguf=checkpoint
        )
    if not path.is_dir():
        raise ConfigError(f"{path}: no such checkpoint file or directory")
    if not (path / CONFIG_FILE).is_file():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return open_checkpoint(ggufs[0], name=label)
        if len(ggufs) > 1:
            raise ConfigError(
                f"{path}: holds {len(ggufs)} .gguf files ({', '.join(p.name for p in ggufs)}); "
                "pass one file's path"
            )
    return BaseModel(name=label, kind="hf", path=path, hf_config=read_hf_config(path))
