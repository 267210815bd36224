"""Cookbook 0.6.1's MessageEnv code on the shell: `rl_numerics_check`'s tool-using env.

`recipes/rl_numerics_check/env.py` builds an `AgentToolMessageEnv` subclass (one tool call per
turn, a `@tool` method `read_page`, a grader) inside an `EnvFromMessageEnv` subclass. Here:

- port: the file after the prefix rewrite alone trains two steps through `shell.cookbook.rl.train.main`
  on the local backend (its WikiText loader swapped for a small corpus: the hub is offline);
- differential: the cookbook's own module and the ported one, each with its library's `qwen3`
  renderer on the same tokenizer, step through the same scripted model outputs (tool calls, two
  calls in one turn, an unknown page, malformed JSON, a call to a missing tool, an answer, a
  truncated turn, a response without its stop token) and return the same rewards, episode
  ends, next observations (token for token), metrics and logs — ours add only the
  `tool_error*` counts (documented in `shell.cookbook.tool_use.agent_tool_message_env`).

Tokenizer: a byte-level BPE trained offline on the task's own text with Qwen's special and
added tokens (as `test_chat_renderer_parity.py` builds one), registered under its own name, the
builder's `model_name_for_tokenizer`; the toy model (vocabulary sized to it) trains on its ids.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import Field

from tests.parity.porting import ported_module, require_cookbook

require_cookbook()
tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

from rlpure.model import ModelConfig  # noqa: E402
from shell.cookbook import renderers, tokenizer_utils  # noqa: E402
from shell.cookbook.rl import train  # noqa: E402
from shell.local import LocalServiceClient  # noqa: E402

MODEL = "test/message-env-micro"
TOKENIZER = "test/message-env-qwen-bpe"  # the env's tokenizer; the toy model's own is bytes
RECIPE = "recipes/rl_numerics_check/env.py"
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>"]
ADDED += ["</tool_response>"]
WORDS = [
    "after",
    "before",
    "the",
    "time",
    "during",
    "a",
    "of",
    "many",
    "when",
    "while",
    "until",
    "into",
    "over",
    "only",
]


def _corpus(n_words: int = 3000) -> str:
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(n_words // 12)]
    return "\n".join(lines)


@pytest.fixture(scope="module")
def module() -> Any:
    ported = ported_module(RECIPE)
    ported.__dict__["load_wikitext_corpus"] = lambda max_chars=0: _corpus()  # hub offline
    return ported


@pytest.fixture(scope="module")
def tokenizer(module: Any) -> Any:
    task = module.CountingTaskConfig(num_pages_min=1, num_pages_max=2, page_chars=120)
    texts = [module.build_prompt(task, word, 2) for word in ("after", "until")]
    texts += [module.SYSTEM_PROMPT, _corpus(600), '{"name": "read_page", "arguments": {"page": 1}}']
    model = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=None))
    model.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=900,
        special_tokens=SPECIAL,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    model.train_from_iterator(texts * 5, trainer=trainer)
    model.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False) for t in ADDED])
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=model, eos_token="<|im_end|>")
    tokenizer_utils.register_tokenizer(TOKENIZER, tok)
    yield tok
    tokenizer_utils.unregister_tokenizer(TOKENIZER)


def _task(module: Any) -> Any:
    return module.CountingTaskConfig(
        num_pages_min=1, num_pages_max=3, page_chars=120, words=("after", "until")
    )


def test_rl_numerics_check_env_ports_and_trains(
    tmp_path: Path, module: Any, tokenizer: Any
) -> None:
    builder = module.CountingDatasetBuilder(
        batch_size=2,
        group_size=2,
        model_name_for_tokenizer=TOKENIZER,
        renderer_name="qwen3",
        task=_task(module),
        n_batches=2,
        max_trajectory_tokens=1024,
        max_generation_tokens=6,
    )
    config = ModelConfig(
        vocab_size=len(tokenizer), d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=1024
    )
    service = LocalServiceClient(
        seed=0, checkpoint_dir=tmp_path / "states", model_configs={MODEL: config}
    )
    result = asyncio.run(
        train.main(
            train.Config(
                learning_rate=1e-3,
                dataset_builder=builder,
                model_name=MODEL,
                recipe_name="port_rl_numerics_check",
                max_tokens=6,
                log_path=str(tmp_path / "run"),
                renderer_name="qwen3",
                eval_every=0,
                max_steps=2,
                # the rollout report decodes with the toy backend's byte tokenizer, which
                # cannot read the BPE's ids; the trajectories themselves are checked below
                num_groups_to_log=0,
            ),
            service_client=service,
        )
    )
    assert (result.start_step, result.end_step) == (0, 2)
    rows = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [row for row in rows if "env/all/reward/total" in row]
    assert [row["step"] for row in steps] == [0, 1]
    # six sampled tokens rarely close a turn: episodes end on truncation, not on a parse error
    assert all(row.get("env/all/stop/max_tokens", 0.0) > 0 for row in steps)


def _scripted(tok: Any) -> list[tuple[str, str]]:
    def call(arguments: str, name: str = "read_page") -> str:
        return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'

    return [
        ("stop", "I will read.\n" + call('{"page": 1}') + "<|im_end|>"),
        ("stop", call('{"page": 2}') + call('{"page": 1}') + "<|im_end|>"),
        ("stop", call('{"page": 99}') + "<|im_end|>"),
        ("stop", call('{"page": "two"}') + "<|im_end|>"),
        ("stop", call("{}", name="search") + "<|im_end|>"),
        ("stop", call('{"page": 3}') + call('{"page": 1') + "<|im_end|>"),
        ("stop", "Answer: 7<|im_end|>"),
    ]


def _env_pair(module: Any, tokenizer: Any, *, problem_seed: int = 3) -> tuple[Any, Any]:
    from tinker_cookbook import renderers as cb_renderers
    from tinker_cookbook.recipes.rl_numerics_check import env as cb_env

    task = _task(module)
    problem = module.sample_problem(random.Random(problem_seed), _corpus(), task)
    ours = module.build_env(problem, renderers.get_renderer("qwen3", tokenizer), task, 4096, 16)
    theirs: Any = cb_env.build_env(
        problem, cb_renderers.get_renderer("qwen3", tokenizer), task, 4096, 16
    )
    return ours, theirs


def _same_step(ours: Any, theirs: Any) -> None:
    assert ours.reward == pytest.approx(theirs.reward)
    assert ours.episode_done == theirs.episode_done
    assert ours.next_observation.to_ints() == theirs.next_observation.to_ints()
    assert list(ours.next_stop_condition) == list(theirs.next_stop_condition)
    ours_metrics = {k: v for k, v in ours.metrics.items() if not k.startswith("tool_error")}
    assert ours_metrics == pytest.approx(dict(theirs.metrics))
    assert dict(ours.logs) == dict(theirs.logs)


def test_steps_match_the_cookbook_on_scripted_turns(module: Any, tokenizer: Any) -> None:
    # the recipe's own ExtensionCheckedEnv: it ends a multi-turn episode with
    # dataclasses.replace(result, metrics=...), which rlpure's records support
    ours, theirs = _env_pair(module, tokenizer)
    first_ours, first_theirs = (
        asyncio.run(ours.initial_observation()),
        asyncio.run(theirs.initial_observation()),
    )
    assert first_ours[0].to_ints() == first_theirs[0].to_ints()
    assert list(first_ours[1]) == list(first_theirs[1])
    tool_errors = []
    for stop_reason, text in _scripted(tokenizer):
        action = tokenizer.encode(text, add_special_tokens=False)
        a = asyncio.run(ours.step(action, extra={"stop_reason": stop_reason}))
        b = asyncio.run(theirs.step(action, extra={"stop_reason": stop_reason}))
        _same_step(a, b)
        tool_errors.append({k: v for k, v in a.metrics.items() if k.startswith("tool_error")})
        if b.episode_done:
            break
    assert len(tool_errors) == 7 and b.episode_done and b.metrics["stop/completed"] == 1.0
    # page 99 is an error result (error_tool_result's default type); "two" fails validation;
    # an unknown tool is not found; a second call in one turn is the recipe's own rejection
    assert tool_errors[2] == {"tool_error": 1.0, "tool_error/execution_error": 1.0}
    assert tool_errors[3] == {"tool_error": 1.0, "tool_error/validation_failed": 1.0}
    assert tool_errors[4] == {"tool_error": 1.0, "tool_error/tool_not_found": 1.0}
    assert tool_errors[1] == {} and tool_errors[5] == {}


@pytest.mark.parametrize(
    ("stop_reason", "text"),
    [
        ("length", '<tool_call>\n{"name": "read_pa'),
        ("stop", "never closes the turn"),
        (
            "stop",
            '<tool_call>\n{"name": "read_page", "arguments": {"page": 1\n</tool_call><|im_end|>',
        ),
    ],
)
def test_first_turn_endings_match_the_cookbook(
    module: Any, tokenizer: Any, stop_reason: str, text: str
) -> None:
    ours, theirs = _env_pair(module, tokenizer)  # the recipe's own EnvFromMessageEnv subclass
    asyncio.run(ours.initial_observation())
    asyncio.run(theirs.initial_observation())
    action = tokenizer.encode(text, add_special_tokens=False)
    a = asyncio.run(ours.step(action, extra={"stop_reason": stop_reason}))
    b = asyncio.run(theirs.step(action, extra={"stop_reason": stop_reason}))
    assert b.episode_done
    _same_step(a, b)


def test_context_overflow_matches_the_cookbook(module: Any, tokenizer: Any) -> None:
    from tinker_cookbook import renderers as cb_renderers
    from tinker_cookbook.recipes.rl_numerics_check import env as cb_env

    task = _task(module)
    problem = module.sample_problem(random.Random(5), _corpus(), task)
    prompt = renderers.get_renderer("qwen3", tokenizer).build_generation_prompt(
        [{"role": "user", "content": problem.prompt}]
    )
    budget = prompt.length + 400  # the prompt (with the tool declaration) overflows it
    ours = module.build_env(problem, renderers.get_renderer("qwen3", tokenizer), task, budget, 16)
    theirs: Any = cb_env.build_env(
        problem, cb_renderers.get_renderer("qwen3", tokenizer), task, budget, 16
    )
    a: Any = asyncio.run(ours.initial_observation())
    b: Any = asyncio.run(theirs.initial_observation())
    if hasattr(b, "reward"):  # the declared tools already overflow: InitialObservationOverflow
        assert (a.reward, dict(a.metrics), dict(a.logs)) == (
            b.reward,
            dict(b.metrics),
            dict(b.logs),
        )
        return
    action = tokenizer.encode(
        '<tool_call>\n{"name": "read_page", "arguments": {"page": 1}}\n</tool_call><|im_end|>',
        add_special_tokens=False,
    )
    for _ in range(4):
        ra = asyncio.run(ours.step(action, extra={"stop_reason": "stop"}))
        rb = asyncio.run(theirs.step(action, extra={"stop_reason": "stop"}))
        _same_step(ra, rb)
        if rb.episode_done:
            break
    assert rb.episode_done and rb.metrics.get("stop/context_overflow") == 1.0


def test_an_initial_overflow_matches_the_cookbook(module: Any, tokenizer: Any) -> None:
    from tinker_cookbook import renderers as cb_renderers
    from tinker_cookbook.recipes.rl_numerics_check import env as cb_env

    task = _task(module)
    problem = module.sample_problem(random.Random(5), _corpus(), task)
    ours = module.build_env(problem, renderers.get_renderer("qwen3", tokenizer), task, 64, 16)
    theirs: Any = cb_env.build_env(
        problem, cb_renderers.get_renderer("qwen3", tokenizer), task, 64, 16
    )
    a: Any = asyncio.run(ours.initial_observation())
    b: Any = asyncio.run(theirs.initial_observation())
    assert (a.reward, dict(a.metrics), dict(a.logs)) == (b.reward, dict(b.metrics), dict(b.logs))
    assert a.metrics == {"max_tokens_reached": 1.0, "stop/max_tokens": 1.0}


def _tools_of(lib: Any) -> dict[str, Any]:
    """Three functions made tools by `lib.tool` (annotations resolve in this module)."""

    async def add(
        a: Annotated[int, "first addend"], b: Annotated[float, Field(description="second")] = 2
    ) -> Any:
        """Adds two numbers."""
        return lib.simple_tool_result(str(a + b))

    async def explode(reason: str, times: list[int] | None = None) -> Any:
        """Raises."""
        raise RuntimeError(reason)

    def wrong_return() -> Any:
        """Returns a string."""
        return "4"

    return {f.__name__: lib.tool(f) for f in (add, explode, wrong_return)}


def _both_tools() -> tuple[dict[str, Any], dict[str, Any]]:
    """The same functions as tools of ours and of the cookbook's `tool_use`."""
    from tinker_cookbook import tool_use as cb_tool_use

    from shell.cookbook import tool_use

    return _tools_of(tool_use), _tools_of(cb_tool_use)


