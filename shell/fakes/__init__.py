"""Scripted fakes: policies, envs, datasets and a Tinker SDK stand-in that fail on cue.

For tests and for users who want to exercise the loop without a model or a network. This
module re-exports the fakes from two modules, so importers need only `shell.fakes`:
- `shell.fakes` — `ScriptedPolicy` (a `TokenCompleter` returning scripted actions,
  failing at chosen calls) and `ScriptedEnv` / `ScriptedGroupBuilder` / `ScriptedDataset`
  (envs with scripted rewards, latency and failures at chosen steps or creation indices,
  counting `make_envs` and `cleanup`).
- `shell.fakes` — `FakeServiceClient` → `FakeTrainingClient` → `FakeSamplingClient`, the
  subset of the Tinker SDK the loop uses, with the SDK's own types and SDK 0.38 calling
  conventions (methods return a `tinker.APIFuture` at once; await it), an ordered `events` log
  of every call, submit and await, `FakeFuture`, and the `FakeCheckpointStore` that outlives
  clients, as a server would. Its docstring states the sampler's conventions.
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
