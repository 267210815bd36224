"""Durable local state: the default checkpoint store, run ids across processes, named runs.

A `LocalServiceClient()` writes under `shell.data_dir.default_checkpoint_dir()`
(`$RLPURE_HOME/checkpoints`, else `$XDG_DATA_HOME/rlpure/checkpoints`, else
`~/.local/share/rlpure/checkpoints`), so a checkpoint saved by one process is resumed by the next
with no argument and continues exactly; `temporary_checkpoints=True` is the throwaway directory
removed at exit. Training runs claim their folder atomically (two processes × 10 runs never
share an id), record themselves in `run.json` (so a run without checkpoints is known to a new
service), may be named by the host (`training_run_id=`), and are listed and paged by the REST
client. Every test points `RLPURE_HOME` at its own folder; the subprocesses inherit it.
"""

from __future__ import annotations

import asyncio
import doctest
import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tinker
from tinker import types

from shell import data_dir
from shell.data_dir import default_checkpoint_dir, rlpure_data_dir
from shell.errors import ConfigError
from shell.local import (
    LocalLookupError,
    LocalRestClient,
    LocalServiceClient,
    LocalTrainingClient,
)
from tests.local.hf_fixtures import (
    hf_config,
    random_hf_tensors,
    train_tokenizer,
    write_hf_directory,
)
from tests.local.micro import MICRO, MICRO_NAME, micro_service

REPO = Path(__file__).resolve().parents[2]
TINY = "rlpure/tiny"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's `RLPURE_HOME` (its subprocesses inherit it)."""
    directory = tmp_path / "home"
    monkeypatch.setenv("RLPURE_HOME", str(directory))
    return directory


def _default_micro_service(seed: int = 0) -> LocalServiceClient:
    return LocalServiceClient(seed=seed, model_configs={MICRO_NAME: MICRO})


def _run_python(script: str, *args: str) -> list[str]:
    """Runs `script` in a new interpreter (repository root, this environment); its stdout
    lines."""
    result = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


# --- where the store is -----------------------------------------------------------------------


def test_the_data_dir_is_rlpure_home_then_xdg_data_home_then_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLPURE_HOME", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert rlpure_data_dir() == tmp_path / "mine"
    assert default_checkpoint_dir() == tmp_path / "mine" / "checkpoints"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLPURE_HOME", "relative")  # made absolute against the current folder
    assert rlpure_data_dir() == tmp_path / "relative"
    monkeypatch.setenv("RLPURE_HOME", "")  # empty: unset
    assert rlpure_data_dir() == tmp_path / "xdg" / "rlpure"
    assert default_checkpoint_dir() == tmp_path / "xdg" / "rlpure" / "checkpoints"
    monkeypatch.setenv("XDG_DATA_HOME", "xdg")  # relative: invalid under the XDG spec
    assert rlpure_data_dir() == tmp_path / "user" / ".local" / "share" / "rlpure"
    monkeypatch.delenv("RLPURE_HOME")
    monkeypatch.delenv("XDG_DATA_HOME")
    assert default_checkpoint_dir() == tmp_path / "user" / ".local/share/rlpure/checkpoints"
    assert not (tmp_path / "user").exists()  # pure path computation
    assert doctest.testmod(data_dir).failed == 0


def test_the_suite_never_writes_into_the_users_home() -> None:
    """`tests/conftest.py` points `RLPURE_HOME` at the session's own temporary folder."""
    assert Path(os.environ["RLPURE_HOME"]).name.startswith("rlpure-test-home-")


