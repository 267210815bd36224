"""Tests of the tool-use agent demo (`shell.jobs.tools`, `rlpure agent`).

The fast tests pin the format (`RoleColonToolRenderer` for the toy model, SmolLM2's `smollm2`
ChatML with its system message for `--model smollm2`), the grading and the env's handling of
good and bad tool calls with scripted model outputs; the slow one runs a deliberately tiny
toy recipe end to end on the local backend (a short warm-up on tool-only transcripts, 2 GRPO
steps; the model's tool calls ran and the conversation page shows them).
SmolLM2's run goes through the same code with its renderer and LoRA; an end-to-end SmolLM2
step costs ~2 minutes of CI (two model loads and compiles), so here its episodes are scripted
with its real tokenizer and template. The accuracy figures of the real recipes come from
running `rlpure agent` (see the README).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import jax
import pytest

from rlpure.model import ByteTokenizer
from shell.agents._message_env import EnvFromMessageEnv
from shell.chat import Message
from shell.jobs import COMMANDS
from shell.jobs.tools import (
    AGENT_MODELS,
    SMOLLM2_TOOL_PROMPT,
    AgentConfig,
    AgentGroupBuilder,
    RoleColonToolRenderer,
    ToolProblem,
    add_agent_arguments,
    agent_renderer,
    conversation_prefix,
    corpus_conversations,
    grade_messages,
    run_agent,
    split_tool_problems,
)

TOKENIZER = ByteTokenizer()
RENDERER = RoleColonToolRenderer(TOKENIZER)
PROBLEM = ToolProblem(a=12, op="*", b=34)
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expr": "12*34"}}\n</tool_call>'


def _tokens(text: str) -> list[int]:
    return list(TOKENIZER.encode(text, add_special_tokens=False))


BUILDER = AgentGroupBuilder(PROBLEM, RENDERER, 1)


def _env() -> EnvFromMessageEnv:
    envs = asyncio.run(BUILDER.make_envs())
    env = envs[0]
    assert isinstance(env, EnvFromMessageEnv)
    return env


def test_the_command_is_registered() -> None:
    assert COMMANDS["agent"].name == "agent"


def test_parse_response_splits_tool_calls_off_the_text() -> None:
    message, termination = RENDERER.parse_response(_tokens(f" {CALL}\n\nUser:"))
    assert termination.is_stop_sequence
    assert message["content"] == ""
    (call,) = message["tool_calls"]
    assert call.function.name == "calculator"
    assert json.loads(call.function.arguments) == {"expr": "12*34"}
    bad, _ = RENDERER.parse_response(_tokens(" <tool_call>{oops}</tool_call>\n\nUser:"))
    assert "tool_calls" not in bad and len(bad["unparsed_tool_calls"]) == 1
    open_only, _ = RENDERER.parse_response(_tokens(' <tool_call>{"name": "x"\n\nUser:'))
    assert "unterminated" in open_only["unparsed_tool_calls"][0].error
    plain, _ = RENDERER.parse_response(_tokens(" \\boxed{408}\n\nUser:"))
    assert plain == {"role": "assistant", "content": "\\boxed{408}"}


def test_each_prompt_extends_the_previous_prompt_and_its_turn() -> None:
    env = _env()
    initial = asyncio.run(env.initial_observation())
    assert isinstance(initial, tuple)
    first, stop = initial
    assert TOKENIZER.decode(first.to_ints()) == "<|bos|>User: What is 12*34?\n\nAssistant:"
    assert stop == ("\n\nUser:",)
    action = _tokens(f" {CALL}\n\nUser:")
    result = asyncio.run(env.step(action))
    assert not result.episode_done and result.reward == 0.0
    second = result.next_observation.to_ints()
    assert second[: len(first.to_ints()) + len(action)] == first.to_ints() + action
    assert TOKENIZER.decode(second).endswith(
        "User: <tool_response>408</tool_response>\n\nAssistant:"
    )
    final = asyncio.run(env.step(_tokens(" \\boxed{408}\n\nUser:")))
    assert final.episode_done and final.reward == 1.0
    assert final.metrics == {"stop/completed": 1.0}
    # every episode's metrics come from its conversation, in compute_group_rewards
    [(reward, metrics)] = asyncio.run(BUILDER.compute_group_rewards([], [env]))
    assert (reward, metrics) == (0.0, {"correct": 1.0, "format": 1.0, "used_tool": 1.0})


def test_bad_tool_use_is_counted_never_raised() -> None:
    env = _env()
    asyncio.run(env.initial_observation())
    bad_expr = '<tool_call>\n{"name": "calculator", "arguments": {"expr": "12/34"}}\n</tool_call>'
    result = asyncio.run(env.step(_tokens(f" {bad_expr}\n\nUser:")))
    assert result.metrics["tool_error/execution_failed"] == 1.0
    assert "Tool execution failed" in TOKENIZER.decode(result.next_observation.to_ints())
    env = _env()
    asyncio.run(env.initial_observation())
    result = asyncio.run(env.step(_tokens(" <tool_call>{oops}</tool_call>\n\nUser:")))
    assert result.episode_done and result.metrics["parse_error"] == 1.0
    assert result.reward == -0.1
    # an episode that ended on a parse error still counts as wrong (not left out of the means)
    [(_, metrics)] = asyncio.run(BUILDER.compute_group_rewards([], [env]))
    assert metrics == {"correct": 0.0, "format": 0.0, "used_tool": 0.0}


def test_grading() -> None:
    answer: list[Message] = [{"role": "assistant", "content": "\\boxed{408}"}]
    assert grade_messages(answer, PROBLEM, format_coef=0.1)[0] == 1.0
    wrong: list[Message] = [{"role": "assistant", "content": "\\boxed{407}"}]
    assert grade_messages(wrong, PROBLEM, format_coef=0.1)[0] == 0.0
    none: list[Message] = [{"role": "assistant", "content": "408"}]
    assert grade_messages(none, PROBLEM, format_coef=0.1) == (
        -0.1,
        {"correct": 0.0, "format": 0.0, "used_tool": 0.0},
    )


def test_warmup_examples_train_the_stop_sequence_after_a_tool_call() -> None:
    call = RENDERER.parse_response(_tokens(f" {CALL}\n\nUser:")).message
    conversation: list[Message] = [
        {"role": "user", "content": PROBLEM.question},
        call,
        {"role": "tool", "content": "408", "name": "calculator"},
        {"role": "assistant", "content": "\\boxed{408}"},
    ]
    tokens, weights_T = RENDERER.build_supervised_example(conversation, "all_assistant_messages")
    text = "".join(
        TOKENIZER.decode([t]) if w > 0 else "_"
        for t, w in zip(tokens.to_ints(), weights_T, strict=True)
    )
    prompt = "_" * (1 + len("User: What is 12*34?\n\nAssistant:"))  # BOS is one token
    response = "_" * len(" <tool_response>408</tool_response>\n\nAssistant:")
    assert text == f"{prompt} {CALL}\n\nUser:{response} \\boxed{{408}}\n\nUser:"


@pytest.mark.slow
def test_split_and_warmup_corpus() -> None:
    train, test = split_tool_problems(
        jax.random.key(0), min_operand=10, max_operand=99, num_train=50, num_test=10
    )
    assert not set(train) & set(test)
    conversations = corpus_conversations(jax.random.key(1), train, p_tool=0.5)
    for problem, messages in zip(train, conversations, strict=True):
        reward, metrics = grade_messages(messages, problem, format_coef=0.1)
        assert reward == metrics["used_tool"]  # tool transcripts right, direct ones wrong


@pytest.mark.slow
def test_two_steps_end_to_end_run_the_tools_and_show_them(tmp_path: Path) -> None:
    # Two problems (1+1 to train, 1*1 held out) and tool-only transcripts: a short warm-up
    # makes the toy model write the calculator call, so the tools really run.
    config = AgentConfig(
        min_operand=1,
        max_operand=1,
        num_train=1,
        num_test=1,
        p_tool=1.0,
        warmup_steps=80,
        warmup_batch=4,
        warmup_lr=1e-2,
        rl_steps=2,
        groups_per_batch=1,
        group_size=4,
        max_tokens=90,
        max_turns=2,
        eval_every=5,  # held-out evaluation at step 0 and after the last step only
    )
    summary = run_agent(seed=0, log_dir=tmp_path, config=config, progress=False)
    assert summary["steps"] == 2 and summary["accuracy_after"] is not None
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert max(r.get("env/all/used_tool", 0.0) for r in rows) > 0
    page = (tmp_path / "iteration_000000" / "train.html").read_text()
    assert "&lt;tool_response&gt;" in page or "<tool_response>" in page
    assert (tmp_path / "iteration_000000" / "train_rollout_summaries.jsonl").exists()


# --- SmolLM2 (`rlpure agent --model smollm2`) ---------------------------------------------------

SMOLLM2 = AGENT_MODELS["smollm2"]


def _require_smollm2() -> None:
    from shell.errors import ConfigError
    from shell.local._models import PACKAGED_MODELS, packaged_model_path

    try:
        packaged_model_path(SMOLLM2.base_model, PACKAGED_MODELS[SMOLLM2.base_model])
    except ConfigError as err:
        pytest.skip(str(err))


def test_the_model_flag_picks_a_preset_and_flags_override_it() -> None:
    parser = argparse.ArgumentParser()
    add_agent_arguments(parser)
    args = parser.parse_args(["--model", "smollm2", "--rl-steps", "3"])
    assert (args.model, args.rl_steps, args.group_size) == ("smollm2", 3, None)
    assert SMOLLM2.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert (SMOLLM2.lora_rank, AGENT_MODELS["toy"].system_prompt) == (32, "")
    assert conversation_prefix(AGENT_MODELS["toy"]) == []
    assert conversation_prefix(SMOLLM2) == [{"role": "system", "content": SMOLLM2_TOOL_PROMPT}]
    assert isinstance(agent_renderer("rlpure/tiny", TOKENIZER), RoleColonToolRenderer)


def test_smollm2_episodes_use_its_chat_template_and_run_the_tool() -> None:
    _require_smollm2()
    from shell.tokenizers import get_tokenizer

    tokenizer = get_tokenizer(SMOLLM2.base_model)
    renderer = agent_renderer(SMOLLM2.base_model, tokenizer)
    builder = AgentGroupBuilder(
        PROBLEM, renderer, 1, max_turns=2, convo_prefix=tuple(conversation_prefix(SMOLLM2))
    )
    (env,) = asyncio.run(builder.make_envs())
    assert isinstance(env, EnvFromMessageEnv)
    initial = asyncio.run(env.initial_observation())
    assert isinstance(initial, tuple)
    first, stop = initial
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert list(stop) == [im_end]
    messages = [
        {"role": "system", "content": SMOLLM2_TOOL_PROMPT},
        {"role": "user", "content": PROBLEM.question},
    ]
    # SmolLM2's own template, string for string
    template = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert tokenizer.decode(first.to_ints()) == template
    action = tokenizer.encode(f"{CALL}<|im_end|>", add_special_tokens=False)
    result = asyncio.run(env.step(action))
    assert not result.episode_done and result.reward == 0.0
    second = result.next_observation.to_ints()
    assert second[: first.length + len(action)] == first.to_ints() + action  # one datum
    assert tokenizer.decode(second).endswith(
        "<|im_start|>tool\n408<|im_end|>\n<|im_start|>assistant\n"
    )
    final = asyncio.run(
        env.step(tokenizer.encode("\\boxed{408}<|im_end|>", add_special_tokens=False))
    )
    assert final.episode_done and final.reward == 1.0
    [(_, metrics)] = asyncio.run(builder.compute_group_rewards([], [env]))
    assert metrics == {"correct": 1.0, "format": 1.0, "used_tool": 1.0}
    # The warm-up transcripts train the assistant turns (the call and the answer) only.
    (transcript,) = corpus_conversations(jax.random.key(0), [PROBLEM], p_tool=1.0)
    tokens, weights_T = renderer.build_supervised_example(
        conversation_prefix(SMOLLM2) + transcript, "all_assistant_messages"
    )
    trained = tokenizer.decode([t for t, w in zip(tokens.to_ints(), weights_T, strict=True) if w])
    assert trained == f"{CALL}<|im_end|>\\boxed{{408}}<|im_end|>"
