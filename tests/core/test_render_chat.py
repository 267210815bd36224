"""Tests of `rlpure.render`'s chat renderers (`chatml`, `qwen3`, `llama3`): golden layouts,
the prefix property across turns (and where qwen3 breaks it), parse(render) round trips, weights
only on the trained roles, and one-line errors naming the message and field.

All on `SpecialWordTokenizer` (control tokens as single ids, other text as bytes), so the
expected token lists are readable strings. Token-for-token agreement with the cookbook on real
BPE tokenizers is `tests/parity/test_chat_renderer_parity.py`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpure import render
from rlpure.render import (
    ChatMLRenderer,
    ContentPart,
    Llama3Renderer,
    Qwen3DisableThinkingRenderer,
    Qwen3Renderer,
    ToolCall,
    UnparsedToolCall,
)
from rlpure.render._testing import SpecialWordTokenizer

TOK = SpecialWordTokenizer()
IM_END = TOK.encode("<|im_end|>")[0]


def _text(tokens: Sequence[int] | np.ndarray) -> str:
    return TOK.decode([int(t) for t in tokens])


def _trained_text(example: render.SupervisedExample) -> str:
    tokens = example.model_input.to_ints()
    return _text([t for t, w in zip(tokens, example.weights_T, strict=True) if w == 1.0])


CALL = ToolCall(name="calculator", arguments='{"expression": "17*23"}')

TOOL_CHAT: list[dict[str, Any]] = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "17*23?"},
    {
        "role": "assistant",
        "content": [{"type": "thinking", "thinking": "use it"}, {"type": "text", "text": "ok"}],
        "tool_calls": [CALL],
    },
    {"role": "tool", "content": "391"},
    {
        "role": "assistant",
        "content": [{"type": "thinking", "thinking": "done"}, {"type": "text", "text": "391"}],
    },
]
_CALL_TEXT = (
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "17*23"}}\n</tool_call>'
)


# --- golden layouts ----------------------------------------------------------------------------


def test_qwen3_golden_tool_conversation() -> None:
    renderer = Qwen3Renderer(TOK)
    history = (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n17*23?<|im_end|>\n"
        f"<|im_start|>assistant\nok\n{_CALL_TEXT}<|im_end|>\n"  # thinking stripped, not framed
        "<|im_start|>user\n<tool_response>\n391\n</tool_response><|im_end|>\n"
    )
    prompt = renderer.build_generation_prompt(TOOL_CHAT[:-1])
    assert _text(prompt.to_ints()) == history + "<|im_start|>assistant\n"
    example = renderer.build_supervised_example(TOOL_CHAT)
    produced = "<think>\ndone\n</think>\n\n391<|im_end|>"
    assert _text(example.model_input.to_ints()) == history + "<|im_start|>assistant\n" + produced
    assert _trained_text(example) == produced
    assert renderer.get_stop_sequences() == (IM_END,)
    # The turn that called the tool is framed when it is the one being produced.
    calling = renderer.build_supervised_example(TOOL_CHAT[:3])
    assert _trained_text(calling) == f"<think>\nuse it\n</think>\n\nok\n{_CALL_TEXT}<|im_end|>"


def test_qwen3_disable_thinking_prompt_closes_the_block_and_does_not_train_it() -> None:
    renderer = Qwen3DisableThinkingRenderer(TOK)
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    prompt = _text(renderer.build_generation_prompt(chat[:1]).to_ints())
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    example = renderer.build_supervised_example(chat)
    assert _text(example.model_input.to_ints()) == prompt + "hello<|im_end|>"
    assert _trained_text(example) == "hello<|im_end|>"
    with pytest.raises(ValueError, match=r"messages\[1\] reasons, but thinking is turned off"):
        renderer.build_supervised_example(
            [chat[0], {"role": "assistant", "content": [{"type": "thinking", "thinking": "x"}]}]
        )


def test_llama3_golden_layout() -> None:
    renderer = Llama3Renderer(TOK)
    chat = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
    ]
    example = renderer.build_supervised_example(chat, train_on="all_tokens")
    assert _text(example.model_input.to_ints()) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nq<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\na<|eot_id|>"
    )
    assert example.weights_T[0] == 0.0 and example.weights_T[1:].all()  # BOS never trained
    assert renderer.parse_response(TOK.encode("a<|eot_id|>")) == render.ParsedResponse(
        content="a", termination="stop_sequence"
    )


def test_chatml_golden_layout_with_a_default_system_prompt() -> None:
    renderer = ChatMLRenderer(TOK, default_system_prompt="Be kind")
    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    example = renderer.build_supervised_example(chat, train_on="all_messages")
    assert _text(example.model_input.to_ints()) == (
        "<|im_start|>system\nBe kind<|im_end|>\n<|im_start|>user\nq<|im_end|>\n"
        "<|im_start|>assistant\na<|im_end|>"
    )
    assert _trained_text(example) == "q<|im_end|>a<|im_end|>"  # the added system is framing
    assert _text(renderer.build_generation_prompt([]).to_ints()) == "<|im_start|>assistant\n"


# --- the prefix property -----------------------------------------------------------------------

_WORDS = st.text(alphabet="ab \n{}é", max_size=5)
_ARGS = st.dictionaries(st.sampled_from("xy"), st.integers(-2, 2) | _WORDS, max_size=2)


@st.composite
def _assistant(draw: st.DrawFn, *, thinking: bool = True, tools: bool = True) -> dict[str, Any]:
    if thinking and draw(st.booleans()):
        parts = [
            {"type": "thinking", "thinking": "A" + draw(_WORDS)}
            if draw(st.booleans())
            else {"type": "text", "text": "A" + draw(_WORDS)}
            for _ in range(draw(st.integers(1, 2)))
        ]
        message: dict[str, Any] = {"role": "assistant", "content": parts}
    else:
        message = {"role": "assistant", "content": "A" + draw(_WORDS)}
    if tools and draw(st.booleans()):
        message["tool_calls"] = [
            ToolCall(name=draw(st.sampled_from(["calc", "f"])), arguments=json.dumps(draw(_ARGS)))
            for _ in range(draw(st.integers(1, 2)))
        ]
    return message


@st.composite
def chats(
    draw: st.DrawFn, *, thinking: bool = True, tools: bool = True, user_first: bool = True
) -> list[dict[str, Any]]:
    """Multi-turn chats; a role's content carries its own capital (U, S, T, A) to count."""
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": "S" + draw(_WORDS)})
    for turn in range(draw(st.integers(1, 3))):
        if (turn == 0 and user_first) or draw(st.integers(0, 4)) > 0:
            messages.append({"role": "user", "content": "U" + draw(_WORDS)})
        assistant = draw(_assistant(thinking=thinking, tools=tools))
        messages.append(assistant)
        for _ in assistant.get("tool_calls", ()):
            messages.append({"role": "tool", "content": "T" + draw(_WORDS)})
    return messages


