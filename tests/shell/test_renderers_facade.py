"""`shell.cookbook.renderers`, `shell.cookbook.tokenizer_utils` and `shell.cookbook.model_info`: the cookbook's API, offline.

(Token-for-token agreement with the cookbook is `tests/parity/test_renderer_parity.py`.)
"""

from __future__ import annotations

import logging
import pickle
from typing import Any

import numpy as np
import pytest
import tinker

from rlpure.model import ByteTokenizer
from shell.cookbook import model_info, renderers, tokenizer_utils
from shell.cookbook.exceptions import RendererError
from shell.cookbook.renderers import Message, ParseTermination, TrainOnWhat
from shell.errors import ConfigError

TOK = ByteTokenizer()
RENDERER = renderers.get_renderer("role_colon", TOK)


def _bytes(text: str) -> list[int]:
    return list(text.encode("utf-8"))


# --- renderers ---------------------------------------------------------------------------------


def test_generation_prompt_is_a_tinker_model_input_with_the_role_colon_layout() -> None:
    prompt = RENDERER.build_generation_prompt([{"role": "user", "content": "2+2?"}])
    assert isinstance(prompt, tinker.ModelInput)
    assert prompt.to_ints() == [TOK.bos_token_id, *_bytes("User: 2+2?\n\nAssistant:")]
    prefilled = RENDERER.build_generation_prompt([], role="user", prefill=" Hi")
    assert prefilled.to_ints() == [TOK.bos_token_id, *_bytes("User: Hi")]


def test_parse_response_returns_a_message_termination_pair() -> None:
    message, termination = RENDERER.parse_response(_bytes(" 4\n\nUser:"))
    assert message == {"role": "assistant", "content": "4"}
    assert termination is ParseTermination.STOP_SEQUENCE
    assert termination.is_stop_sequence and termination.is_clean
    result = RENDERER.parse_response([*_bytes(" 4"), TOK.eos_token_id])
    assert result.termination is ParseTermination.EOS and result.termination.is_clean
    assert not result.termination.is_stop_sequence
    assert result[0] == result.message == {"role": "assistant", "content": "4"}
    truncated = RENDERER.parse_response(np.asarray(_bytes(" the answer"), np.int32))
    assert truncated.termination == "malformed" and not truncated.termination.is_clean
    assert truncated.message["content"] == "the answer"


def test_a_blank_line_before_the_stop_sequence_is_content_unless_asked() -> None:
    tokens = _bytes(" a\n\n\n\nUser:")
    assert RENDERER.parse_response(tokens).message["content"] == "a\n\n"
    cookbook_like = renderers.RoleColonRenderer(TOK, strip_blank_line_before_stop=True)
    assert cookbook_like.parse_response(tokens).message["content"] == "a"


def test_supervised_example_weights_follow_train_on_what() -> None:
    messages: list[Message] = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
    ]
    model_input, weights = RENDERER.build_supervised_example(messages)
    assert isinstance(model_input, tinker.ModelInput) and weights.dtype == np.float32
    prompt = RENDERER.build_generation_prompt(messages[:1]).to_ints()
    assert model_input.to_ints() == prompt + _bytes(" a\n\nUser:")
    assert weights.tolist() == [0.0] * len(prompt) + [1.0] * len(" a\n\nUser:")
    _, all_tokens = RENDERER.build_supervised_example(messages, TrainOnWhat.ALL_TOKENS)
    assert all_tokens.tolist() == [0.0] + [1.0] * (len(all_tokens) - 1)  # BOS stays 0
    _, users = RENDERER.build_supervised_example(messages, "all_user_and_system_messages")
    assert users.tolist() == [0.0] * 6 + [1.0] * len(" q\n\n") + [0.0] * len(
        "Assistant: a\n\nUser:"
    )


def test_customized_reads_trainable_flags_and_other_modes_refuse_them() -> None:
    flagged: list[Message] = [
        {"role": "user", "content": "q", "trainable": True},
        {"role": "assistant", "content": "a", "trainable": False},
    ]
    _, weights = RENDERER.build_supervised_example(flagged, TrainOnWhat.CUSTOMIZED)
    assert weights.tolist() == [0.0] * 6 + [1.0] * 4 + [0.0] * len("Assistant: a\n\nUser:")
    with pytest.raises(ValueError, match=r"messages\[0, 1\] carry 'trainable'"):
        RENDERER.build_supervised_example(flagged)
    with pytest.raises(ValueError, match=r"messages\[1\] have none"):
        RENDERER.build_supervised_example(
            [flagged[0], {"role": "assistant", "content": "a"}], TrainOnWhat.CUSTOMIZED
        )
    with pytest.raises(ValueError, match="unknown train_on_what 'everything'"):
        RENDERER.build_supervised_example(flagged, "everything")


