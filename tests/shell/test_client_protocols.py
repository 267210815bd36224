"""The `shell.clients` protocols: the SDK's, the local backend's and the fakes' clients fit them.

Two proofs per implementation:
- static: assignments to the protocol types below, which mypy checks (it runs over tests);
  `_sdk_clients_fit` is never called, it is there for mypy (the SDK's clients need a session);
- runtime: `isinstance` against the `runtime_checkable` protocols (the members exist), and
  each method's parameters — names, kinds and defaults, in order — compared with the
  protocol's (equal to the SDK's; an implementation may only add defaulted parameters).
"""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path

import pytest
import tinker

from shell.clients import APIFuture, SamplingClient, ServiceClient, TrainingClient
from shell.fakes import FakeSamplingClient, FakeServiceClient, FakeTrainingClient
from shell.jobs.demo import BaseModelServiceClient
from shell.local import LocalSamplingClient, LocalServiceClient, LocalTrainingClient

PROTOCOLS: dict[type, tuple[str, ...]] = {
    ServiceClient: (
        "create_lora_training_client",
        "create_training_client_from_state",
        "create_training_client_from_state_with_optimizer",
        "create_sampling_client",
    ),
    TrainingClient: (
        "forward",
        "forward_backward",
        "optim_step",
        "save_state",
        "save_weights_for_sampler",
        "save_weights_and_get_sampling_client",
        "get_tokenizer",
    ),
    SamplingClient: ("sample", "compute_logprobs"),
}
"""Every method of each protocol (pinned: a method added to a protocol is added here too)."""

IMPLEMENTATIONS: dict[type, tuple[type, ...]] = {
    ServiceClient: (
        tinker.ServiceClient,
        LocalServiceClient,
        FakeServiceClient,
        BaseModelServiceClient,
    ),
    TrainingClient: (tinker.TrainingClient, LocalTrainingClient, FakeTrainingClient),
    SamplingClient: (tinker.SamplingClient, LocalSamplingClient, FakeSamplingClient),
}


def _sdk_clients_fit(
    service: tinker.ServiceClient,
    training: tinker.TrainingClient,
    sampling: tinker.SamplingClient,
) -> None:
    """Checked by mypy only: the SDK's clients, and the futures of clients they return."""
    as_service: ServiceClient = service
    as_training: TrainingClient = training
    as_sampling: SamplingClient = sampling
    opened: APIFuture[TrainingClient] = service.create_lora_training_client("Qwen/Qwen3-8B")
    restored: APIFuture[TrainingClient] = service.create_training_client_from_state_with_optimizer(
        "tinker://run/state"
    )
    sampler: APIFuture[SamplingClient] = training.save_weights_and_get_sampling_client()
    del as_service, as_training, as_sampling, opened, restored, sampler


def _members(protocol: type) -> set[str]:
    return {
        name
        for name, value in vars(protocol).items()
        if not name.startswith("_") and inspect.isfunction(value)
    }


def _parameters(function: object) -> list[tuple[str, inspect._ParameterKind, object]]:
    """`(name, kind, default)` of each parameter but `self`."""
    assert callable(function)
    parameters = list(inspect.signature(function).parameters.values())
    assert parameters[0].name == "self"
    return [(p.name, p.kind, p.default) for p in parameters[1:]]


def test_the_protocols_hold_the_methods_the_shell_calls() -> None:
    for protocol, names in PROTOCOLS.items():
        assert _members(protocol) == set(names), protocol.__name__


@pytest.mark.parametrize("protocol", list(PROTOCOLS), ids=lambda p: p.__name__)
def test_the_protocols_have_the_sdk_signatures(protocol: type) -> None:
    sdk = IMPLEMENTATIONS[protocol][0]
    for name in PROTOCOLS[protocol]:
        method = getattr(sdk, name)
        assert _parameters(getattr(protocol, name)) == _parameters(method), name
        assert getattr(method, "__deprecated__", None) is None, f"{name} is deprecated"
        assert not inspect.iscoroutinefunction(method), f"{name} returns a future, not a coroutine"


