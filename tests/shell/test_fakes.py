"""The scripted fakes behave as the completers they stand in for."""

import asyncio

from rlpure.records import ModelInput
from shell.fakes import ScriptedPolicy


def test_scripted_policy_cuts_its_action_to_the_per_call_budget() -> None:
    policy = ScriptedPolicy(actions=[[1, 2, 3]], logprob=-0.5)
    full = asyncio.run(policy(ModelInput.from_ints([9]), ()))
    cut = asyncio.run(policy(ModelInput.from_ints([9]), (), max_tokens=2))
    roomy = asyncio.run(policy(ModelInput.from_ints([9]), (), max_tokens=5))
    assert full.tokens.tolist() == [1, 2, 3] and full.stop_reason == "stop"
    assert cut.tokens.tolist() == [1, 2] and cut.stop_reason == "length"
    assert cut.logprobs is not None and cut.logprobs.tolist() == [-0.5, -0.5]
    assert roomy == full


def test_scripted_group_builder_takes_the_cookbook_keywords() -> None:
    from shell.fakes import ScriptedEnv, ScriptedGroupBuilder

    builder = ScriptedGroupBuilder(lambda i: ScriptedEnv(), group_size=1, group_rewards=[0.5])
    rewards = asyncio.run(builder.compute_group_rewards(trajectory_group=[None], env_group=[]))
    assert rewards == [(0.5, {"group_reward": 0.5})]