def test_content_parts_are_read_as_text_and_multimodal_content_is_refused() -> None:
    parts: list[Message] = [{"role": "user", "content": [{"type": "text", "text": "2+2?"}]}]
    assert RENDERER.build_generation_prompt(parts) == RENDERER.build_generation_prompt(
        [{"role": "user", "content": "2+2?"}]
    )
    image: list[Message] = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "x"}, {"type": "image", "image": "u"}],
        }
    ]
    with pytest.raises(RendererError, match="multimodal content with 2 parts"):
        RENDERER.build_generation_prompt(image)
    with pytest.raises(ValueError, match=r"messages\[0\]: missing key 'content'"):
        RENDERER.build_generation_prompt([{"role": "user"}])  # type: ignore[typeddict-item]


def test_content_helpers() -> None:
    thought: Message = {
        "role": "assistant",
        "content": [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "4"}],
    }
    assert renderers.get_text_content(thought) == "4"
    assert renderers.format_content_as_string(thought["content"]) == "<think>hmm</think>\n4"
    assert renderers.ensure_list("x") == [{"type": "text", "text": "x"}]
    assert renderers.classify_parse_failure(thought, ParseTermination.EOS) is None
    kind, _ = renderers.classify_parse_failure(thought, ParseTermination.MALFORMED) or (None, "")
    assert kind is renderers.ParseFailureKind.STRUCTURAL
    bad: Message = {
        "role": "assistant",
        "content": "",
        "unparsed_tool_calls": [renderers.UnparsedToolCall(raw_text="{", error="bad json")],
    }
    assert renderers.classify_parse_failure(bad, ParseTermination.STOP_SEQUENCE) == (
        renderers.ParseFailureKind.CONTENT,
        "bad json",
    )
    call = renderers.ToolCall(function=renderers.ToolCall.FunctionBody(name="f", arguments="{}"))
    assert call.type == "function" and call.id is None


def test_unknown_and_cookbook_only_renderer_names_say_what_to_do() -> None:
    with pytest.raises(RendererError, match=r"'qwen3_5' is not in rlpure yet.*tinker_cookbook"):
        renderers.get_renderer("qwen3_5", TOK)
    # qwen3 is offered now; a tokenizer without its control tokens is named.
    with pytest.raises(RendererError, match=r"encodes '<\|im_end\|>' as 10 tokens"):
        renderers.get_renderer("qwen3", TOK)
    with pytest.raises(
        RendererError,
        match=r"unknown renderer 'nope' \(supported: chatml, llama3, qwen3, .*role_colon",
    ):
        renderers.get_renderer("nope", TOK)
    assert set(renderers.COOKBOOK_RENDERER_NAMES) >= {"role_colon", "qwen3", "llama3"}


def test_registered_renderers_take_precedence_and_unregister() -> None:
    seen: list[Any] = []

    def factory(tokenizer: Any, image_processor: Any) -> renderers.Renderer:
        seen.append((tokenizer, image_processor))
        return renderers.RoleColonRenderer(tokenizer, strip_blank_line_before_stop=True)

    renderers.register_renderer("Test/colon", factory)
    try:
        assert renderers.is_renderer_registered("Test/colon")
        assert "Test/colon" in renderers.get_registered_renderer_names()
        renderer = renderers.get_renderer("Test/colon", TOK, image_processor="ip")
        assert seen == [(TOK, "ip")] and renderer._renderer_name == "Test/colon"
    finally:
        assert renderers.unregister_renderer("Test/colon")
    assert not renderers.unregister_renderer("Test/colon")


def test_renderers_pickle_by_name() -> None:
    clone = pickle.loads(pickle.dumps(RENDERER))
    assert isinstance(clone, renderers.RoleColonRenderer) and isinstance(
        clone.tokenizer, ByteTokenizer
    )
    option = renderers.RoleColonRenderer(TOK, strip_blank_line_before_stop=True)
    assert pickle.loads(pickle.dumps(option)).strip_blank_line_before_stop is True

    class Nameless:
        bos_token_id, eos_token_id = None, 0

        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            return list(text.encode())

        def decode(self, ids: Any) -> str:
            return bytes(ids).decode()

    with pytest.raises(pickle.PicklingError, match="pass model_name="):
        pickle.dumps(renderers.RoleColonRenderer(Nameless()))
    named = renderers.get_renderer("role_colon", Nameless(), model_name="rlpure/tiny")
    assert isinstance(pickle.loads(pickle.dumps(named)).tokenizer, ByteTokenizer)


