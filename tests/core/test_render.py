"""Tests of `rlpure.render`: golden token layouts, round trips, terminations, properties."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rlpure.records import ModelInput
from rlpure.render import (
    ParsedResponse,
    RoleColonRenderer,
    SupervisedExample,
    get_renderer,
)
from rlpure.tasks.math_grading import gsm8k_fewshot_prefix, gsm8k_question

BOS, EOS = 0, 1
_BYTE_OFFSET = 2
# Multi-character pieces, merged greedily (longest first) like a BPE vocabulary would. The
# merged "\n\nAssistant:" and "\n\nUser:" make piecewise encoding differ from encoding the
# joined text, so the golden tests pin that the renderer encodes each piece on its own.
_PIECES = ("User:", "Assistant:", "System:", "\n\n", "\n\nUser:", "\n\nAssistant:", " the", " is")
_PIECE_IDS = {piece: 258 + i for i, piece in enumerate(_PIECES)}


class MergingTokenizer:
    """A tiny lossless tokenizer: greedy longest-match pieces, else UTF-8 bytes."""

    bos_token_id: int | None = BOS
    eos_token_id: int | None = EOS

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [BOS] if add_special_tokens and self.bos_token_id is not None else []
        i = 0
        while i < len(text):
            for piece in sorted(_PIECES, key=len, reverse=True):
                if text.startswith(piece, i):
                    ids.append(_PIECE_IDS[piece])
                    i += len(piece)
                    break
            else:
                ids += [_BYTE_OFFSET + b for b in text[i].encode("utf-8")]
                i += 1
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        pieces = {v: k for k, v in _PIECE_IDS.items()}
        out = bytearray()
        for token in ids:
            if token in (BOS, EOS):
                continue
            if token in pieces:
                out += pieces[token].encode("utf-8")
            else:
                out.append(token - _BYTE_OFFSET)
        return out.decode("utf-8", errors="replace")


class NoBosTokenizer(MergingTokenizer):
    bos_token_id = None


TOK = MergingTokenizer()
RENDERER = RoleColonRenderer(TOK)


def _bytes(text: str) -> list[int]:
    return [_BYTE_OFFSET + b for b in text.encode("utf-8")]


def _enc(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False)


# --- golden layouts ----------------------------------------------------------------------------


def test_golden_single_question_prompt() -> None:
    prompt = RENDERER.build_generation_prompt([{"role": "user", "content": "2+2?"}])
    assert isinstance(prompt, ModelInput)
    expected = [BOS, _PIECE_IDS["User:"], *_bytes(" 2+2?"), _PIECE_IDS["\n\n"]]
    expected += [_PIECE_IDS["Assistant:"]]
    assert prompt.to_ints() == expected
    assert TOK.decode(prompt.to_ints()) == "User: 2+2?\n\nAssistant:"
    # Encoding the joined string would merge "\n\nAssistant:" into one token: the renderer
    # must not do that (the cookbook encodes header and output separately).
    assert _enc("User: 2+2?\n\nAssistant:") != prompt.to_ints()[1:]


def test_golden_fewshot_conversation_prompt() -> None:
    messages = [
        {"role": "user", "content": "How many r's are in strawberry?"},
        {"role": "assistant", "content": "\\boxed{3}"},
        {"role": "user", "content": "What is the answer?"},
    ]
    prompt = RENDERER.build_generation_prompt(messages).to_ints()
    expected = [BOS]
    expected += [_PIECE_IDS["User:"], *_enc(" How many r's are in strawberry?\n\n")]
    expected += [_PIECE_IDS["Assistant:"], *_enc(" \\boxed{3}\n\n")]
    expected += [_PIECE_IDS["User:"], *_enc(" What is the answer?\n\n")]
    expected += [_PIECE_IDS["Assistant:"]]
    assert prompt == expected
    assert _enc(" What is the answer?\n\n")[-4:] == [*_bytes("er?"), _PIECE_IDS["\n\n"]]
    assert TOK.decode(prompt) == (
        "User: How many r's are in strawberry?\n\n"
        "Assistant: \\boxed{3}\n\n"
        "User: What is the answer?\n\n"
        "Assistant:"
    )


def test_roles_are_capitalised_and_no_bos_without_a_bos_token() -> None:
    renderer = RoleColonRenderer(NoBosTokenizer())
    prompt = renderer.build_generation_prompt(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    )
    assert prompt.to_ints()[0] == _PIECE_IDS["System:"]
    assert TOK.decode(prompt.to_ints()) == "System: Be brief.\n\nUser: Hi\n\nAssistant:"
    empty = renderer.build_generation_prompt([])
    assert empty.to_ints() == [_PIECE_IDS["Assistant:"]]
    other = renderer.build_generation_prompt([{"role": "user", "content": "x"}], role="user")
    assert TOK.decode(other.to_ints()) == "User: x\n\nUser:"


def test_stop_sequences() -> None:
    assert RENDERER.get_stop_sequences() == ("\n\nUser:",)


def test_golden_supervised_example() -> None:
    messages = [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "A"},
    ]
    example = RENDERER.build_supervised_example(messages)
    tokens = example.model_input.to_ints()
    assert tokens == [
        BOS,
        _PIECE_IDS["User:"],
        *_bytes(" Q"),
        _PIECE_IDS["\n\n"],
        _PIECE_IDS["Assistant:"],
        *_bytes(" A"),
        _PIECE_IDS["\n\n"],
        _PIECE_IDS["User:"],
    ]
    np.testing.assert_array_equal(
        example.weights_T, np.array([0, 0, 0, 0, 0, 0, 1, 1, 1, 1], np.float32)
    )
    assert example.weights_T.dtype == np.float32
    assert not example.weights_T.flags.writeable


def test_supervised_example_weights_by_train_on() -> None:
    messages = [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": "A2"},
    ]
    last = RENDERER.build_supervised_example(messages)
    every = RENDERER.build_supervised_example(messages, train_on="all_assistant_messages")
    assert last.model_input == every.model_input
    a1_output = len(_enc(" A1\n\n"))
    a2_output = len(_enc(" A2\n\n")) + len(_enc("User:"))
    assert last.weights_T.sum() == a2_output
    assert every.weights_T.sum() == a1_output + a2_output
    # A conversation ending in a user message trains nothing by default.
    user_last = RENDERER.build_supervised_example(messages[:3])
    assert user_last.weights_T.sum() == 0
    assert TOK.decode(user_last.model_input.to_ints()).endswith("User: Q2\n\n")


def test_golden_byte_tokenizer_layout() -> None:
    """With the project's `ByteTokenizer` (ids = UTF-8 bytes, BOS 256, EOS 257)."""
    from rlpure.model import BOS_ID, EOS_ID, ByteTokenizer

    renderer = get_renderer("role_colon", ByteTokenizer())
    prompt = renderer.build_generation_prompt([{"role": "user", "content": "1+1?"}])
    assert prompt.to_ints() == [BOS_ID, *b"User: 1+1?\n\nAssistant:"]
    assert renderer.parse_response([*b" \\boxed{2}\n\nUser:"]) == ParsedResponse(
        content="\\boxed{2}", termination="stop_sequence"
    )
    assert renderer.parse_response([*b" \\boxed{2}", EOS_ID]).termination == "eos"
    assert renderer.parse_response([*b" \\boxed{2"]).termination == "malformed"
    # The GSM8K prompt of the tutorial, few-shot prefix included.
    conversation = [*gsm8k_fewshot_prefix(), {"role": "user", "content": gsm8k_question("Q?")}]
    text = ByteTokenizer().decode(renderer.build_generation_prompt(conversation).to_ints())
    assert text == (
        "<|bos|>User: How many r's are in strawberry? Provide a numerical answer without units, "
        "written inside \\boxed{}.\n\nAssistant: Let's spell the word out and number all the "
        "letters: 1) s 2) t 3) r 4) a 5) w 6) b 7) e 8) r 9) r 10) y. We have r's at positions "
        "3, 8, and 9. \\boxed{3}\n\nUser: Q? Provide a numerical answer without units, written "
        "inside \\boxed{}.\n\nAssistant:"
    )


