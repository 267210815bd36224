"""`shell.cookbook.renderers`' role_colon against tinker-cookbook 0.6.1's, token for token.

Both renderers run on the same tokenizer: the local `ByteTokenizer`, and a byte-level BPE
built offline with `tokenizers` (merges across piece boundaries, so piecewise encoding is
pinned too). Compared: generation prompts (`to_ints()`), supervised examples and their
weights in every `TrainOnWhat` mode, stop sequences, and `parse_response` message and
termination. The deliberate differences (documented in `shell.cookbook.renderers.role_colon`) each
have a test that shows the cookbook's behaviour and, where an option gives it, that the
option matches it.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlpure.model import ByteTokenizer
from shell.cookbook import renderers

# Module level, so `pytest.importorskip` (`require_cookbook()` skips inside tests only).
cb_renderers = pytest.importorskip(
    "tinker_cookbook.renderers", reason="needs tinker-cookbook 0.6.1"
)

_CORPUS = [
    "User: What is 2+2?\n\nAssistant: 4\n\nUser: and 3+3?\n\nAssistant: 6\n\n",
    "System: You are terse.\n\nUser: hello there\n\nAssistant: hi\n\n",
    "The quick brown fox jumps over the lazy dog. Ünïcödé ✓ 数学 \\boxed{42}",
] * 20


def _bpe_tokenizer() -> Any:
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    model = tokenizers.models.BPE(unk_token=None)
    tok = tokenizers.Tokenizer(model)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>"
    )


@pytest.fixture(scope="module", params=["byte", "bpe"])
def tokenizer(request: pytest.FixtureRequest) -> Any:
    return ByteTokenizer() if request.param == "byte" else _bpe_tokenizer()


@pytest.fixture(scope="module")
def pair(tokenizer: Any) -> tuple[Any, Any]:
    return (
        renderers.get_renderer("role_colon", tokenizer),
        cb_renderers.get_renderer("role_colon", tokenizer),
    )


def _weights(weights: Any) -> list[float]:
    return [float(w) for w in weights.tolist()]


CONVERSATIONS: list[list[dict[str, Any]]] = [
    [],
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hello"}],
    [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "and 3+3?"},
    ],
    [{"role": "user", "content": [{"type": "text", "text": "parts: ✓ 数学"}]}],
    [{"role": "user", "content": ""}, {"role": "tool", "content": " spaced  \n"}],
]

SUPERVISED: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}],
    [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2\n\n"},
    ],
    [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "thinking"},
        {"role": "tool", "content": "result"},
        {"role": "assistant", "content": "\\boxed{42}"},
    ],
    [{"role": "assistant", "content": "unprompted"}],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("role", ["assistant", "user"])
def test_generation_prompts_are_the_cookbooks(pair, messages, role) -> None:
    ours, theirs = pair
    assert (
        ours.build_generation_prompt(messages, role=role).to_ints()
        == theirs.build_generation_prompt(messages, role=role).to_ints()
    )


def test_prefill_is_the_cookbooks(pair) -> None:
    ours, theirs = pair
    messages = [{"role": "user", "content": "2+2?"}]
    assert (
        ours.build_generation_prompt(messages, prefill=" The answer").to_ints()
        == theirs.build_generation_prompt(messages, prefill=" The answer").to_ints()
    )


def test_stop_sequences_and_extension_property_are_the_cookbooks(pair) -> None:
    ours, theirs = pair
    assert ours.get_stop_sequences() == theirs.get_stop_sequences() == ["\n\nUser:"]
    assert ours.has_extension_property is theirs.has_extension_property is True


@pytest.mark.parametrize("messages", SUPERVISED)
@pytest.mark.parametrize(
    "mode", [m for m in cb_renderers.TrainOnWhat if m is not cb_renderers.TrainOnWhat.CUSTOMIZED]
)
def test_supervised_examples_are_the_cookbooks_in_every_mode(pair, messages, mode) -> None:
    ours, theirs = pair
    our_input, our_weights = ours.build_supervised_example(messages, train_on_what=mode.value)
    their_input, their_weights = theirs.build_supervised_example(messages, train_on_what=mode)
    assert our_input.to_ints() == their_input.to_ints()
    assert _weights(our_weights) == _weights(their_weights)


@pytest.mark.parametrize("flags", [(False, True), (True, False), (True, True), (False, False)])
def test_customized_weights_are_the_cookbooks(pair, flags) -> None:
    ours, theirs = pair
    messages = [
        {"role": "user", "content": "q", "trainable": flags[0]},
        {"role": "assistant", "content": "a", "trainable": flags[1]},
    ]
    mode = cb_renderers.TrainOnWhat.CUSTOMIZED
    our_input, our_weights = ours.build_supervised_example(
        messages, train_on_what=renderers.TrainOnWhat.CUSTOMIZED
    )
    their_input, their_weights = theirs.build_supervised_example(messages, train_on_what=mode)
    assert our_input.to_ints() == their_input.to_ints()
    assert _weights(our_weights) == _weights(their_weights)


def test_supervised_examples_lists_are_the_cookbooks(pair) -> None:
    ours, theirs = pair
    for messages in SUPERVISED:
        mine = ours.build_supervised_examples(messages)
        cookbook = theirs.build_supervised_examples(messages)
        assert [(i.to_ints(), _weights(w)) for i, w in mine] == [
            (i.to_ints(), _weights(w)) for i, w in cookbook
        ]


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


RESPONSES = {
    "stop_sequence": lambda tok: _encode(tok, " 4\n\nUser:"),
    "stop_sequence_multiline": lambda tok: _encode(tok, " line one\nline two\n\nUser:"),
    "eos": lambda tok: [*_encode(tok, " 4\n\n"), tok.eos_token_id],
    "eos_without_blank_line": lambda tok: [*_encode(tok, " 4"), tok.eos_token_id],
    "truncated": lambda tok: _encode(tok, " the answer is"),
    "truncated_after_blank_line": lambda tok: _encode(tok, " 4\n\n"),
    "stop_then_eos": lambda tok: [*_encode(tok, " 4\n\nUser:"), tok.eos_token_id],
    "two_stops": lambda tok: _encode(tok, " 4\n\nUser: more\n\nUser:"),
    "empty": lambda tok: [],
    "only_eos": lambda tok: [tok.eos_token_id],
    "no_leading_space": lambda tok: _encode(tok, "4\n\nUser:"),
}


@pytest.mark.parametrize("case", sorted(RESPONSES))
def test_parse_response_is_the_cookbooks(pair, tokenizer, case) -> None:
    ours, theirs = pair
    tokens = RESPONSES[case](tokenizer)
    message, termination = ours.parse_response(tokens)
    their_message, their_termination = theirs.parse_response(tokens)
    assert message == their_message
    assert termination.value == their_termination.value
    assert termination.is_clean == their_termination.is_clean
    assert termination.is_stop_sequence == their_termination.is_stop_sequence


def test_a_blank_line_before_the_stop_sequence_is_kept_unless_asked(pair, tokenizer) -> None:
    """Deliberate: ours inverts rendering; `strip_blank_line_before_stop` is the cookbook's."""
    ours, theirs = pair
    content = "a\n\n"
    tokens = _encode(tokenizer, f" {content}\n\nUser:")
    assert theirs.parse_response(tokens)[0]["content"] == "a"
    assert ours.parse_response(tokens).message["content"] == content
    cookbook_like = renderers.RoleColonRenderer(tokenizer, strip_blank_line_before_stop=True)
    assert cookbook_like.parse_response(tokens) == tuple(theirs.parse_response(tokens))