@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("add", '{"a": 1, "b": 0.5}'),
        ("add", '{"a": 1}'),
        ("missing", "{}"),
        ("add", '{"a": 1'),
        ("add", '{"a": "one"}'),
        ("add", "[1]"),
        ("explode", '{"reason": "boom"}'),
        ("wrong_return", "{}"),
    ],
)
def test_tool_calls_give_the_cookbooks_results(name: str, arguments: str) -> None:
    from tinker_cookbook.renderers.base import ToolCall as CbToolCall
    from tinker_cookbook.tool_use import handle_tool_call as cb_handle_tool_call

    from shell.cookbook.renderers.base import ToolCall
    from shell.cookbook.tool_use import handle_tool_call

    ours, theirs = _both_tools()
    for tool_name in ours:
        assert ours[tool_name].to_spec() == theirs[tool_name].to_spec()
    call = ToolCall(function=ToolCall.FunctionBody(name=name, arguments=arguments), id="c7")
    cb_call = CbToolCall(function=CbToolCall.FunctionBody(name=name, arguments=arguments), id="c7")
    a = asyncio.run(handle_tool_call(ours, call))
    b = asyncio.run(cb_handle_tool_call(theirs, cb_call))
    assert (a.messages, a.should_stop, a.metrics, a.metadata) == (
        b.messages,
        b.should_stop,
        b.metrics,
        b.metadata,
    )
