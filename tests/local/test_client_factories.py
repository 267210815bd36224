"""The service's client factories: Adam-only optimizers and the SDK's signatures.

- Non-Adam optimizers are refused by every factory that takes `optimizer` (sync and async), as
  `create_lora_training_client` refuses them, with a message naming the factory; `None` and
  `AdamOptimizerConfig` are accepted.
- The factories' signatures mirror `tinker.ServiceClient`'s (SDK 0.38), plus one local
  extension on the training client factories (keyword-only `training_run_id=None`, for a host
  that names its runs), the async from-state factories forward every argument, and no client
  method is annotated `-> Any`.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tinker
from tinker import types

from shell.local import LocalSamplingClient, LocalServiceClient, LocalTrainingClient
from tests.local.micro import (
    MICRO,
    MICRO_NAME,
    micro_service,
)

NON_ADAM = [
    "sgd",
    types.DimuonOptimizerConfig(),
    types.optimizer.OptimizerConfigBase(type="sgd"),
]


def _factory_calls(service: LocalServiceClient, path: str) -> dict[str, Callable[[Any], Any]]:
    """Every factory that takes `optimizer`, called with it (async ones run to completion)."""
    return {
        "create_lora_training_client": lambda opt: service.create_lora_training_client(
            MICRO_NAME, optimizer=opt
        ),
        "create_lora_training_client_async": lambda opt: asyncio.run(
            service.create_lora_training_client_async(MICRO_NAME, optimizer=opt)
        ),
        "create_training_client_from_state": lambda opt: service.create_training_client_from_state(
            path, optimizer=opt
        ),
        "create_training_client_from_state_async": lambda opt: asyncio.run(
            service.create_training_client_from_state_async(path, optimizer=opt)
        ),
    }


@pytest.mark.parametrize("optimizer", NON_ADAM, ids=["str", "dimuon", "base-sgd"])
def test_every_factory_refuses_a_non_adam_optimizer(
    pristine: Path, tmp_path: Path, optimizer: Any
) -> None:
    service = micro_service(tmp_path)
    messages = {}
    for name, call in _factory_calls(service, str(pristine)).items():
        with pytest.raises(NotImplementedError, match="Adam optimizer only") as info:
            call(optimizer)
        messages[name] = str(info.value)
    for name, message in messages.items():
        assert name.removesuffix("_async") in message and repr(optimizer) in message


@pytest.mark.parametrize("optimizer", [None, types.AdamOptimizerConfig()], ids=["none", "adam"])
def test_every_factory_accepts_adam(pristine: Path, tmp_path: Path, optimizer: Any) -> None:
    service = micro_service(tmp_path)
    for call in _factory_calls(service, str(pristine)).values():
        client = call(optimizer)
        client = client.result() if isinstance(client, tinker.APIFuture) else client
        assert isinstance(client, LocalTrainingClient) and client.config == MICRO


@pytest.mark.parametrize(
    "name",
    [
        "create_lora_training_client",
        "create_lora_training_client_async",
        "create_training_client_from_state",
        "create_training_client_from_state_async",
        "create_training_client_from_state_with_optimizer",
        "create_training_client_from_state_with_optimizer_async",
        "create_sampling_client",
        "create_sampling_client_async",
    ],
)
def test_factory_signatures_mirror_the_sdk(name: str) -> None:
    def shape(fn: Any) -> list[tuple[str, Any, Any]]:
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    extension = []
    if "training_client" in name:
        extension = [("training_run_id", inspect.Parameter.KEYWORD_ONLY, None)]
    assert shape(getattr(LocalServiceClient, name)) == [
        *shape(getattr(tinker.ServiceClient, name)),
        *extension,
    ]


def test_the_async_from_state_factories_forward_every_argument(
    pristine: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = micro_service(tmp_path)  # its own folder: the run names below are fixed
    seen: dict[str, dict[str, Any]] = {}
    for name in (
        "create_training_client_from_state",
        "create_training_client_from_state_with_optimizer",
    ):
        original = getattr(service, name)

        def spy(*args: Any, _name: str = name, _original: Any = original, **kwargs: Any) -> Any:
            seen[_name] = inspect.signature(_original).bind(*args, **kwargs).arguments
            return _original(*args, **kwargs)

        monkeypatch.setattr(service, name, spy)
    adam = types.AdamOptimizerConfig()
    common: dict[str, Any] = {
        "path": str(pristine),
        "base_model": MICRO_NAME,
        "user_metadata": {"k": "v"},
        "weights_access_token": "token",
    }
    asyncio.run(
        service.create_training_client_from_state_async(
            **common, optimizer=adam, training_run_id="named-0"
        )
    )
    asyncio.run(
        service.create_training_client_from_state_with_optimizer_async(
            **common, training_run_id="named-1"
        )
    )
    assert seen == {
        "create_training_client_from_state": {
            **common,
            "optimizer": adam,
            "training_run_id": "named-0",
        },
        "create_training_client_from_state_with_optimizer": {
            **common,
            "training_run_id": "named-1",
        },
    }


def test_no_client_method_is_annotated_any() -> None:
    for cls in (LocalServiceClient, LocalTrainingClient, LocalSamplingClient):
        for name, member in vars(cls).items():
            if inspect.isfunction(member):
                returned = inspect.signature(member).return_annotation
                assert returned != "Any", f"{cls.__name__}.{name} is annotated -> Any"
