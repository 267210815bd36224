"""Scripted fakes: policies, envs, datasets and a Tinker SDK stand-in that fail on cue.

For tests and for users who want to exercise the loop without a model or a network. This
facade gathers the fakes of two private modules, so importers need only `shell.fakes`:
- `_envs` — `ScriptedPolicy` (a `TokenCompleter` returning scripted actions,
  failing at chosen calls) and `ScriptedEnv` / `ScriptedGroupBuilder` / `ScriptedDataset`
  (envs with scripted rewards, latency and failures at chosen steps or creation indices,
  counting `make_envs` and `cleanup`).
- `_sdk` — `FakeServiceClient` → `FakeTrainingClient` → `FakeSamplingClient`, which satisfy
  the `shell.clients` protocols (the SDK methods the shell calls, with their SDK 0.38
  signatures), with the SDK's own types and calling conventions (methods return a
  `tinker.APIFuture` at once; await it), an ordered `events` log of every call, submit and
  await, `FakeFuture`, and the `FakeCheckpointStore` that outlives clients, as a server would.
  Its docstring states the sampler's conventions.
"""

from __future__ import annotations

from shell.fakes._envs import ScriptedDataset, ScriptedEnv, ScriptedGroupBuilder, ScriptedPolicy
from shell.fakes._sdk import (
    FakeCheckpointStore,
    FakeFuture,
    FakeSamplingClient,
    FakeServiceClient,
    FakeTrainingClient,
)

__all__ = [
    "FakeCheckpointStore",
    "FakeFuture",
    "FakeSamplingClient",
    "FakeServiceClient",
    "FakeTrainingClient",
    "ScriptedDataset",
    "ScriptedEnv",
    "ScriptedGroupBuilder",
    "ScriptedPolicy",
]
