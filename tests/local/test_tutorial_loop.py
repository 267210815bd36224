"""A GRPO loop written against the Tinker SDK the way Tutorial 104 ("first RL") writes it.

Nothing here uses rlpure's loop, records or datum assembly: it builds `tinker.Datum`s by hand
from `SampleResponse`s and drives the clients through the SDK's async API. The only change from
a Tinker script is the service client: `LocalServiceClient(seed=...)` instead of
`tinker.ServiceClient()`. That is the drop-in promise of the local backend.

Two models run the same loop (`tutorial_loop`): the toy `rlpure/tiny` on raw byte prompts,
long enough to learn, and the real `HuggingFaceTB/SmolLM2-135M-Instruct` (the packaged GGUF)
for two short steps with prompts and replies through its chat renderer, as the tutorial does
(`get_recommended_renderer_name`, `build_generation_prompt`, `get_stop_sequences`,
`parse_response`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import pytest
import tinker
from tinker import TensorData

from rlpure.model import ByteTokenizer
from shell import LocalServiceClient

GROUP_SIZE = 8
PROMPTS = ["Name a letter: ", "Letter please: ", "Say one: ", "Go: "]
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"


def reward(text: str) -> float:
    """1 when the answer starts with a lowercase ASCII letter (~10% of random bytes)."""
    return float(bool(text) and "a" <= text[0] <= "z")


class LoopResult(NamedTuple):
    """What `tutorial_loop` saw, per step.

    Attributes:
        mean_rewards: mean reward of each step's samples.
        skipped: groups skipped because every sample got the same reward.
        num_datums: datums trained per step (0: the step had no signal and did not train).
        losses: `loss:sum` of each step that trained.
        probe_logprobs: the probe datum's logprobs at each step that trained.
    """

    mean_rewards: list[float]
    skipped: int
    num_datums: list[int]
    losses: list[float]
    probe_logprobs: list[np.ndarray]


async def tutorial_loop(
    training_client: Any,
    prompts: Sequence[tinker.ModelInput],
    *,
    score: Callable[[Sequence[int]], float],
    sampling_params: tinker.SamplingParams,
    adam_params: tinker.AdamParams,
    steps: int,
    group_size: int,
    probe: tinker.Datum | None = None,
) -> LoopResult:
    """Tutorial 104's loop: sample a group per prompt, centre its rewards, train on the datums.

    `score` maps a sampled sequence's tokens to its reward. `probe` (not the tutorial's): a
    datum with zero advantages trained beside the batch of each step (no gradient); its
    logprobs at each step come back in `LoopResult.probe_logprobs`, so a test sees the
    weights move without another compiled call.
    """
    result = LoopResult([], 0, [], [], [])
    skipped = 0
    for _ in range(steps):
        sampling_client = await training_client.save_weights_and_get_sampling_client_async()
        responses = await asyncio.gather(
            *[
                sampling_client.sample_async(
                    prompt=prompt, num_samples=group_size, sampling_params=sampling_params
                )
                for prompt in prompts
            ]
        )
        datums, step_rewards = [], []
        for prompt, response in zip(prompts, responses, strict=True):
            rewards_G = [score(seq.tokens) for seq in response.sequences]
            step_rewards.extend(rewards_G)
            mean = sum(rewards_G) / len(rewards_G)
            advantages_G = [r - mean for r in rewards_G]
            if all(a == 0.0 for a in advantages_G):
                skipped += 1  # a degenerate group carries no signal
                continue
            prompt_tokens = prompt.to_ints()
            for seq, advantage in zip(response.sequences, advantages_G, strict=True):
                tokens = prompt_tokens + list(seq.tokens)
                n_ob = len(prompt_tokens) - 1
                assert seq.logprobs is not None
                datums.append(
                    tinker.Datum(
                        model_input=tinker.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={
                            "target_tokens": TensorData.from_numpy(np.array(tokens[1:])),
                            "logprobs": TensorData.from_numpy(
                                np.array([0.0] * n_ob + list(seq.logprobs), np.float32)
                            ),
                            "advantages": TensorData.from_numpy(
                                np.array([0.0] * n_ob + [advantage] * len(seq.tokens), np.float32)
                            ),
                        },
                    )
                )
        result.mean_rewards.append(float(np.mean(step_rewards)))
        result.num_datums.append(len(datums))
        if not datums:
            continue
        batch = datums if probe is None else [*datums, probe]
        fwd_bwd_future = await training_client.forward_backward_async(
            batch, loss_fn="importance_sampling"
        )
        optim_future = await training_client.optim_step_async(adam_params)
        fwd_bwd_result = await fwd_bwd_future.result_async()
        await optim_future.result_async()
        assert len(fwd_bwd_result.loss_fn_outputs) == len(batch)
        for datum, output in zip(batch, fwd_bwd_result.loss_fn_outputs, strict=True):
            assert len(output["logprobs"].tolist()) == datum.model_input.length
            assert np.isfinite(output["logprobs"].to_numpy()).all()
        assert np.isfinite(fwd_bwd_result.metrics["loss:sum"])
        result.losses.append(float(fwd_bwd_result.metrics["loss:sum"]))
        if probe is not None:
            result.probe_logprobs.append(fwd_bwd_result.loss_fn_outputs[-1]["logprobs"].to_numpy())
    return result._replace(skipped=skipped)


async def toy_loop(steps: int, seed: int) -> LoopResult:
    service_client = LocalServiceClient(seed=seed)
    training_client = await service_client.create_lora_training_client_async(
        base_model="rlpure/tiny", rank=32
    )
    tokenizer = training_client.get_tokenizer()

    def score(tokens: Sequence[int]) -> float:
        # Hugging Face types decode `str | list[str]` (a list for a batch of sequences).
        text = tokenizer.decode(tokens, skip_special_tokens=True)
        assert isinstance(text, str)
        return reward(text)

    return await tutorial_loop(
        training_client,
        [tinker.ModelInput.from_ints(tokenizer.encode(p)) for p in PROMPTS],
        score=score,
        sampling_params=tinker.SamplingParams(max_tokens=4, temperature=1.0, stop=["\n"]),
        adam_params=tinker.AdamParams(learning_rate=1e-2, beta1=0.9, beta2=0.95, eps=1e-8),
        steps=steps,
        group_size=GROUP_SIZE,
    )


def test_tutorial_style_grpo_loop_runs_and_learns_on_the_local_backend():
    result = asyncio.run(toy_loop(steps=16, seed=0))
    assert result.skipped > 0  # degenerate groups occurred and were skipped
    assert np.mean(result.mean_rewards[:3]) < 0.5
    assert np.mean(result.mean_rewards[-3:]) > 0.8, result.mean_rewards


def _require_packaged_smollm2() -> None:
    from shell.errors import ConfigError
    from shell.local._models import PACKAGED_MODELS, packaged_model_path

    try:
        packaged_model_path(SMOLLM2, PACKAGED_MODELS[SMOLLM2])
    except ConfigError as err:
        pytest.skip(str(err))


def brevity_reward(text: str) -> float:
    """Shorter replies score higher: `1 / (1 + words)`.

    Graded, so a group of a few samples almost never ties (a tie would build no datum)."""
    return 1.0 / (1.0 + len(text.split()))


@pytest.mark.slow
def test_tutorial_loop_on_smollm2_builds_datums_and_trains():
    _require_packaged_smollm2()
    from shell.cookbook import model_info, renderers

    async def run() -> LoopResult:
        service_client = LocalServiceClient(seed=0)
        training_client = await service_client.create_lora_training_client_async(
            base_model=SMOLLM2, rank=8
        )
        tokenizer = training_client.get_tokenizer()
        renderer = renderers.get_renderer(
            model_info.get_recommended_renderer_name(SMOLLM2), tokenizer
        )
        questions = ["Name a fruit.", "Name a color."]
        prompts = [
            renderer.build_generation_prompt([{"role": "user", "content": q}]) for q in questions
        ]
        # The renderer's prompt is the model's own chat template, token for token.
        assert not isinstance(tokenizer, ByteTokenizer)  # a transformers fast tokenizer
        template = tokenizer.apply_chat_template(
            [{"role": "user", "content": questions[0]}], add_generation_prompt=True, tokenize=False
        )
        assert isinstance(template, str)
        assert prompts[0].to_ints() == tokenizer.encode(template, add_special_tokens=False)

        def score(tokens: Sequence[int]) -> float:
            message, _ = renderer.parse_response(list(tokens))
            return brevity_reward(renderers.get_text_content(message))

        conversation = renderer.build_supervised_example(
            [
                {"role": "user", "content": questions[0]},
                {"role": "assistant", "content": "A banana."},
            ]
        )[0].to_ints()
        zeros = np.zeros(len(conversation) - 1, np.float32)
        probe = tinker.Datum(
            model_input=tinker.ModelInput.from_ints(conversation[:-1]),
            loss_fn_inputs={
                "target_tokens": TensorData.from_numpy(np.array(conversation[1:])),
                "logprobs": TensorData.from_numpy(zeros),
                "advantages": TensorData.from_numpy(zeros),
            },
        )
        result = await tutorial_loop(
            training_client,
            prompts,
            score=score,
            sampling_params=tinker.SamplingParams(
                max_tokens=5, temperature=1.0, stop=renderer.get_stop_sequences()
            ),
            adam_params=tinker.AdamParams(learning_rate=1e-3, beta1=0.9, beta2=0.95, eps=1e-8),
            steps=2,
            group_size=4,
            probe=probe,
        )
        return result

    result = asyncio.run(run())
    assert result.num_datums == [8, 8], result  # 2 groups x 4 samples, no tie
    assert len(result.losses) == 2 and np.isfinite(result.losses).all()
    assert all(0.0 < r <= 1.0 for r in result.mean_rewards)
    before_T, after_T = result.probe_logprobs
    assert np.abs(after_T - before_T).max() > 1e-4  # the first update moved the weights