# --- parsing -----------------------------------------------------------------------------------

PARSE_CASES = [
    (" Some answer.\n\nUser:", False, "Some answer.", "stop_sequence"),
    (" The answer is \\boxed{42}.", True, "The answer is \\boxed{42}.", "eos"),
    (" The answer is \\boxed{42}.\n\n", True, "The answer is \\boxed{42}.", "eos"),
    (" Some incomplete answer", False, "Some incomplete answer", "malformed"),
    (" Some answer.\n\nUser:", True, "Some answer.", "malformed"),  # stop then EOS
    (" Answer.\n\nUser: question?\n\nUser:", False, "Answer.", "malformed"),  # role-played
    ("", False, "", "malformed"),
    ("", True, "", "eos"),
    ("\n\nUser:", False, "", "stop_sequence"),
    (" 12\n\n\n\nUser:", False, "12\n\n", "stop_sequence"),  # exact inverse (cookbook: "12")
    ("no leading space\n\nUser:", False, "no leading space", "stop_sequence"),
]


@pytest.mark.parametrize(("text", "eos", "content", "termination"), PARSE_CASES)
def test_parse_response_cases(text: str, eos: bool, content: str, termination: str) -> None:
    tokens = _enc(text) + ([EOS] if eos else [])
    parsed = RENDERER.parse_response(tokens)
    assert parsed == ParsedResponse(content=content, termination=termination)  # type: ignore[arg-type]
    assert parsed.message == {"role": "assistant", "content": content}
    assert parsed.is_clean == (termination != "malformed")
    assert parsed.is_stop_sequence == (termination == "stop_sequence")
    # numpy input parses the same
    assert RENDERER.parse_response(np.asarray(tokens, np.int32)) == parsed


