"""Model metadata with tinker-cookbook 0.6.1's API (`tinker_cookbook.model_info`).

Conventions:
- A model name is `"org/Model"`, optionally with a `:checkpoint` suffix (dropped before lookup).
- The local models (`rlpure/tiny`, `rlpure/small`, any `rlpure.model.MODEL_CONFIGS` name) are
  base models with the byte tokenizer: they recommend `role_colon`.
- For Tinker's models the table below records what tinker-cookbook 0.6.1 documents for each
  (its organization, version, size, chat or base, recommended renderers — the first is the
  default — and input modalities). Base models recommend `role_colon`; chat models their chat
  template's renderer. Recommending a name does not mean `shell.chat` offers it yet (so
  far only `role_colon`; see `shell.chat.get_renderer`).
- Errors as the cookbook's: a name without `/` is a `ValueError`, an unknown organization a
  `ConfigurationError` (`shell.errors.ConfigError`), an unknown model of a known organization a
  `KeyError`.
"""

from __future__ import annotations

import logging

import msgspec

from shell.errors import ConfigError

__all__ = [
    "ModelAttributes",
    "get_model_attributes",
    "get_recommended_renderer_name",
    "get_recommended_renderer_names",
    "warn_if_renderer_not_recommended",
]

logger = logging.getLogger(__name__)


class ModelAttributes(msgspec.Struct, frozen=True):
    """What training code needs to know about a model to pick defaults.

    Attributes:
        organization: the provider (`"Qwen"`, `"meta-llama"`, `"rlpure"`).
        version_str: the model version (`"3"`, `"3.1"`, `"K2.5"`).
        size_str: the size (`"8B"`, `"30B-A3B"`).
        is_chat: whether the model is chat/instruct-tuned.
        recommended_renderers: compatible renderer names, the most recommended first.
        is_vl: whether the model takes images.
        is_audio_in: whether the model takes audio.
    """

    organization: str
    version_str: str
    size_str: str
    is_chat: bool
    recommended_renderers: tuple[str, ...]
    is_vl: bool = False
    is_audio_in: bool = False


_BASE = ("role_colon",)
_QWEN3 = ("qwen3", "qwen3_disable_thinking")
_QWEN3_5 = ("qwen3_5", "qwen3_5_disable_thinking", "qwen3_5_preserve_thinking")
_QWEN3_8 = (
    "qwen3_8_xhigh_reasoning",
    "qwen3_8_disable_thinking",
    "qwen3_8_medium_reasoning",
    "qwen3_8_low_reasoning",
)
_DEEPSEEK_V4_1 = (
    "deepseekv4_1",
    "deepseekv4_1_low_reasoning",
    "deepseekv4_1_max_reasoning",
    "deepseekv4_1_disable_thinking",
    "deepseekv4_1_preserve_thinking",
)
_NEMOTRON3 = ("nemotron3", "nemotron3_disable_thinking", "nemotron3_preserve_thinking")
_NEMOTRON3_SUPER = (*_NEMOTRON3, "nemotron3_low_thinking")
_NEMOTRON3_ULTRA = (
    "nemotron3_ultra",
    "nemotron3_ultra_disable_thinking",
    "nemotron3_ultra_medium_thinking",
    "nemotron3_ultra_preserve_thinking",
)
_DEEPSEEK_V3 = ("deepseekv3", "deepseekv3_thinking")
_GPT_OSS = ("gpt_oss_no_sysprompt", "gpt_oss_medium_reasoning")
_KIMI_K25 = ("kimi_k25", "kimi_k25_disable_thinking")
_KIMI_K26 = ("kimi_k26", "kimi_k26_disable_thinking", "kimi_k26_preserve_thinking")
_GLM5_3 = ("glm5_3_max_reasoning", "glm5_3_low_reasoning", "glm5_3_high_reasoning")
_NEMOTRON3_LIGHTNING = (
    "nemotron3_ultra",
    "nemotron3_ultra_disable_thinking",
    "nemotron3_ultra_preserve_thinking",
)
_KIMI_K31 = tuple(
    f"kimi_k31_pro_{mode}"
    for mode in (
        "max_reasoning",
        "high_reasoning",
        "low_reasoning",
        "disable_thinking",
        "no_reasoning_effort",
    )
)