def _prefix_renderers() -> list[Any]:
    return [
        ChatMLRenderer(TOK),
        ChatMLRenderer(TOK, default_system_prompt="D"),
        Llama3Renderer(TOK),
        Qwen3Renderer(TOK, strip_thinking_from_history=False),
        Qwen3DisableThinkingRenderer(TOK, strip_thinking_from_history=False),
    ]


@settings(max_examples=40, deadline=None)
@given(messages=chats(), which=st.integers(0, 4))
def test_each_turn_extends_the_previous_turns_tokens(messages, which) -> None:
    renderer = _prefix_renderers()[which]
    if isinstance(renderer, Llama3Renderer):
        messages = [_plain(m) for m in messages if m["role"] != "tool"]
    assert renderer.has_extension_property
    assistants = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    final = renderer.build_generation_prompt(messages).to_ints()
    for k in assistants:
        try:
            episode = renderer.build_supervised_example(messages[: k + 1]).model_input.to_ints()
        except ValueError:  # thinking off and this turn reasons: refused, not rendered
            assert renderer.disables_thinking
            continue
        prompt = renderer.build_generation_prompt(messages[:k]).to_ints()
        # The turn's tokens follow its prompt and end at the stop token ...
        assert episode[: len(prompt)] == prompt and episode[-1] in renderer.get_stop_sequences()
        # ... and every later prompt starts with them: one datum covers the episode.
        assert final[: len(episode)] == episode


