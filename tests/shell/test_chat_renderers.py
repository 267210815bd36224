"""`shell.chat._qwen3`, `._llama3` and `._chatml`: the cookbook's API over `rlpure.render`.

(Token-for-token agreement with the cookbook is `tests/parity/test_chat_renderer_parity.py`;
the token maths is tested in `tests/core/test_render_chat.py`.)
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import tinker

from rlpure.render._testing import SpecialWordTokenizer
from shell.chat import (
    Message,
    ParseFailureKind,
    ParseTermination,
    ToolCall,
    ToolSpec,
    TrainOnWhat,
)
from shell.chat._base import _BUILTIN_RENDERERS
from shell.chat._chatml import SMOLLM2_DEFAULT_SYSTEM_PROMPT, ChatMLRenderer
from shell.chat._llama3 import Llama3Renderer
from shell.chat._qwen3 import (
    Qwen3DisableThinkingRenderer,
    Qwen3InstructRenderer,
    Qwen3Renderer,
)
from shell.cookbook import renderers, tokenizer_utils
from shell.cookbook.exceptions import RendererError

TOK = SpecialWordTokenizer()
CALL = ToolCall(function=ToolCall.FunctionBody(name="calculator", arguments='{"e": "1+1"}'))


def test_cookbook_names_give_the_cookbook_classes() -> None:
    assert type(renderers.get_renderer("qwen3", TOK)) is Qwen3Renderer
    assert type(renderers.get_renderer("qwen3_disable_thinking", TOK)) is (
        Qwen3DisableThinkingRenderer
    )
    assert type(renderers.get_renderer("qwen3_instruct", TOK)) is Qwen3InstructRenderer
    assert type(renderers.get_renderer("llama3", TOK)) is Llama3Renderer
    smol = renderers.get_renderer("smollm2", TOK)
    assert isinstance(smol, ChatMLRenderer)
    assert smol.default_system_prompt == SMOLLM2_DEFAULT_SYSTEM_PROMPT
    assert renderers.Qwen3Renderer is Qwen3Renderer
    assert not renderers.get_renderer("qwen3", TOK).has_extension_property
    assert renderers.get_renderer("chatml", TOK).has_extension_property
    assert renderers.get_renderer("qwen3_disable_thinking", TOK).disables_thinking


def test_prompts_are_tinker_model_inputs_with_prefill() -> None:
    renderer = renderers.get_renderer("qwen3", TOK)
    prompt = renderer.build_generation_prompt(
        [{"role": "user", "content": "hi"}], prefill="<think>\n"
    )
    assert isinstance(prompt, tinker.ModelInput)
    assert TOK.decode(prompt.to_ints()) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )
    assert renderer.get_stop_sequences() == [TOK.encode("<|im_end|>")[0]]


def test_parse_response_gives_the_cookbooks_message_shape() -> None:
    renderer = renderers.get_renderer("qwen3", TOK)
    tokens = TOK.encode(
        '<think>\nhm\n</think>\n\nok\n<tool_call>\n{"name": "calculator", "arguments": '
        '{"e": "1+1"}}\n</tool_call><|im_end|>'
    )
    message, termination = renderer.parse_response(tokens)
    assert termination is ParseTermination.STOP_SEQUENCE
    assert message == {
        "role": "assistant",
        "content": [{"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "ok\n"}],
        "tool_calls": [CALL],
    }
    assert message["tool_calls"][0].function.name == "calculator"
    plain, _ = renderer.parse_response(TOK.encode("4<|im_end|>"))
    assert plain == {"role": "assistant", "content": "4"}
    bad, termination = renderer.parse_response(
        TOK.encode("<tool_call>\n{x}\n</tool_call><|im_end|>")
    )
    failure = renderers.classify_parse_failure(bad, termination)
    assert failure is not None and failure[0] is ParseFailureKind.CONTENT
    assert failure[1].startswith("Invalid JSON")
    truncated, termination = renderer.parse_response(np.asarray(TOK.encode("<think>mid")))
    assert termination is ParseTermination.MALFORMED and truncated["content"] == "<think>mid"


def test_tool_calls_in_messages_render_from_the_shells_tool_call() -> None:
    renderer = renderers.get_renderer("chatml", TOK)
    messages: list[Message] = [
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "content": "2", "tool_call_id": "c1", "name": "calculator"},
    ]
    text = TOK.decode(renderer.build_generation_prompt(messages).to_ints())
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "calculator", "arguments": {"e": "1+1"}}'
        in text
    )
    assert "<|im_start|>tool\n2<|im_end|>" in text


def test_supervised_examples_read_trainable_flags_only_when_customized() -> None:
    renderer = renderers.get_renderer("llama3", TOK)
    messages: list[Message] = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
    ]
    tokens, weights = renderer.build_supervised_example(messages)
    assert isinstance(tokens, tinker.ModelInput) and weights.dtype == np.float32
    assert TOK.decode([t for t, w in zip(tokens.to_ints(), weights, strict=True) if w]) == (
        "a<|eot_id|>"
    )
    flagged: list[Message] = [
        {**messages[0], "trainable": True},
        {**messages[1], "trainable": False},
    ]
    _, custom = renderer.build_supervised_example(flagged, TrainOnWhat.CUSTOMIZED)
    assert TOK.decode([t for t, w in zip(tokens.to_ints(), custom, strict=True) if w]) == (
        "q<|eot_id|>"
    )
    with pytest.raises(RendererError, match=r"messages\[0, 1\] carry 'trainable' flags"):
        renderer.build_supervised_example(flagged)
    with pytest.raises(RendererError, match="unknown train_on_what 'everything'"):
        renderer.build_supervised_example(messages, "everything")


def test_core_errors_are_renderer_errors_naming_the_message() -> None:
    qwen3 = renderers.get_renderer("qwen3", TOK)
    with pytest.raises(RendererError, match=r"messages\[1\]\['role'\]: unknown role 'bot'"):
        qwen3.build_generation_prompt(
            [{"role": "user", "content": "q"}, {"role": "bot", "content": "a"}]
        )
    with pytest.raises(
        RendererError, match=r"messages\[0\]\['tool_calls'\]\[0\]: expected a ToolCall"
    ):
        qwen3.build_generation_prompt(
            [{"role": "assistant", "content": "", "tool_calls": [{}]}]  # type: ignore[list-item]
        )
    with pytest.raises(RendererError, match=r"messages\[1\]\['tool_calls'\]: this format has no"):
        renderers.get_renderer("llama3", TOK).build_generation_prompt(
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "", "tool_calls": [CALL]},
            ]
        )
    with pytest.raises(RendererError, match="2 stop tokens"):
        qwen3.parse_response(TOK.encode("a<|im_end|><|im_end|>"))
    with pytest.raises(RendererError, match="thinking is turned off"):
        renderers.get_renderer("qwen3_disable_thinking", TOK).build_supervised_example(
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "x"}]},
            ]
        )


def test_tool_declarations() -> None:
    spec: ToolSpec = {
        "name": "calculator",
        "description": "adds",
        "parameters": {"type": "object"},
    }
    (system,) = renderers.get_renderer("qwen3", TOK).create_conversation_prefix_with_tools(
        [spec], "Be terse."
    )
    content = system["content"]
    assert system["role"] == "system" and isinstance(content, str)
    assert content.startswith("Be terse.\n\n# Tools")
    with pytest.raises(NotImplementedError, match="Llama3Renderer does not support tool calling"):
        renderers.get_renderer("llama3", TOK).create_conversation_prefix_with_tools([spec])


def test_chat_renderers_pickle_by_name() -> None:
    tokenizer_utils.register_tokenizer("Test/special-words", TOK)
    try:
        for name in _BUILTIN_RENDERERS:
            if name == "role_colon":
                continue
            renderer = renderers.get_renderer(name, TOK, model_name="Test/special-words")
            clone = pickle.loads(pickle.dumps(renderer))
            assert type(clone) is type(renderer)
            messages: list[Message] = [{"role": "user", "content": "hi"}]
            assert (
                clone.build_generation_prompt(messages).to_ints()
                == renderer.build_generation_prompt(messages).to_ints()
            )
    finally:
        tokenizer_utils.unregister_tokenizer("Test/special-words")