def test_a_last_non_assistant_message_gets_no_placeholder(pair, tokenizer) -> None:
    """Deliberate: the cookbook appends the encoded text "<UNUSED>" (its comment says it never
    does); ours ends with the message, so the tokens are the cookbook's minus the placeholder."""
    ours, theirs = pair
    messages = [{"role": "assistant", "content": "a"}, {"role": "user", "content": "q"}]
    their_input, _ = theirs.build_supervised_example(
        messages, train_on_what=cb_renderers.TrainOnWhat.ALL_MESSAGES
    )
    our_input, our_weights = ours.build_supervised_example(
        messages, train_on_what=renderers.TrainOnWhat.ALL_MESSAGES
    )
    placeholder = _encode(tokenizer, "<UNUSED>")
    assert their_input.to_ints() == our_input.to_ints() + placeholder
    assert len(our_weights) == our_input.length


def test_a_round_trip_through_supervised_tokens_parses_back(pair) -> None:
    ours, theirs = pair
    messages = SUPERVISED[1]
    model_input, weights = ours.build_supervised_example(messages)
    prompt = ours.build_generation_prompt(messages[:-1]).to_ints()
    action = model_input.to_ints()[len(prompt) :]
    assert all(w == 0 for w in weights[: len(prompt)]) and all(
        w == 1 for w in weights[len(prompt) :]
    )
    assert ours.parse_response(action).message == {"role": "assistant", "content": "a2\n\n"}
    assert theirs.parse_response(action)[0] == {"role": "assistant", "content": "a2"}


