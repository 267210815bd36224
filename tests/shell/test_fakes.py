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
