"""A GRPO loop written against the Tinker SDK the way Tutorial 104 ("first RL") writes it.

Nothing here uses rlpure's loop, records or datum assembly: it builds `tinker.Datum`s by hand
from `SampleResponse`s and drives the clients through the SDK's async API. The only change from
a Tinker script is the service client: `LocalServiceClient(seed=...)` instead of
`tinker.ServiceClient()`. That is the drop-in promise of the local backend.
"""

from __future__ import annotations

import asyncio

import numpy as np
import tinker
from tinker import TensorData

from shell import LocalServiceClient

GROUP_SIZE = 8
PROMPTS = ["Name a letter: ", "Letter please: ", "Say one: ", "Go: "]


def reward(text: str) -> float:
    """1 when the answer starts with a lowercase ASCII letter (~10% of random bytes)."""
    return float(bool(text) and "a" <= text[0] <= "z")


async def tutorial_loop(steps: int, seed: int) -> tuple[list[float], int]:
    service_client = LocalServiceClient(seed=seed)
    training_client = await service_client.create_lora_training_client_async(
        base_model="rlpure/tiny", rank=32
    )
    tokenizer = training_client.get_tokenizer()
    sampling_params = tinker.SamplingParams(max_tokens=4, temperature=1.0, stop=["\n"])
    adam_params = tinker.AdamParams(learning_rate=1e-2, beta1=0.9, beta2=0.95, eps=1e-8)
    mean_rewards, skipped = [], 0
    for _ in range(steps):
        sampling_client = await training_client.save_weights_and_get_sampling_client_async()
        prompts = [tinker.ModelInput.from_ints(tokenizer.encode(p)) for p in PROMPTS]
        responses = await asyncio.gather(
            *[
                sampling_client.sample_async(
                    prompt=prompt, num_samples=GROUP_SIZE, sampling_params=sampling_params
                )
                for prompt in prompts
            ]
        )
        datums, step_rewards = [], []
        for prompt, response in zip(prompts, responses, strict=True):
            rewards_G: list[float] = []
            for seq in response.sequences:
                # Hugging Face types decode `str | list[str]` (a list for a batch of sequences).
                text = tokenizer.decode(seq.tokens, skip_special_tokens=True)
                assert isinstance(text, str)
                rewards_G.append(reward(text))
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
        mean_rewards.append(float(np.mean(step_rewards)))
        if not datums:
            continue
        fwd_bwd_future = await training_client.forward_backward_async(
            datums, loss_fn="importance_sampling"
        )
        optim_future = await training_client.optim_step_async(adam_params)
        fwd_bwd_result = await fwd_bwd_future.result_async()
        await optim_future.result_async()
        assert len(fwd_bwd_result.loss_fn_outputs) == len(datums)
        for datum, output in zip(datums, fwd_bwd_result.loss_fn_outputs, strict=True):
            assert len(output["logprobs"].tolist()) == datum.model_input.length
        assert np.isfinite(fwd_bwd_result.metrics["loss:sum"])
    return mean_rewards, skipped


def test_tutorial_style_grpo_loop_runs_and_learns_on_the_local_backend():
    rewards, skipped = asyncio.run(tutorial_loop(steps=16, seed=0))
    assert skipped > 0  # degenerate groups occurred and were skipped
    assert np.mean(rewards[:3]) < 0.5
    assert np.mean(rewards[-3:]) > 0.8, rewards