def test_a_default_service_keeps_runs_and_checkpoints_in_the_store(home: Path) -> None:
    service = _default_micro_service()
    assert not home.exists()  # nothing is written before a run is opened
    trainer = service.create_lora_training_client(
        MICRO_NAME, rank=8, user_metadata={"renderer_name": "role_colon"}
    ).result()
    run = home / "checkpoints" / trainer.model_id
    record = json.loads((run / "run.json").read_text())
    assert record["base_model"] == MICRO_NAME and record["lora_rank"] == 8
    assert record["is_lora"] is False  # a toy model trains every weight
    assert record["user_metadata"] == {"renderer_name": "role_colon"}
    assert abs(record["created_at"] - time.time()) < 60
    assert sorted(path.name for path in run.iterdir()) == ["run.json"]  # no staging left
    assert Path(trainer.save_state("s").result().path) == run / "state" / "s"


def test_checkpoint_dir_and_temporary_checkpoints_exclude_each_other(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="checkpoint_dir and temporary_checkpoints=True"):
        LocalServiceClient(checkpoint_dir=tmp_path, temporary_checkpoints=True)
    with pytest.raises(TypeError, match="temporary_checkpoints: expected a bool"):
        LocalServiceClient(temporary_checkpoints="yes")  # type: ignore[arg-type]


# --- across processes -------------------------------------------------------------------------


def _datum() -> types.Datum:
    tokens = list(b"durable state, resumed exactly")
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": types.TensorData.from_numpy(np.asarray(tokens[1:], np.int64)),
            "weights": types.TensorData.from_numpy(np.ones(len(tokens) - 1, np.float32)),
        },
    )


def train_step(trainer: LocalTrainingClient) -> float:
    """One cross-entropy step on a fixed datum; its loss (imported by the subprocesses)."""
    out = trainer.forward_backward([_datum()], "cross_entropy").result()
    trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    return float(out.metrics["loss:sum"])


@pytest.mark.slow
def test_a_checkpoint_saved_by_another_process_resumes_exactly_with_no_arguments(
    home: Path,
) -> None:
    script = (
        "from shell.local import LocalServiceClient\n"
        "from tests.local.test_durable_state import TINY, train_step\n"
        "trainer = LocalServiceClient().create_lora_training_client(TINY).result()\n"
        "print(repr(train_step(trainer)))\n"
        "print(trainer.save_state('after-1').result().path)\n"
    )
    first_loss, path = _run_python(script)
    assert Path(path).is_relative_to(home / "checkpoints")

    uninterrupted = LocalServiceClient().create_lora_training_client(TINY).result()
    expected = [train_step(uninterrupted) for _ in range(3)]
    resumed = LocalServiceClient().create_training_client_from_state_with_optimizer(path).result()
    assert [float(first_loss), train_step(resumed), train_step(resumed)] == expected
    assert expected[2] < expected[0]  # it learns: the comparison is not between constants
    weights_only = LocalServiceClient().create_training_client_from_state(path).result()
    assert train_step(weights_only) == expected[1]  # the same weights
    assert train_step(weights_only) != expected[2]  # a fresh Adam state steps differently


@pytest.mark.slow
def test_temporary_checkpoints_go_at_exit_and_the_default_and_a_given_dir_stay(
    home: Path, tmp_path: Path
) -> None:
    script = (
        "import sys\n"
        "from shell.local import LocalServiceClient\n"
        "from tests.local.micro import MICRO, MICRO_NAME\n"
        "for options in ({'temporary_checkpoints': True}, {'checkpoint_dir': sys.argv[1]}, {}):\n"
        "    service = LocalServiceClient(model_configs={MICRO_NAME: MICRO}, **options)\n"
        "    trainer = service.create_lora_training_client(base_model=MICRO_NAME).result()\n"
        "    print(trainer.save_state('s').result().path)\n"
    )
    temporary, given, default = (Path(line) for line in _run_python(script, str(tmp_path / "g")))
    temp_root = temporary.parents[2]
    assert temp_root.name.startswith("rlpure-local-")
    assert not temp_root.exists()
    assert (given / "manifest.json").exists() and given.is_relative_to(tmp_path / "g")
    assert (default / "manifest.json").exists()
    assert default.parents[2] == home / "checkpoints"
    # and the durable one resumes here (what the temporary one's error message now advises)
    assert LocalServiceClient().create_training_client_from_state(str(default)).result()