def _plain(message: dict[str, Any]) -> dict[str, Any]:
    content = message["content"]
    if not isinstance(content, str):
        content = "".join(p.get("text", p.get("thinking", "")) for p in content)
    return {"role": message["role"], "content": content}


def test_qwen3_breaks_the_prefix_property_where_it_strips_thinking() -> None:
    renderer = Qwen3Renderer(TOK)
    assert not renderer.has_extension_property
    turn = renderer.build_supervised_example(TOOL_CHAT[:3]).model_input.to_ints()
    later = renderer.build_generation_prompt(TOOL_CHAT[:4]).to_ints()
    split = next(i for i, (a, b) in enumerate(zip(turn, later, strict=False)) if a != b)
    # Shared up to the produced turn's header; then the sampled `<think>` is gone from history.
    assert _text(turn[:split]).endswith("<|im_start|>assistant\n")
    assert _text(turn[split:]).startswith("<think>\nuse it\n</think>")
    assert _text(later[split:]).startswith("ok\n<tool_call>")
    # Without stripping, the same episode is one datum.
    keeping = Qwen3Renderer(TOK, strip_thinking_from_history=False)
    turn = keeping.build_supervised_example(TOOL_CHAT[:3]).model_input.to_ints()
    assert keeping.build_generation_prompt(TOOL_CHAT[:4]).to_ints()[: len(turn)] == turn


def test_qwen3_keeping_thinking_still_breaks_for_an_assistant_turn_before_any_user() -> None:
    # The template frames only turns after a user message, so a turn written before the first
    # user message renders differently once one follows (the cookbook's rule, kept).
    renderer = Qwen3Renderer(TOK, strip_thinking_from_history=False)
    chat = [{"role": "assistant", "content": "A"}, {"role": "user", "content": "U"}]
    turn = renderer.build_supervised_example(chat[:1]).model_input.to_ints()
    later = renderer.build_generation_prompt(chat).to_ints()
    assert later[: len(turn)] != turn


# --- parse(render) round trips -----------------------------------------------------------------


def _merged(parts: Sequence[ContentPart] | str) -> list[tuple[str, str]]:
    """Parts with adjacent text merged and empty ones dropped (what rendering preserves)."""
    if isinstance(parts, str):
        parts = [{"type": "text", "text": parts}]
    out: list[tuple[str, str]] = []
    for part in parts:
        kind, value = part["type"], part["text"] if part["type"] == "text" else part["thinking"]
        if not value:
            continue
        if out and kind == "text" and out[-1][0] == "text":
            out[-1] = ("text", out[-1][1] + value)
        else:
            out.append((kind, value))
    return out


@settings(max_examples=60, deadline=None)
@given(message=_assistant())
def test_chatml_parse_inverts_render(message) -> None:
    renderer = ChatMLRenderer(TOK)
    chat = [{"role": "user", "content": "U"}, message]
    prompt = renderer.build_generation_prompt(chat[:1]).to_ints()
    response = renderer.build_supervised_example(chat).model_input.to_ints()[len(prompt) :]
    parsed = renderer.parse_response(response)
    assert parsed.termination == "stop_sequence"
    assert parsed.tool_calls == tuple(message.get("tool_calls", ()))
    assert parsed.unparsed_tool_calls == ()
    assert _merged(parsed.parts if parsed.parts is not None else parsed.content) == _merged(
        message["content"]
    )


@settings(max_examples=60, deadline=None)
@given(message=_assistant(), thinking_off=st.booleans())
def test_qwen3_tool_calls_survive_render_then_parse(message, thinking_off) -> None:
    renderer = Qwen3DisableThinkingRenderer(TOK) if thinking_off else Qwen3Renderer(TOK)
    chat = [{"role": "user", "content": "U"}, message]
    try:
        tokens = renderer.build_supervised_example(chat).model_input.to_ints()
    except ValueError:  # thinking off and the turn reasons
        assert thinking_off
        return
    prompt = renderer.build_generation_prompt(chat[:1]).to_ints()
    parsed = renderer.parse_response(tokens[len(prompt) :])
    assert parsed.termination == "stop_sequence"
    assert parsed.tool_calls == tuple(message.get("tool_calls", ()))
    if not isinstance(message["content"], str):
        thinking = [
            p["thinking"].strip("\n") for p in message["content"] if p["type"] == "thinking"
        ]
        assert [p["thinking"] for p in parsed.parts or () if p["type"] == "thinking"] == [
            t for t in thinking if t
        ]