@pytest.mark.parametrize("content", [" leading", "trailing ", "  both  ", " ", "a\nb", "c\n"])
def test_parse_keeps_the_content_whitespace_it_rendered(content: str) -> None:
    tokens = _enc(" " + content + "\n\n") + _enc("User:")
    assert RENDERER.parse_response(tokens).content == content


def test_only_a_final_eos_counts() -> None:
    parsed = RENDERER.parse_response([EOS, *_enc(" 5")])
    assert parsed == ParsedResponse(content="5", termination="malformed")


# --- properties --------------------------------------------------------------------------------

texts = st.text(
    alphabet=st.characters(codec="utf-8"),  # any encodable character, newlines included
    max_size=30,
) | st.sampled_from(["", "\n\n", "User:", "Assistant:", "a\n\nUser", " the is\n"])
roles = st.sampled_from(["user", "assistant", "system"])
messages_st = st.lists(
    st.fixed_dictionaries({"role": roles, "content": texts}), min_size=0, max_size=4
)


def _clean(content: str) -> bool:
    return (" " + content + "\n\nUser:").count("\n\nUser:") == 1


@settings(max_examples=200, deadline=None)
@given(history=messages_st, answer=texts)
def test_supervised_example_extends_the_generation_prompt(
    history: list[dict[str, str]], answer: str
) -> None:
    messages = [*history, {"role": "assistant", "content": answer}]
    prompt = RENDERER.build_generation_prompt(history).to_ints()
    example = RENDERER.build_supervised_example(messages)
    tokens = example.model_input.to_ints()
    assert tokens[: len(prompt)] == prompt
    completion = tokens[len(prompt) :]
    assert completion == _enc(" " + answer + "\n\n") + _enc("User:")
    np.testing.assert_array_equal(example.weights_T[: len(prompt)], 0.0)
    np.testing.assert_array_equal(example.weights_T[len(prompt) :], 1.0)
    # Extension property: the next turn's prompt starts with the whole supervised example.
    next_prompt = RENDERER.build_generation_prompt(
        [*messages, {"role": "user", "content": "next"}]
    ).to_ints()
    assert next_prompt[: len(tokens)] == tokens
    # Round trip: the sampled completion parses back to the content.
    if _clean(answer):
        assert RENDERER.parse_response(completion) == ParsedResponse(
            content=answer, termination="stop_sequence"
        )


@settings(max_examples=200, deadline=None)
@given(answer=texts)
def test_eos_round_trip(answer: str) -> None:
    assume("\n\nUser:" not in answer)
    with_suffix = RENDERER.parse_response([*_enc(" " + answer + "\n\n"), EOS])
    assert with_suffix == ParsedResponse(content=answer, termination="eos")
    # Without the rendered "\n\n" before EOS, a content's own final blank line is taken for it.
    bare = RENDERER.parse_response([*_enc(" " + answer), EOS])
    assert bare == ParsedResponse(content=answer.removesuffix("\n\n"), termination="eos")