_TEXT = st.text(alphabet=st.sampled_from(list("ab \n:UserAssistant✓数")), min_size=0, max_size=12)
_MESSAGES = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system"]), "content": _TEXT}
    ),
    min_size=1,
    max_size=4,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(messages=_MESSAGES)
def test_random_conversations_render_and_train_as_the_cookbooks(pair, messages) -> None:
    ours, theirs = pair
    assert (
        ours.build_generation_prompt(messages).to_ints()
        == theirs.build_generation_prompt(messages).to_ints()
    )
    if messages[-1]["role"] == "assistant":
        for mode in ("last_assistant_message", "all_assistant_messages", "all_tokens"):
            our_input, our_weights = ours.build_supervised_example(messages, train_on_what=mode)
            their_input, their_weights = theirs.build_supervised_example(
                messages, train_on_what=cb_renderers.TrainOnWhat(mode)
            )
            assert our_input.to_ints() == their_input.to_ints()
            assert _weights(our_weights) == _weights(their_weights)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=_TEXT, eos=st.booleans())
def test_random_responses_parse_as_the_cookbooks_up_to_the_blank_line(pair, tokenizer, text, eos):
    ours, theirs = pair
    tokens = _encode(tokenizer, text) + ([tokenizer.eos_token_id] if eos else [])
    cookbook_like = renderers.RoleColonRenderer(tokenizer, strip_blank_line_before_stop=True)
    their_message, their_termination = theirs.parse_response(tokens)
    message, termination = cookbook_like.parse_response(tokens)
    assert (message, termination.value) == (their_message, their_termination.value)
    assert ours.parse_response(tokens).termination.value == their_termination.value


def test_the_byte_tokenizer_encodes_its_bos_text_as_the_bos_id() -> None:
    """What makes the cookbook's BOS (the encoded `bos_token` text) equal ours (the id)."""
    tok = ByteTokenizer()
    assert tok.encode(tok.bos_token, add_special_tokens=False) == [tok.bos_token_id]


def test_our_renderer_pickles_and_rebuilds_the_local_tokenizer() -> None:
    renderer = renderers.get_renderer("role_colon", ByteTokenizer())
    clone = pickle.loads(pickle.dumps(renderer))
    messages: list[renderers.Message] = [{"role": "user", "content": "hi"}]
    assert clone.build_generation_prompt(messages) == renderer.build_generation_prompt(messages)
    assert isinstance(clone.tokenizer, ByteTokenizer)