@pytest.mark.parametrize(
    ("protocol", "implementation"),
    [(p, impl) for p, impls in IMPLEMENTATIONS.items() for impl in impls],
    ids=lambda x: x.__name__,
)
def test_each_implementation_takes_every_call_the_protocol_allows(
    protocol: type, implementation: type
) -> None:
    for name in PROTOCOLS[protocol]:
        expected = _parameters(getattr(protocol, name))
        got = _parameters(getattr(implementation, name))
        where = f"{implementation.__name__}.{name}"
        assert got[: len(expected)] == expected, where
        for extra, kind, default in got[len(expected) :]:
            assert kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD) or (
                default is not inspect.Parameter.empty
            ), f"{where}: extra parameter {extra} has no default"
        assert not inspect.iscoroutinefunction(getattr(implementation, name)), where


def test_the_local_backend_fits_the_protocols(tmp_path: Path) -> None:
    local_service = LocalServiceClient(seed=0, checkpoint_dir=tmp_path)
    local_training = local_service.create_lora_training_client("rlpure/tiny").result()
    local_sampling = local_training.save_weights_and_get_sampling_client().result()
    service: ServiceClient = local_service
    training: TrainingClient = local_training
    sampling: SamplingClient = local_sampling
    assert isinstance(service, ServiceClient)
    assert isinstance(training, TrainingClient)
    assert isinstance(sampling, SamplingClient)

    async def through_the_protocols() -> tuple[TrainingClient, SamplingClient]:
        opened = service.create_lora_training_client("rlpure/tiny")
        assert isinstance(opened, APIFuture)
        client = await opened
        return client, await client.save_weights_and_get_sampling_client()

    client, sampler = asyncio.run(through_the_protocols())
    assert isinstance(client, LocalTrainingClient) and isinstance(sampler, LocalSamplingClient)


def test_the_fakes_fit_the_protocols() -> None:
    fake_service = FakeServiceClient()
    fake_training = fake_service.create_lora_training_client("m").result()
    fake_sampling = fake_training.save_weights_and_get_sampling_client().result()
    service: ServiceClient = fake_service
    training: TrainingClient = fake_training
    sampling: SamplingClient = fake_sampling
    assert isinstance(service, ServiceClient)
    assert isinstance(training, TrainingClient)
    assert isinstance(sampling, SamplingClient)

    async def through_the_protocols() -> tuple[TrainingClient, SamplingClient]:
        opened = service.create_lora_training_client("m")
        assert isinstance(opened, APIFuture)
        client = await opened
        return client, await client.save_weights_and_get_sampling_client()

    client, sampler = asyncio.run(through_the_protocols())
    assert isinstance(client, FakeTrainingClient) and isinstance(sampler, FakeSamplingClient)


def test_the_demo_service_fits_the_protocol() -> None:
    wrapped = BaseModelServiceClient(FakeServiceClient(), base_model="m", base_state_path="/s")
    service: ServiceClient = wrapped
    assert isinstance(service, ServiceClient)


def test_isinstance_refuses_a_client_missing_a_method() -> None:
    class SampleOnly:
        def sample(self) -> None: ...

    assert not isinstance(SampleOnly(), SamplingClient)
    assert not isinstance(FakeSamplingClient(), TrainingClient)


def test_a_backend_is_read_from_what_the_client_declares_not_its_class() -> None:
    from unittest.mock import MagicMock

    from shell.clients import backend_of
    from shell.errors import ConfigError
    from shell.fakes import FakeServiceClient
    from shell.local import LocalServiceClient

    class Forwarding:  # a wrapper such as the demo's BaseModelServiceClient
        def __init__(self, inner: object) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> object:
            return getattr(self._inner, name)

    class Declares:
        backend_kind = "gpu-cluster"

    local = LocalServiceClient()
    assert backend_of(local) == "local"
    assert backend_of(Forwarding(local)) == "local"
    assert backend_of(FakeServiceClient()) == "fake"
    assert backend_of(object()) == "tinker"  # the SDK's client declares nothing
    assert backend_of(MagicMock()) == "tinker"  # answers every attribute, declares nothing
    with pytest.raises(ConfigError, match="backend_kind='gpu-cluster'"):
        backend_of(Declares())