def test_parse_response_reports_bad_tool_calls_as_content_failures() -> None:
    renderer = ChatMLRenderer(TOK)
    parsed = renderer.parse_response(
        TOK.encode(
            'Let me.\n<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>\n'
            "<tool_call>\n{oops}\n</tool_call>\n<tool_call>\n"
            '{"name": "ok", "arguments": {"a": 1}}<|im_end|>'
        )
    )
    assert parsed.termination == "stop_sequence"
    # An unterminated block stays in the text (and is reported below), as in the cookbook.
    assert parsed.content == 'Let me.<tool_call>\n{"name": "ok", "arguments": {"a": 1}}'
    assert parsed.tool_calls == ()
    errors = [call.error for call in parsed.unparsed_tool_calls]
    assert errors[0] == "Missing or invalid 'arguments' field"
    assert errors[1].startswith("Invalid JSON: ")
    assert errors[2].startswith("unterminated tool block")
    assert isinstance(parsed.unparsed_tool_calls[2], UnparsedToolCall)
    truncated = renderer.parse_response(TOK.encode("<tool_call>\n{"))
    assert truncated.termination == "malformed" and truncated.unparsed_tool_calls == ()
    with pytest.raises(ValueError, match=r"2 stop tokens \(\d+\) in one response"):
        renderer.parse_response(TOK.encode("a<|im_end|>b<|im_end|>"))


# --- weights only on the trained roles ---------------------------------------------------------

_MODES = [m for m in render._types.TRAIN_ON if m != "all_tokens"]
_LETTER = {"user": "U", "system": "S", "tool": "T"}


def _trained_roles(mode: str) -> set[str]:
    return {
        "all_messages": {"user", "system", "tool", "assistant"},
        "all_user_and_system_messages": {"user", "system"},
    }.get(mode, {"assistant"})


@settings(max_examples=60, deadline=None)
@given(
    messages=chats(user_first=False),
    mode=st.sampled_from(_MODES),
    which=st.integers(0, 4),
    flags=st.lists(st.booleans(), min_size=12, max_size=12),
)
def test_weights_fall_only_on_the_trained_roles(messages, mode, which, flags) -> None:
    renderer = [
        ChatMLRenderer(TOK),
        Qwen3Renderer(TOK),
        Qwen3Renderer(TOK, strip_thinking_from_history=False),
        Qwen3DisableThinkingRenderer(TOK),
        Llama3Renderer(TOK),
    ][which]
    if isinstance(renderer, Llama3Renderer):
        messages = [_plain(m) for m in messages]
    trainable = flags[: len(messages)] if mode == "customized" else None
    try:
        example = renderer.build_supervised_example(messages, train_on=mode, trainable_M=trainable)
    except ValueError:  # qwen3_disable_thinking refuses a trained turn that reasons
        assert renderer.disables_thinking
        return
    text = _trained_text(example)
    for role, letter in _LETTER.items():
        if mode == "customized":
            expected = sum(
                str(m["content"]).count(letter)
                for m, f in zip(messages, trainable or [], strict=True)
                if m["role"] == role and f
            )
        elif role in _trained_roles(mode):
            expected = sum(str(m["content"]).count(letter) for m in messages if m["role"] == role)
        else:
            expected = 0
        assert text.count(letter) == expected, (role, mode)
    assistant_trained = mode == "customized" or "assistant" in _trained_roles(mode)
    if not assistant_trained:
        assert "A" not in text
    if mode == "last_assistant_message" and messages[-1]["role"] != "assistant":
        assert text == ""