# --- tokenizer_utils ---------------------------------------------------------------------------


def test_local_model_names_get_the_byte_tokenizer() -> None:
    for name in ("rlpure/tiny", "rlpure/small", "rlpure/byte", "rlpure/tiny:step-3"):
        assert isinstance(tokenizer_utils.get_tokenizer(name), ByteTokenizer)


def test_registered_tokenizers_and_factories_win() -> None:
    tok = ByteTokenizer()
    tokenizer_utils.register_tokenizer("Org/model", tok)
    tokenizer_utils.register_tokenizer("Org/factory", lambda: "made")
    # a tokenizer class is a factory (it has encode/decode as attributes: it was stored as
    # the tokenizer), and the cookbook's keyword is `factory`
    tokenizer_utils.register_tokenizer("Org/class", factory=ByteTokenizer)
    try:
        assert tokenizer_utils.get_tokenizer("Org/model") is tok
        assert tokenizer_utils.get_tokenizer("Org/factory") == "made"
        made = tokenizer_utils.get_tokenizer("Org/class")
        assert isinstance(made, ByteTokenizer) and made.encode("hi") == tok.encode("hi")
        assert tokenizer_utils.is_tokenizer_registered("Org/model")
        assert set(tokenizer_utils.get_registered_tokenizer_names()) >= {"Org/model", "Org/factory"}
    finally:
        assert tokenizer_utils.unregister_tokenizer("Org/model")
        assert tokenizer_utils.unregister_tokenizer("Org/factory")
        assert tokenizer_utils.unregister_tokenizer("Org/class")
    assert not tokenizer_utils.is_tokenizer_registered("Org/model")
    with pytest.raises(TypeError, match="expected a tokenizer"):
        tokenizer_utils.register_tokenizer("Org/bad", 3)


def test_an_unreachable_hub_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match=r"hub .* is unreachable; .*register_tokenizer"):
        tokenizer_utils.get_tokenizer("no-such-org-rlpure/no-such-model")


def test_encode_without_special_tokens() -> None:
    assert tokenizer_utils.encode_without_special_tokens(TOK, "hi") == [104, 105]


# --- model_info --------------------------------------------------------------------------------


def test_recommended_renderers() -> None:
    assert model_info.get_recommended_renderer_name("rlpure/tiny") == "role_colon"
    assert model_info.get_recommended_renderer_name("Qwen/Qwen3-8B-Base") == "role_colon"
    assert model_info.get_recommended_renderer_names("Qwen/Qwen3-8B:ckpt") == [
        "qwen3",
        "qwen3_disable_thinking",
    ]
    assert model_info.get_recommended_renderer_name("meta-llama/Llama-3.1-8B-Instruct") == "llama3"
    attributes = model_info.get_model_attributes("moonshotai/Kimi-K2.5")
    assert attributes.is_vl and attributes.is_chat and not attributes.is_audio_in
    assert model_info.get_model_attributes("thinkingmachines/Inkling-9").recommended_renderers == (
        "tml_v0",
    )


def test_model_info_errors_are_the_cookbooks() -> None:
    with pytest.raises(ValueError, match="'org/model' format"):
        model_info.get_model_attributes("tiny")
    with pytest.raises(ConfigError, match="Unknown model: Nobody/x"):
        model_info.get_model_attributes("Nobody/x")
    with pytest.raises(KeyError):
        model_info.get_model_attributes("Qwen/Qwen9")


def test_warn_if_renderer_not_recommended(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="shell.cookbook.model_info"):
        model_info.warn_if_renderer_not_recommended("rlpure/tiny", "role_colon")
        model_info.warn_if_renderer_not_recommended("Nobody/x", "qwen3")
        model_info.warn_if_renderer_not_recommended("rlpure/tiny", None)
        assert caplog.records == []
        model_info.warn_if_renderer_not_recommended("rlpure/tiny", "qwen3")
    assert "not recommended for model 'rlpure/tiny'" in caplog.text
