"""`LocalServiceClient` stands in for `tinker.ServiceClient` wherever Tinker code constructs one.

The constructor takes every keyword of the SDK's (network-only ones accepted and ignored), the
service is a context manager that closes, training runs get fresh ids even when an earlier
process's run folders share the checkpoint directory, and `create_rest_client()` answers the
run and checkpoint calls the cookbook's `checkpoint_utils` makes (renderer-name metadata on
resume, deleting rolling checkpoints), from the checkpoint files.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from pathlib import Path

import pytest
import tinker
from tinker import types

from shell.errors import CheckpointError
from shell.local import LocalLookupError, LocalServiceClient
from tests.local.micro import MICRO, MICRO_NAME, micro_service


def test_the_constructor_takes_every_sdk_parameter_with_its_kind_and_default() -> None:
    sdk = inspect.signature(tinker.ServiceClient.__init__).parameters
    ours = inspect.signature(LocalServiceClient.__init__).parameters
    for name, parameter in sdk.items():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            continue  # the SDK's **kwargs: unknown keywords are a TypeError here (see below)
        assert name in ours, name
        assert (ours[name].kind, ours[name].default) == (parameter.kind, parameter.default), name
    sdk_order = [n for n, p in sdk.items() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    assert list(ours)[: len(sdk_order)] == sdk_order  # positional user_metadata, project_id


def test_the_cookbooks_constructor_call_works_and_keeps_the_meaningful_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TINKER_PROJECT_ID", raising=False)
    # `tinker_cookbook.rl.train.main`: tinker.ServiceClient(base_url=, user_metadata=, display_name=)
    service = LocalServiceClient(
        base_url=None, user_metadata={"recipe": "math_rl"}, display_name="run-1"
    )
    assert service.user_metadata == {"recipe": "math_rl"}
    assert service.display_name == "run-1" and service.project_id is None
    ignored = LocalServiceClient(
        {"k": "v"},
        "proj-1",
        base_url="https://tinker.example",
        api_key="tml-not-used",
        default_headers_overrides={"X-A": "1"},
    )
    assert ignored.user_metadata == {"k": "v"} and ignored.project_id == "proj-1"
    assert "tml-not-used" not in repr(vars(ignored))  # a key is never stored
    monkeypatch.setenv("TINKER_PROJECT_ID", "proj-env")
    assert LocalServiceClient().project_id == "proj-env"  # the SDK's fallback


def test_bad_constructor_values_are_refused_clearly() -> None:
    with pytest.raises(TypeError, match="checkpiont_dir"):
        LocalServiceClient(checkpiont_dir="x")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"LocalServiceClient\.base_url: expected a str or None"):
        LocalServiceClient(base_url=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"LocalServiceClient\.user_metadata"):
        LocalServiceClient(user_metadata={"k": 1})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match=r"LocalServiceClient\.seed"):
        LocalServiceClient(seed=-1)


def test_it_is_a_context_manager_that_closes_like_the_sdks(tmp_path: Path) -> None:
    with micro_service(tmp_path) as service:
        trainer = service.create_lora_training_client(MICRO_NAME).result()
    assert service.closed
    with pytest.raises(RuntimeError, match="LocalServiceClient is closed"):
        service.create_lora_training_client(MICRO_NAME)
    with pytest.raises(RuntimeError, match="LocalServiceClient is closed"):
        service.create_sampling_client(base_model=MICRO_NAME)
    with pytest.raises(RuntimeError, match="LocalServiceClient is closed"):
        service.__enter__()
    # clients made before the close keep working (nothing remote to release)
    assert trainer.save_state("s").result().path
    errored = micro_service(tmp_path)
    with pytest.raises(KeyError), errored:
        raise KeyError("boom")
    assert errored.closed
    assert micro_service(tmp_path).close("errored", "detail").result() is None
    with pytest.raises(ValueError, match="status must be"):
        micro_service(tmp_path).close("done")  # type: ignore[arg-type]


def test_a_service_sharing_a_checkpoint_dir_never_reuses_an_earlier_run_id(tmp_path: Path) -> None:
    first = micro_service(tmp_path).create_lora_training_client(MICRO_NAME).result()
    first.save_state("final").result()
    again = micro_service(tmp_path).create_lora_training_client(MICRO_NAME).result()
    assert (first.model_id, again.model_id) == ("local-0-0", "local-0-1")
    again.save_state("final").result()  # the same name, another run's folder: no clash
    assert (tmp_path / "local-0-0" / "state" / "final").is_dir()
    assert (tmp_path / "local-0-1" / "state" / "final").is_dir()


def test_the_rest_client_reports_the_run_metadata_of_a_checkpoint(tmp_path: Path) -> None:
    """What `checkpoint_utils.check_renderer_name_for_checkpoint_async` reads on resume."""
    service = micro_service(tmp_path)
    trainer = service.create_lora_training_client(
        MICRO_NAME, rank=8, user_metadata={"renderer_name": "role_colon"}
    ).result()
    state = trainer.save_state("000001", ttl_seconds=7200).result().path
    sampler = trainer.save_weights_for_sampler("000001", ttl_seconds=7200).result().path

    # another process: a new service on the same directory
    rest = micro_service(tmp_path).create_rest_client()
    run = rest.get_training_run_by_tinker_path(state).result()
    assert isinstance(run, types.TrainingRun)
    assert run.training_run_id == trainer.model_id and run.base_model == MICRO_NAME
    assert run.user_metadata == {"renderer_name": "role_colon"}
    assert run.last_checkpoint is not None and run.last_checkpoint.tinker_path == state
    assert run.last_sampler_checkpoint is not None
    assert run.last_sampler_checkpoint.tinker_path == sampler
    assert asyncio.run(_await(rest.get_training_run_by_tinker_path(sampler))) == run
    assert rest.get_training_run(trainer.model_id).result() == run
    listed = rest.list_checkpoints(trainer.model_id).result().checkpoints
    assert sorted((c.checkpoint_id, c.checkpoint_type) for c in listed) == [
        ("sampler_weights/000001", "sampler"),  # the SDK's ids (they were "sampler/…")
        ("weights/000001", "training"),
    ]
    assert all(c.expires_at is None for c in listed)  # local checkpoints never expire
    info = rest.get_weights_info_by_tinker_path(state).result()
    assert (info.base_model, info.is_lora) == (MICRO_NAME, False)
    # the service that opened the run knows its rank and metadata before any checkpoint
    fresh = service.create_lora_training_client(MICRO_NAME, user_metadata={"a": "b"}).result()
    known = service.create_rest_client().get_training_run(fresh.model_id).result()
    assert known.user_metadata == {"a": "b"} and known.lora_rank == 32
    assert known.last_checkpoint is None


async def _await(future: tinker.APIFuture[types.TrainingRun]) -> types.TrainingRun:
    return await future


@pytest.mark.parametrize("metadata", [{"step": 10}, "abc", {1: "x"}])
def test_a_save_refuses_metadata_that_is_not_str_to_str_and_writes_nothing(
    tmp_path: Path, metadata: object
) -> None:
    # the SDK's requests declare dict[str, str]; such a save used to succeed locally and
    # leave a checkpoint whose manifest could never be read back
    trainer = micro_service(tmp_path).create_lora_training_client(base_model=MICRO_NAME).result()
    for save in (trainer.save_state, trainer.save_weights_for_sampler):
        with pytest.raises(TypeError, match=rf"{save.__name__}\.user_metadata: expected a dict"):
            save("m", user_metadata=metadata)  # type: ignore[arg-type]
    assert not list(tmp_path.glob(f"{trainer.model_id}/*/m"))
    path = trainer.save_state("m", user_metadata={"step": "10"}).result().path
    assert trainer.load_state(path).result() is not None


def test_a_resumed_runs_checkpoints_carry_the_resumed_clients_metadata(tmp_path: Path) -> None:
    service = micro_service(tmp_path)
    trainer = service.create_lora_training_client(
        MICRO_NAME, user_metadata={"renderer_name": "role_colon"}
    ).result()
    path = trainer.save_state("final").result().path
    resumed = service.create_training_client_from_state_with_optimizer(
        path, user_metadata={"renderer_name": "llama3"}
    ).result()
    again = resumed.save_state("final").result().path
    rest = service.create_rest_client()
    assert rest.get_training_run_by_tinker_path(path).result().user_metadata == {
        "renderer_name": "role_colon"
    }
    assert rest.get_training_run_by_tinker_path(again).result().user_metadata == {
        "renderer_name": "llama3"
    }


def test_a_checkpoint_of_an_earlier_rlpure_still_names_its_run(tmp_path: Path) -> None:
    trainer = micro_service(tmp_path).create_lora_training_client(MICRO_NAME).result()
    path = Path(trainer.save_state("old").result().path)
    manifest = json.loads((path / "manifest.json").read_text())
    del manifest["training_run_id"], manifest["run_metadata"]  # the earlier format
    (path / "manifest.json").write_text(json.dumps(manifest))
    run = micro_service(tmp_path).create_rest_client().get_training_run_by_tinker_path(str(path))
    assert run.result().training_run_id == "local-0-0"
    assert run.result().user_metadata is None
    assert micro_service(tmp_path).create_training_client_from_state(str(path)).result()


def test_rolling_checkpoints_are_deleted_and_nothing_else_is(tmp_path: Path) -> None:
    trainer = micro_service(tmp_path).create_lora_training_client(MICRO_NAME).result()
    rolling = trainer.save_state("000001", ttl_seconds=7200).result().path
    rest = micro_service(tmp_path).create_rest_client()
    asyncio.run(_await_none(rest.delete_checkpoint_from_tinker_path(rolling)))
    assert not Path(rolling).exists()
    other = tmp_path / "not_a_checkpoint"
    other.mkdir()
    (other / "data.txt").write_text("keep me")
    for path in (str(other), rolling, "tinker://run/weights/x", ""):
        with pytest.raises(LocalLookupError) as info:
            rest.delete_checkpoint_from_tinker_path(path)
        assert isinstance(info.value, ValueError) and isinstance(info.value, CheckpointError)
    assert (other / "data.txt").read_text() == "keep me"
    kept = trainer.save_state("000002").result().path
    with pytest.raises(LocalLookupError, match="has no checkpoint 'weights/000009'"):
        rest.delete_checkpoint(trainer.model_id, "weights/000009")
    rest.delete_checkpoint(trainer.model_id, "weights/000002").result()  # the SDK's id
    assert not Path(kept).exists()
    older = trainer.save_weights_for_sampler("000003").result().path
    rest.delete_checkpoint(trainer.model_id, "sampler/000003").result()  # an earlier rlpure's
    assert not Path(older).exists()
    with pytest.raises(LocalLookupError, match="unknown local training run 'local-9-9'"):
        rest.get_training_run("local-9-9")


async def _await_none(future: tinker.APIFuture[None]) -> None:
    await future


def test_the_micro_config_is_what_the_service_reports() -> None:
    capabilities = micro_service().create_rest_client().get_server_capabilities().result()
    models = {m.model_name: m.max_context_length for m in capabilities.supported_models}
    assert models[MICRO_NAME] == MICRO.max_seq_len