# --- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("messages", "error", "match"),
    [
        ([{"role": "narrator", "content": "x"}], ValueError, r"messages\[0\]\['role'\]: unknown"),
        ([{"role": "user", "content": 3}], TypeError, r"messages\[0\]\['content'\]: expected str"),
        ([{"role": "user"}], ValueError, r"messages\[0\]: missing key 'content'"),
        (
            [{"role": "user", "content": "q"}, {"role": "user", "content": [{"type": "image"}]}],
            ValueError,
            r"messages\[1\]\['content'\]\[0\]\['type'\]: unsupported content part type 'image'",
        ),
        (
            [{"role": "user", "content": [{"type": "text", "text": None}]}],
            TypeError,
            r"messages\[0\]\['content'\]\[0\]\['text'\]: expected str, got NoneType",
        ),
        (
            [{"role": "assistant", "content": "", "tool_calls": [{"name": "f"}]}],
            TypeError,
            r"messages\[0\]\['tool_calls'\]\[0\]: expected rlpure.render.ToolCall, got dict",
        ),
        (
            [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [ToolCall(name="f", arguments="{")],
                }
            ],
            ValueError,
            r"messages\[0\]\['tool_calls'\]\[0\].arguments: not valid JSON",
        ),
        (
            [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [ToolCall(name="f", arguments="[]")],
                }
            ],
            ValueError,
            r"messages\[0\]\['tool_calls'\]\[0\].arguments: expected a JSON object, got list",
        ),
        (
            [{"role": "user", "content": "", "tool_calls": [CALL]}],
            ValueError,
            r"messages\[0\]\['tool_calls'\]: only assistant messages call tools",
        ),
        ("hello", TypeError, r"messages: expected a sequence of message mappings, got str"),
    ],
)
def test_bad_messages_get_one_line_errors_naming_index_and_field(messages, error, match) -> None:
    for renderer in (ChatMLRenderer(TOK), Qwen3Renderer(TOK)):
        with pytest.raises(error, match=match) as info:
            renderer.build_generation_prompt(messages)
        assert "\n" not in str(info.value)


def test_llama3_refuses_tool_calls_and_thinking_by_message() -> None:
    renderer = Llama3Renderer(TOK)
    with pytest.raises(ValueError, match=r"messages\[1\]\['tool_calls'\]: this format has no"):
        renderer.build_generation_prompt(
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "", "tool_calls": [CALL]},
            ]
        )
    with pytest.raises(ValueError, match=r"messages\[0\]\['content'\]\[0\]\['type'\]"):
        renderer.build_generation_prompt(
            [{"role": "assistant", "content": [{"type": "thinking", "thinking": "x"}]}]
        )


def test_chat_renderers_need_their_control_tokens_as_single_tokens() -> None:
    plain = SpecialWordTokenizer(["<|endoftext|>"])
    for make in (ChatMLRenderer, Qwen3Renderer, Llama3Renderer):
        with pytest.raises(ValueError, match=r"encodes '<\|(im_end|eot_id)\|>' as \d+ tokens"):
            make(plain)


def test_get_renderer_knows_the_chat_formats() -> None:
    assert set(render.RENDERER_NAMES) == {
        "role_colon",
        "chatml",
        "smollm2",
        "qwen3",
        "qwen3_disable_thinking",
        "qwen3_instruct",
        "llama3",
    }
    smol = render.get_renderer("smollm2", TOK)
    assert isinstance(smol, ChatMLRenderer)
    assert smol.default_system_prompt == render.SMOLLM2_DEFAULT_SYSTEM_PROMPT
    assert isinstance(
        render.get_renderer("qwen3_disable_thinking", TOK), Qwen3DisableThinkingRenderer
    )


def test_tools_system_prompt_declares_each_tool_on_one_line() -> None:
    spec = {"name": "calc", "description": "d", "parameters": {"type": "object"}}
    text = render.tools_system_prompt([spec], "Be terse.")
    assert text.startswith("Be terse.\n\n# Tools\n")
    assert '{"type": "function", "function": {"name": "calc", "description": "d", ' in text
    assert render.tools_system_prompt([], "Be terse.") == "Be terse."