# (name, version, size, is_chat, renderers, modalities): "vl" images, "vla" images and audio.
_ROWS: tuple[tuple[str, str, str, bool, tuple[str, ...], str], ...] = (
    ("meta-llama/Llama-3.1-8B-Instruct", "3.1", "8B", True, ("llama3",), ""),
    ("meta-llama/Llama-3.2-1B", "3.2", "1B", False, _BASE, ""),
    ("meta-llama/Llama-3.2-3B", "3.2", "3B", False, _BASE, ""),
    ("meta-llama/Llama-3.1-8B", "3.1", "8B", False, _BASE, ""),
    ("meta-llama/Llama-3.1-70B", "3.1", "70B", False, _BASE, ""),
    ("meta-llama/Llama-3.3-70B-Instruct", "3.3", "70B", True, ("llama3",), ""),
    ("Qwen/Qwen3-VL-30B-A3B-Instruct", "3", "30B-A3B", True, ("qwen3_vl_instruct",), "vl"),
    ("Qwen/Qwen3-VL-235B-A22B-Instruct", "3", "235B-A22B", True, ("qwen3_vl_instruct",), "vl"),
    ("Qwen/Qwen3-8B-Base", "3", "8B", False, _BASE, ""),
    ("Qwen/Qwen3-30B-A3B-Base", "3", "30B-A3B", False, _BASE, ""),
    ("Qwen/Qwen3-8B", "3", "8B", True, _QWEN3, ""),
    ("Qwen/Qwen3-32B", "3", "32B", True, _QWEN3, ""),
    ("Qwen/Qwen3-30B-A3B", "3", "30B-A3B", True, _QWEN3, ""),
    ("Qwen/Qwen3-4B-Instruct-2507", "3", "4B", True, ("qwen3_instruct",), ""),
    ("Qwen/Qwen3-30B-A3B-Instruct-2507", "3", "30B-A3B", True, ("qwen3_instruct",), ""),
    ("Qwen/Qwen3-235B-A22B-Instruct-2507", "3", "235B-A22B", True, ("qwen3_instruct",), ""),
    ("Qwen/Qwen3.5-4B", "3.5", "4B", True, _QWEN3_5, "vl"),
    ("Qwen/Qwen3.5-9B", "3.5", "9B", True, _QWEN3_5, "vl"),
    ("Qwen/Qwen3.5-9B-Base", "3.5", "9B", False, _BASE, "vl"),
    ("Qwen/Qwen3.5-27B", "3.5", "27B", True, _QWEN3_5, "vl"),
    ("Qwen/Qwen3.5-35B-A3B", "3.5", "35B-A3B", True, _QWEN3_5, "vl"),
    ("Qwen/Qwen3.5-35B-A3B-Base", "3.5", "35B-A3B", False, _BASE, "vl"),
    ("Qwen/Qwen3.5-397B-A17B", "3.5", "397B-A17B", True, _QWEN3_5, "vl"),
    ("Qwen/Qwen3.6-27B", "3.6", "27B", True, _QWEN3_5, "vl"),
    ("Qwen/Qwen3.6-35B-A3B", "3.6", "35B-A3B", True, _QWEN3_5, "vl"),
    ("Qwen/Qwen3.8-27B", "3.8", "27B", True, _QWEN3_8, "vl"),
    ("deepseek-ai/DeepSeek-V3.1", "3", "671B-A37B", True, _DEEPSEEK_V3, ""),
    ("deepseek-ai/DeepSeek-V3.1-Base", "3", "671B-A37B", False, _BASE, ""),
    ("deepseek-ai/DeepSeek-V4.1-Flash", "4.1", "552B-A16B", True, _DEEPSEEK_V4_1, ""),
    ("deepseek-ai/DeepSeek-V4.1-Flash-1017", "4.1", "552B-A16B", True, _DEEPSEEK_V4_1, ""),
    ("openai/gpt-oss-20b", "1", "21B-A3.6B", True, _GPT_OSS, ""),
    ("openai/gpt-oss-120b", "1", "117B-A5.1B", True, _GPT_OSS, ""),
    ("moonshotai/Kimi-K2-Thinking", "K2", "1T-A32B", True, ("kimi_k2",), ""),
    ("moonshotai/Kimi-K2.5", "K2.5", "1T-A32B", True, _KIMI_K25, "vl"),
    ("moonshotai/Kimi-K2.6", "K2.6", "1T-A32B", True, _KIMI_K26, "vl"),
    ("moonshotai/Kimi-K3.1-Pro", "K3.1", "2.8T-A104B", True, _KIMI_K31, "vl"),
    ("zai-org/GLM-5.3", "5.3", "744B-A40B", True, _GLM5_3, ""),
    ("zai-org/GLM-5.3-Flash", "5.3", "320B-A18B", True, _GLM5_3, ""),
    ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "3", "30B-A3B", True, _NEMOTRON3, ""),
    ("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16", "3", "120B-A12B", True, _NEMOTRON3_SUPER, ""),
    ("nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16", "3", "550B-A55B", True, _NEMOTRON3_ULTRA, ""),
    (
        "nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-BF16",
        "3.5",
        "30B-A3B",
        True,
        _NEMOTRON3_LIGHTNING,
        "",
    ),
    (
        "nvidia/NVIDIA-Nemotron-3.5-Super-VL-120B-A12B-BF16",
        "3.5",
        "120B-A12B",
        True,
        _NEMOTRON3_ULTRA,
        "vl",
    ),
    ("thinkingmachines/Inkling", "1", "975B-A41B", True, ("tml_v0",), "vla"),
    ("thinkingmachines/Inkling-Small", "1", "276B-A12B", True, ("tml_v0",), "vla"),
    ("thinkingmachines/Inkling-2-Small", "2", "594B-A17B", True, ("tml_v0",), "vl"),
    # Not a Tinker model: the local backend's packaged SmolLM2 (shell.local._models).
    ("HuggingFaceTB/SmolLM2-135M-Instruct", "2", "135M", True, ("smollm2", "chatml"), ""),
)