@settings(max_examples=200, deadline=None)
@given(messages=messages_st)
def test_prompt_text_is_role_colon_joined(messages: list[dict[str, str]]) -> None:
    prompt = RENDERER.build_generation_prompt(messages).to_ints()
    assert prompt[0] == BOS
    text = "".join(f"{m['role'].capitalize()}: {m['content']}\n\n" for m in messages)
    assert TOK.decode(prompt) == text + "Assistant:"


@settings(max_examples=200, deadline=None)
@given(tokens=st.lists(st.integers(0, 257 + len(_PIECES)), max_size=40))
def test_parse_response_never_raises_on_any_tokens(tokens: list[int]) -> None:
    parsed = RENDERER.parse_response(tokens)
    assert parsed.termination in ("stop_sequence", "eos", "malformed")


# --- errors and registry -------------------------------------------------------------------------


def test_get_renderer() -> None:
    assert isinstance(get_renderer("role_colon", TOK), RoleColonRenderer)
    with pytest.raises(ValueError, match=r"unknown renderer 'gpt_oss'.*role_colon.*llama3"):
        get_renderer("gpt_oss", TOK)
    # A chat format needs its control tokens to be single tokens of the tokenizer.
    with pytest.raises(ValueError, match=r"encodes '<\|im_end\|>' as 10 tokens"):
        get_renderer("chatml", TOK)


def test_bad_tokenizer_is_named() -> None:
    with pytest.raises(TypeError, match="has no 'encode'"):
        RoleColonRenderer(object())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("messages", "error", "match"),
    [
        ([{"role": "user"}], ValueError, r"messages\[0\]: missing key 'content'"),
        ([{"role": "user", "content": "a"}, {"content": "b"}], ValueError, r"messages\[1\]"),
        ([{"role": "user", "content": ["a"]}], TypeError, r"messages\[0\]\['content'\]"),
        ([{"role": "", "content": "a"}], ValueError, "empty role"),
        (["user: hi"], TypeError, r"messages\[0\]: expected a mapping"),
        ("user: hi", TypeError, "sequence of message mappings"),
        ({"role": "user", "content": "a"}, TypeError, "sequence of message mappings"),
    ],
)
def test_bad_messages_are_named(messages: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        RENDERER.build_generation_prompt(messages)  # type: ignore[arg-type]
    with pytest.raises(error, match=match):
        RENDERER.build_supervised_example(messages)  # type: ignore[arg-type]


def test_supervised_example_refuses_empty_and_unknown_modes() -> None:
    with pytest.raises(ValueError, match="messages is empty"):
        RENDERER.build_supervised_example([])
    with pytest.raises(ValueError, match="unknown train_on"):
        RENDERER.build_supervised_example(
            [{"role": "assistant", "content": "a"}],
            train_on="everything",  # type: ignore[arg-type]
        )


def test_records_validate() -> None:
    with pytest.raises(ValueError, match=r"ParsedResponse.termination"):
        ParsedResponse(content="x", termination="length")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"SupervisedExample.weights_T: shape \(2,\)"):
        SupervisedExample(model_input=ModelInput.from_ints([1, 2, 3]), weights_T=np.ones(2))


def test_grading_and_render_modules_stay_pure() -> None:
    """AST scan: no effectful imports and no `open`/`eval`/`exec` in the pure modules."""
    import ast
    from pathlib import Path

    allowed = {"__future__", "collections", "fractions", "json", "re", "typing", "msgspec", "numpy"}
    root = Path(__file__).resolve().parents[2] / "rlpure"
    names = ["tasks/math_grading.py", *(f"render/{p.name}" for p in (root / "render").glob("*.py"))]
    assert len(names) >= 8
    for name in names:
        tree = ast.parse((root / name).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            else:
                modules = []
            for module in modules:
                top = module.split(".")[0]
                assert top in allowed or module.startswith("rlpure."), (name, module)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in ("open", "eval", "exec", "compile"), (name, node.func.id)