@pytest.mark.slow
def test_two_processes_creating_runs_at_once_never_share_an_id(home: Path, tmp_path: Path) -> None:
    script = (
        "import pathlib, sys, time\n"
        "from shell.local import LocalServiceClient\n"
        "from tests.local.micro import MICRO, MICRO_NAME\n"
        "service = LocalServiceClient(model_configs={MICRO_NAME: MICRO})\n"
        "ids = [service.create_lora_training_client(MICRO_NAME).result().model_id]\n"
        "pathlib.Path(sys.argv[1]).touch()\n"
        "deadline = time.monotonic() + 120\n"
        "while not pathlib.Path(sys.argv[2]).exists() and time.monotonic() < deadline:\n"
        "    time.sleep(0.005)\n"
        "ids += [service.create_lora_training_client(MICRO_NAME).result().model_id\n"
        "        for _ in range(10)]\n"
        "print(' '.join(ids))\n"
    )
    go = tmp_path / "go"
    ready = [tmp_path / f"ready-{n}" for n in range(2)]
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(flag), str(go)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for flag in ready
    ]
    try:
        deadline = time.monotonic() + 240
        while not all(flag.exists() for flag in ready):
            assert time.monotonic() < deadline, "the subprocesses did not start"
            assert all(process.poll() is None for process in processes), "a subprocess died"
            time.sleep(0.01)
        go.touch()  # both now claim their 10 runs at once
        outputs = [process.communicate(timeout=240) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    assert all(process.returncode == 0 for process in processes), [err for _, err in outputs]
    ids = [run_id for out, _ in outputs for run_id in out.split()]
    assert len(ids) == 22 and len(set(ids)) == 22
    assert all(run_id.startswith("local-0-") for run_id in ids)
    assert all((home / "checkpoints" / run_id / "run.json").is_file() for run_id in ids)


# --- run ids ----------------------------------------------------------------------------------


def test_services_sharing_a_folder_interleave_their_run_ids(tmp_path: Path) -> None:
    a, b = micro_service(tmp_path), micro_service(tmp_path)
    ids = [service.create_lora_training_client(MICRO_NAME).result().model_id for service in (a, b)]
    ids.append(a.create_lora_training_client(MICRO_NAME).result().model_id)  # b took local-0-1
    (tmp_path / "local-0-3").mkdir()  # claimed by another process meanwhile
    ids.append(b.create_lora_training_client(MICRO_NAME).result().model_id)
    assert ids == ["local-0-0", "local-0-1", "local-0-2", "local-0-4"]
    (tmp_path / "local-1-7").mkdir()  # another seed's numbering is its own
    assert micro_service(tmp_path, seed=1).create_lora_training_client(MICRO_NAME).result()
    assert (tmp_path / "local-1-8").is_dir()


def test_a_claim_starts_after_the_highest_run_on_disk_in_one_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for index in (*range(200), 500):
        (tmp_path / f"local-0-{index}").mkdir()
    attempts: list[Path] = []
    mkdir = Path.mkdir

    def counting_mkdir(self: Path, *args: object, **kwargs: object) -> None:
        if self.parent == tmp_path:
            attempts.append(self)
        mkdir(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "mkdir", counting_mkdir)
    service = micro_service(tmp_path)
    trainers = [service.create_lora_training_client(MICRO_NAME).result() for _ in range(3)]
    assert [trainer.model_id for trainer in trainers] == [
        "local-0-501",
        "local-0-502",
        "local-0-503",
    ]
    assert attempts == [tmp_path / f"local-0-{index}" for index in (501, 502, 503)]


def test_a_host_names_its_runs_and_their_checkpoint_folders(tmp_path: Path) -> None:
    service = micro_service(tmp_path)
    trainer = service.create_lora_training_client(
        MICRO_NAME, training_run_id="sess-1:train:0"
    ).result()
    assert trainer.model_id == "sess-1:train:0"
    path = Path(trainer.save_state("s").result().path)
    assert path == tmp_path / "sess-1:train:0" / "state" / "s"
    restored = service.create_training_client_from_state(
        str(path), training_run_id="sess-1:train:1"
    ).result()
    with_optimizer = service.create_training_client_from_state_with_optimizer(
        str(path), training_run_id="sess-1:train:2"
    ).result()

    async def named_async() -> list[str]:
        return [
            (await make).model_id
            for make in (
                service.create_lora_training_client_async(
                    MICRO_NAME, training_run_id="sess-1:train:3"
                ),
                service.create_training_client_from_state_async(
                    str(path), training_run_id="sess-1:train:4"
                ),
                service.create_training_client_from_state_with_optimizer_async(
                    str(path), training_run_id="sess-1:train:5"
                ),
            )
        ]

    assert (restored.model_id, with_optimizer.model_id) == ("sess-1:train:1", "sess-1:train:2")
    assert asyncio.run(named_async()) == [f"sess-1:train:{n}" for n in (3, 4, 5)]
    assert all((tmp_path / f"sess-1:train:{n}" / "run.json").is_file() for n in range(6))
    # the service's own names go on as before
    assert service.create_lora_training_client(MICRO_NAME).result().model_id == "local-0-0"


def test_a_taken_or_unusable_run_id_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "store"
    service = micro_service(store)
    service.create_lora_training_client(MICRO_NAME, training_run_id="mine").result()
    for other in (service, micro_service(store)):  # this service and another process's
        with pytest.raises(ConfigError, match="training run 'mine' already exists") as info:
            other.create_lora_training_client(MICRO_NAME, training_run_id="mine")
        assert isinstance(info.value, ValueError)
    path = service.create_lora_training_client(MICRO_NAME).result().save_state("s").result()
    with pytest.raises(ConfigError, match="'mine' already exists"):
        service.create_training_client_from_state(path.path, training_run_id="mine")
    for bad in ("a/b", "..", ".", "", "../escape", "a\\b"):
        with pytest.raises(ConfigError, match="training_run_id: checkpoint name must be"):
            service.create_lora_training_client(MICRO_NAME, training_run_id=bad)
    assert not (tmp_path / "escape").exists()
    assert sorted(entry.name for entry in store.iterdir()) == ["local-0-0", "mine"]


# --- what the REST client sees ----------------------------------------------------------------


def test_a_run_without_checkpoints_is_known_to_a_new_service(tmp_path: Path) -> None:
    trainer = (
        micro_service(tmp_path)
        .create_lora_training_client(
            MICRO_NAME, rank=8, user_metadata={"renderer_name": "role_colon"}
        )
        .result()
    )
    rest = micro_service(tmp_path).create_rest_client()  # another process's service
    run = rest.get_training_run(trainer.model_id).result()
    assert (run.training_run_id, run.base_model) == (trainer.model_id, MICRO_NAME)
    assert (run.is_lora, run.lora_rank) == (False, 8)
    assert run.user_metadata == {"renderer_name": "role_colon"}
    assert run.last_checkpoint is None and run.last_sampler_checkpoint is None
    assert [r.training_run_id for r in rest.list_training_runs().result().training_runs] == [
        trainer.model_id
    ]
    (tmp_path / trainer.model_id / "run.json").write_text("{not json")  # a damaged record
    with pytest.raises(LocalLookupError, match=r"no run\.json and no checkpoints"):
        rest.get_training_run(trainer.model_id)


def test_training_runs_and_checkpoints_are_listed_newest_first_in_pages(tmp_path: Path) -> None:
    service = micro_service(tmp_path)
    paths = []
    for n in range(3):
        trainer = service.create_lora_training_client(MICRO_NAME, training_run_id=f"r{n}").result()
        paths += [trainer.save_state("s").result().path]
        paths += [trainer.save_weights_for_sampler("w").result().path]
    (tmp_path / "not-a-run").mkdir()  # neither run.json nor checkpoints: not listed
    (tmp_path / "ttl.json").write_text("{}")  # a file beside the runs (rlpure serve's)
    for seconds, path in enumerate(paths):  # distinct save times, in save order
        os.utime(Path(path) / "manifest.json", (1e9 + seconds, 1e9 + seconds))
    rest = micro_service(tmp_path).create_rest_client()

    def runs(**page: Any) -> tuple[list[str], types.Cursor]:
        response = rest.list_training_runs(**page).result()
        assert isinstance(response, types.TrainingRunsResponse)
        return [run.training_run_id for run in response.training_runs], response.cursor

    assert runs() == (["r2", "r1", "r0"], types.Cursor(offset=0, limit=20, total_count=3))
    assert runs(limit=2) == (["r2", "r1"], types.Cursor(offset=0, limit=2, total_count=3))
    assert runs(limit=2, offset=2) == (["r0"], types.Cursor(offset=2, limit=2, total_count=3))
    assert runs(offset=5)[0] == []
    newest = rest.list_training_runs(limit=1).result().training_runs[0]
    assert newest.last_checkpoint is not None and newest.last_checkpoint.tinker_path == paths[4]

    def checkpoints(**page: Any) -> tuple[list[str], types.Cursor | None]:
        response = rest.list_user_checkpoints(**page).result()
        return [c.tinker_path for c in response.checkpoints], response.cursor

    assert checkpoints() == (paths[::-1], types.Cursor(offset=0, limit=100, total_count=6))
    assert checkpoints(limit=4, offset=1) == (
        paths[::-1][1:5],
        types.Cursor(offset=1, limit=4, total_count=6),
    )
    assert checkpoints(offset=6)[0] == []
    for bad in ({"limit": -1}, {"offset": -2}, {"limit": True}):
        with pytest.raises(ValueError, match="list_training_runs"):
            rest.list_training_runs(**bad)
        with pytest.raises(ValueError, match="list_user_checkpoints"):
            rest.list_user_checkpoints(**bad)


@pytest.mark.parametrize("name", ["list_training_runs", "list_user_checkpoints"])
def test_the_listings_have_the_sdks_signatures(name: str) -> None:
    def shape(fn: Any) -> list[tuple[str, Any, Any]]:
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    assert shape(getattr(LocalRestClient, name)) == shape(getattr(tinker.RestClient, name))


def test_a_temporary_services_rest_client_lists_nothing_before_its_first_run() -> None:
    rest = LocalServiceClient(temporary_checkpoints=True).create_rest_client()
    assert rest.list_training_runs().result().training_runs == []
    assert rest.list_user_checkpoints().result().checkpoints == []


@pytest.mark.slow
def test_a_lora_run_reports_is_lora_and_its_rank(tmp_path: Path) -> None:
    tokenizer = train_tokenizer()
    config = hf_config("llama", vocab_size=len(tokenizer))
    llama = tmp_path / "llama"
    write_hf_directory(llama, config, random_hf_tensors(config, seed=1), tokenizer)
    states = tmp_path / "states"
    trainer = (
        LocalServiceClient(checkpoint_dir=states)
        .create_lora_training_client(str(llama), rank=4, train_unembed=False)
        .result()
    )
    path = trainer.save_state("s").result().path
    rest = LocalServiceClient(checkpoint_dir=states).create_rest_client()
    run = rest.get_training_run(trainer.model_id).result()
    assert (run.is_lora, run.lora_rank) == (True, 4)
    info = rest.get_weights_info_by_tinker_path(path).result()
    assert (info.is_lora, info.lora_rank) == (True, 4)
    assert (info.train_attn, info.train_mlp, info.train_unembed) == (True, True, False)
    (states / trainer.model_id / "run.json").unlink()  # an earlier rlpure's run: the manifest
    run = rest.get_training_run(trainer.model_id).result()
    assert (run.is_lora, run.lora_rank) == (True, 4)