_MODELS: dict[str, ModelAttributes] = {
    name: ModelAttributes(
        name.split("/", 1)[0],
        version,
        size,
        is_chat,
        renderers,
        is_vl=modalities.startswith("vl"),
        is_audio_in=modalities == "vla",
    )
    for name, version, size, is_chat, renderers, modalities in _ROWS
}
_ORGANIZATIONS = frozenset(name.split("/", 1)[0] for name in _MODELS) - {"thinkingmachines"}


def _local_attributes(model: str) -> ModelAttributes | None:
    from rlpure.model import MODEL_CONFIGS

    if model not in MODEL_CONFIGS:
        return None
    return ModelAttributes("rlpure", "1", model.split("/", 1)[1], False, _BASE)


def get_model_attributes(model_name: str) -> ModelAttributes:
    """The metadata of `model_name`.

    Raises:
        ValueError: when the name is not `"org/Model"`.
        ConfigError: for an unknown organization (the cookbook's `ConfigurationError`).
        KeyError: for an unknown model of a known organization.

    Examples:
        >>> get_model_attributes("Qwen/Qwen3-8B:step-100").recommended_renderers
        ('qwen3', 'qwen3_disable_thinking')
    """
    model = model_name.split(":", 1)[0]
    if "/" not in model:
        raise ValueError(f"Model name must be in 'org/model' format, got {model!r}")
    organization, version = model.split("/", 1)
    if organization == "rlpure" and (local := _local_attributes(model)) is not None:
        return local
    if model in _MODELS:
        return _MODELS[model]
    if organization == "thinkingmachines" and version.startswith("Inkling"):
        # Inkling ids without an entry share the renderer and modalities (cookbook behaviour).
        return ModelAttributes(
            organization, version, version, True, ("tml_v0",), is_vl=True, is_audio_in=True
        )
    if organization in _ORGANIZATIONS:
        raise KeyError(version)
    raise ConfigError(f"Unknown model: {model}")


def get_recommended_renderer_names(model_name: str) -> list[str]:
    """The renderers designed for `model_name`, the most recommended first."""
    return list(get_model_attributes(model_name).recommended_renderers)


def get_recommended_renderer_name(model_name: str) -> str:
    """The most recommended renderer for `model_name`.

    Examples:
        >>> get_recommended_renderer_name("rlpure/tiny")
        'role_colon'
    """
    return get_recommended_renderer_names(model_name)[0]


def warn_if_renderer_not_recommended(model_name: str, renderer_name: str | None) -> None:
    """Logs a warning when `renderer_name` is not recommended for `model_name`.

    Silent when `renderer_name` is None or the model is unknown.
    """
    if renderer_name is None:
        return
    try:
        recommended = get_recommended_renderer_names(model_name)
    except (ConfigError, KeyError, ValueError):
        return
    if renderer_name not in recommended:
        logger.warning(
            "Renderer %r is not recommended for model %r. Recommended renderer(s): %s. "
            "Using an incompatible renderer can silently degrade training quality "
            "(e.g., prefilling tokens the model was never trained on).",
            renderer_name,
            model_name,
            ", ".join(repr(r) for r in recommended),
        )
