"""Differential tests: the cookbook facade's checkpoint and utility modules against
tinker-cookbook 0.6.1's, and the recipe entry points they let port.

`shell.cookbook.checkpoint_utils` and `shell.cookbook.utils.{ml_log, lr_scheduling,
session_naming, git_rev, deprecation, cost_estimation, trace}` are driven with the same inputs
as the cookbook's modules (the same `checkpoints.jsonl`, the same scripted training client, the
same steps and names) and must give the same outputs; then every file of the cookbook's
`recipes/` and `rl/` that uses them either imports by the port rule or stops on another module
(which files must import is `test_port_coverage.EXPECTED_IMPORTS`, the one list). Needs the
cookbook (`make parity`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import importlib.metadata
import json
import logging
import math
import re
import sys
import time
import types
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import chz
import pytest
import tinker
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.parity.porting import ported_module, require_cookbook, serve_ported_recipes

COOKBOOK = require_cookbook()

from tinker_cookbook import checkpoint_utils as cb_checkpoints  # noqa: E402
from tinker_cookbook import exceptions as cb_exceptions  # noqa: E402
from tinker_cookbook.utils import code_state as cb_code_state  # noqa: E402
from tinker_cookbook.utils import cost_estimation as cb_cost  # noqa: E402
from tinker_cookbook.utils import deprecation as cb_deprecation  # noqa: E402
from tinker_cookbook.utils import git_rev as cb_git_rev  # noqa: E402
from tinker_cookbook.utils import lr_scheduling as cb_lr  # noqa: E402
from tinker_cookbook.utils import ml_log as cb_ml_log  # noqa: E402
from tinker_cookbook.utils import session_naming as cb_naming  # noqa: E402
from tinker_cookbook.utils import trace as cb_trace  # noqa: E402

from shell.cookbook import checkpoint_utils  # noqa: E402
from shell.cookbook.exceptions import ConfigurationError  # noqa: E402
from shell.cookbook.utils import (  # noqa: E402
    code_state,
    cost_estimation,
    deprecation,
    git_rev,
    lr_scheduling,
    ml_log,
    session_naming,
    trace,
)
from shell.fakes import FakeServiceClient  # noqa: E402

# --- checkpoint_utils ----------------------------------------------------------------------------

ROWS: list[dict[str, Any]] = [
    {"name": "000005", "batch": 5, "state_path": "tinker://r/state/000005"},
    {"name": "000005", "sampler_path": "tinker://r/sampler/000005"},  # sampler-only
    {"name": "000010", "batch": 10, "epoch": 1, "state_path": "/abs/s10", "rolling": True},
    {
        "name": "final",
        "batch": 12,
        "final": True,
        "state_path": "/abs/f",
        "sampler_path": "/x",
        "cumulative_tokens": {"sampled": 3},
        "step": 12,
        "rng_key_data": [0, 7],
    },
    {"name": "custom", "epoch": 2, "my_key": [1, 2], "state_path": None},
]


def _write_rows(log_dir: Path, rows: list[dict[str, Any]]) -> None:
    log_dir.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(row) + "\n" for row in rows)
    (log_dir / "checkpoints.jsonl").write_text(text)


@pytest.mark.parametrize("n_rows", range(len(ROWS) + 1))
@pytest.mark.parametrize("key", ["state_path", "sampler_path", "epoch", "my_key", "nope"])
def test_get_last_checkpoint_picks_the_cookbooks_row(tmp_path: Path, n_rows: int, key: str) -> None:
    _write_rows(tmp_path, ROWS[:n_rows])
    theirs = cb_checkpoints.get_last_checkpoint(str(tmp_path), required_key=key)
    ours = checkpoint_utils.get_last_checkpoint(str(tmp_path), required_key=key)
    assert (ours is None) == (theirs is None)
    if theirs is not None:
        assert ours is not None
        assert ours.to_dict() == theirs.to_dict()
        assert list(ours.to_dict()) == list(theirs.to_dict())


def test_no_file_is_no_checkpoint_in_both(tmp_path: Path) -> None:
    assert cb_checkpoints.get_last_checkpoint(str(tmp_path)) is None
    assert checkpoint_utils.get_last_checkpoint(str(tmp_path)) is None
    assert checkpoint_utils.load_checkpoints_file(str(tmp_path)) == []


def test_load_checkpoints_file_reads_every_row_as_the_cookbook(tmp_path: Path) -> None:
    _write_rows(tmp_path, ROWS)
    theirs = cb_checkpoints.load_checkpoints_file(str(tmp_path))
    ours = checkpoint_utils.load_checkpoints_file(str(tmp_path))
    assert [vars(r) for r in ours] == [vars(r) for r in theirs]


@pytest.mark.parametrize("row", ROWS)
@pytest.mark.parametrize("key", ["name", "batch", "epoch", "final", "state_path", "my_key", "x"])
def test_checkpoint_record_has_get_and_round_trip_as_the_cookbooks(
    row: dict[str, Any], key: str
) -> None:
    theirs = cb_checkpoints.CheckpointRecord.from_dict(row)
    ours = checkpoint_utils.CheckpointRecord.from_dict(row)
    assert ours.has(key) == theirs.has(key)
    assert ours.get(key) == theirs.get(key)
    assert ours.get(key, "d") == theirs.get(key, "d")
    assert json.dumps(ours.to_dict()) == json.dumps(theirs.to_dict())


def test_a_known_key_in_extra_is_dropped_as_the_cookbook_drops_it() -> None:
    theirs = cb_checkpoints.CheckpointRecord(name="a", extra={"batch": 3, "k": 1})
    ours = checkpoint_utils.CheckpointRecord(name="a", extra={"batch": 3, "k": 1})
    assert ours.to_dict() == theirs.to_dict() == {"name": "a", "k": 1}


def test_a_torn_last_line_is_skipped_where_the_cookbook_raises(tmp_path: Path) -> None:
    _write_rows(tmp_path, ROWS[:1])
    with (tmp_path / "checkpoints.jsonl").open("a") as f:
        f.write('{"name": "000006", "bat')
    with pytest.raises(json.JSONDecodeError):
        cb_checkpoints.get_last_checkpoint(str(tmp_path))
    last = checkpoint_utils.get_last_checkpoint(str(tmp_path))  # a deliberate difference
    assert last is not None and last.name == "000005"


def _training_client() -> Any:
    service = FakeServiceClient()
    return service.create_lora_training_client(base_model="m").result()


SAVES: list[tuple[str, dict[str, Any], str, int | None]] = [
    ("000001", {"batch": 1}, "state", 3600),
    ("000002", {"batch": 2, "epoch": 0, "cumulative_tokens": {"trained": 9}}, "both", None),
    ("000002", {"batch": 2}, "sampler", None),
    ("final", {"batch": 3, "final": True, "extra": "kept", "step": 3}, "both", None),
]


def test_save_checkpoint_writes_the_cookbooks_rows_byte_for_byte(tmp_path: Path) -> None:
    client = _training_client()
    for log_dir, module in (
        (tmp_path / "cb", cb_checkpoints),
        (tmp_path / "ours", checkpoint_utils),
    ):
        log_dir.mkdir()
        returned = [
            module.save_checkpoint(
                training_client=client,
                name=name,
                log_path=str(log_dir),
                loop_state=state,
                kind=kind,  # type: ignore[arg-type]
                ttl_seconds=ttl,
            )
            for name, state, kind, ttl in SAVES
        ]
        (log_dir / "returned.json").write_text(json.dumps(returned))
    for file in ("checkpoints.jsonl", "returned.json"):
        assert (tmp_path / "ours" / file).read_bytes() == (tmp_path / "cb" / file).read_bytes()


def test_save_checkpoint_async_and_a_store_get_the_cookbooks_rows(tmp_path: Path) -> None:
    client = _training_client()

    class Store:
        def __init__(self) -> None:
            self.rows: list[dict[str, Any]] = []

        def write_checkpoint(self, record: dict[str, Any]) -> None:
            self.rows.append(record)

    stores = []
    for module in (cb_checkpoints, checkpoint_utils):
        store = Store()
        for name, state, kind, ttl in SAVES:
            asyncio.run(
                module.save_checkpoint_async(
                    client,
                    name,
                    str(tmp_path),
                    state,
                    kind,
                    ttl,
                    store,  # type: ignore[arg-type]
                )
            )
        stores.append(store.rows)
    assert stores[0] == stores[1]
    assert not (tmp_path / "checkpoints.jsonl").exists()


class _DeletingRest:
    def __init__(self, deleted: list[str]) -> None:
        self.deleted = deleted

    async def delete_checkpoint_from_tinker_path(self, path: str) -> None:
        self.deleted.append(path)


class _Service:
    def __init__(self) -> None:
        self.deleted: list[str] = []

    def create_rest_client(self) -> _DeletingRest:
        return _DeletingRest(self.deleted)


def _manager_run(module: ModuleType, log_dir: Path, *, sync: bool) -> list[str]:
    log_dir.mkdir()
    client = _training_client()
    service = _Service()
    manager = module.CheckpointManager(
        training_client=client,
        service_client=service,
        log_path=str(log_dir),
        save_every=4,
        rolling_save_every=1,
        ttl_seconds=100,
        rolling_ttl_seconds=10,
        save_every_tokens=50,
    )
    manager.restore_last_saved_tokens(5)
    if sync:
        for step in range(0, 7):
            manager.maybe_save(step, {"batch": step}, elapsed_tokens=10 * step)
        manager.save_final({"batch": 7})
    else:

        async def run() -> None:
            for step in range(0, 7):
                await manager.maybe_save_async(step, {"batch": step}, elapsed_tokens=10 * step)
            await manager.save_final_async({"batch": 7})

        asyncio.run(run())
    return service.deleted


@pytest.mark.parametrize("sync", [True, False])
def test_checkpoint_manager_saves_and_deletes_as_the_cookbooks(tmp_path: Path, sync: bool) -> None:
    theirs = _manager_run(cb_checkpoints, tmp_path / "cb", sync=sync)
    ours = _manager_run(checkpoint_utils, tmp_path / "ours", sync=sync)
    assert ours == theirs
    assert len(theirs) >= 4  # rolling states superseded, the last one deleted after the final
    assert (tmp_path / "ours" / "checkpoints.jsonl").read_text() == (
        tmp_path / "cb" / "checkpoints.jsonl"
    ).read_text()


def test_renderer_name_metadata_as_the_cookbook() -> None:
    for module in (cb_checkpoints, checkpoint_utils):
        metadata = {"recipe_name": "r"}
        module.add_renderer_name_to_user_metadata(metadata, None)
        module.add_renderer_name_to_user_metadata(metadata, "")
        assert metadata == {"recipe_name": "r"}
        module.add_renderer_name_to_user_metadata(metadata, "qwen3")
        assert metadata == {"recipe_name": "r", "renderer_name": "qwen3"}
    assert checkpoint_utils.RENDERER_NAME_METADATA_KEY == cb_checkpoints.RENDERER_NAME_METADATA_KEY
    assert checkpoint_utils.CHECKPOINTS_BASE_NAME == cb_checkpoints.CHECKPOINTS_BASE_NAME


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any]]:
    """A local-backend service and a training client whose run's metadata names the renderer
    `role_colon`."""
    from shell import LocalServiceClient

    with LocalServiceClient(checkpoint_dir=tmp_path_factory.mktemp("states")) as service:
        client = service.create_lora_training_client(
            base_model="rlpure/tiny", user_metadata={"renderer_name": "role_colon"}
        ).result()
        yield service, client


@pytest.fixture(scope="module")
def local_checkpoint(local_run: tuple[Any, Any]) -> str:
    """A local-backend state of `local_run`."""
    return str(local_run[1].save_state("s").result().path)


def test_a_recipes_sync_saves_resume_on_the_local_backend(
    local_run: tuple[Any, Any], tmp_path: Path
) -> None:
    """rl_loop's calls: `save_checkpoint` outside any event loop, then the resume it does."""
    service, client = local_run
    for module, log_dir in ((cb_checkpoints, tmp_path / "cb"), (checkpoint_utils, tmp_path / "o")):
        log_dir.mkdir()
        tag = log_dir.name
        module.save_checkpoint(client, f"{tag}1", str(log_dir), {"batch": 1}, kind="state")
        module.save_checkpoint(client, f"{tag}f", str(log_dir), {"batch": 2}, kind="both")
    rows = [
        [json.loads(line) for line in (tmp_path / d / "checkpoints.jsonl").read_text().splitlines()]
        for d in ("cb", "o")
    ]
    assert [sorted(row) for row in rows[1]] == [sorted(row) for row in rows[0]]  # same keys
    last = checkpoint_utils.get_last_checkpoint(str(tmp_path / "o"))
    assert last is not None and last.batch == 2
    resumed = service.create_training_client_from_state_with_optimizer(last.state_path).result()
    assert resumed.get_info().model_data.model_name == "rlpure/tiny"


def test_the_renderer_recorded_for_a_checkpoint_resolves_as_in_the_cookbook(
    local_checkpoint: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from shell import LocalServiceClient

    monkeypatch.setattr(tinker, "ServiceClient", LocalServiceClient)
    cases: list[dict[str, Any]] = [
        {"explicit_renderer_name": "llama3", "load_checkpoint_path": local_checkpoint},
        {"explicit_renderer_name": None, "load_checkpoint_path": local_checkpoint},
        {"explicit_renderer_name": None, "load_checkpoint_path": None},
        {"explicit_renderer_name": None, "load_checkpoint_path": "/no/such/checkpoint"},
    ]
    for case in cases:
        kwargs = {"model_name": "Qwen/Qwen3-8B", **case}
        theirs = cb_checkpoints.resolve_renderer_name_from_checkpoint_or_default(**kwargs)
        assert checkpoint_utils.resolve_renderer_name_from_checkpoint_or_default(**kwargs) == theirs
        ours_async = checkpoint_utils.resolve_renderer_name_from_checkpoint_or_default_async
        assert asyncio.run(ours_async(**kwargs)) == theirs
    service = LocalServiceClient()
    for path in (local_checkpoint, "/no/such/checkpoint"):
        theirs = cb_checkpoints.get_renderer_name_from_checkpoint(service, path)
        assert checkpoint_utils.get_renderer_name_from_checkpoint(service, path) == theirs
        get_async = checkpoint_utils.get_renderer_name_from_checkpoint_async
        assert asyncio.run(get_async(service, path)) == theirs
    for expected in ("role_colon", "llama3", None):
        levels = []
        for module in (cb_checkpoints, checkpoint_utils):
            caplog.clear()
            with caplog.at_level(logging.INFO):
                module.check_renderer_name_for_checkpoint(service, local_checkpoint, expected)
                asyncio.run(
                    module.check_renderer_name_for_checkpoint_async(
                        service, local_checkpoint, expected
                    )
                )
            levels.append(
                [(r.levelname, r.getMessage()) for r in caplog.records if "enderer" in r.message]
            )
        assert levels[0] == levels[1]


# --- utils.ml_log --------------------------------------------------------------------------------


class _Colour(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class _Inner:
    rate: float = 0.5
    tags: tuple[str, ...] = ("a", "b")


@chz.chz
class _RecipeConfig:
    model_name: str = "m"
    log_path: str = "/tmp/x"
    max_steps: int | None = None
    inner: _Inner = chz.field(default_factory=_Inner)
    colour: _Colour = _Colour.RED
    fn: Any = json.dumps
    opaque: Any = chz.field(default_factory=object)
    nested: dict[str, Any] = chz.field(default_factory=lambda: {"k": [1, _Inner()]})


CONFIGS: list[Any] = [
    _RecipeConfig(),
    {"a": 1, "b": [1.5, None, "s"], "c": _Colour.RED},
    [1, (2, 3)],
    _Inner(),
    types.SimpleNamespace(x=1, _hidden=2, X_also=3),
    3.5,
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: type(c).__name__)
def test_dump_config_is_the_cookbooks(config: Any) -> None:
    def as_json(data: Any) -> str:  # an opaque object is copied by chz: compare its type
        return json.dumps(data, default=lambda o: str(type(o)))

    assert as_json(ml_log.dump_config(config)) == as_json(cb_ml_log.dump_config(config))


def _log_a_run(module: ModuleType, log_dir: Path, caplog: pytest.LogCaptureFixture) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.INFO):
        ml_logger = module.setup_logging(
            log_dir=str(log_dir),
            wandb_project=None,
            config=_RecipeConfig(),
            do_configure_logging_module=False,
        )
        ml_logger.log_metrics(
            {"reward/total": 0.25, "progress/batch": 0, "time/x:count": 2}, step=0
        )
        ml_logger.log_metrics({"optim/lr": 4e-5, "name": "s"}, step=1)
        ml_logger.log_metrics({"no_step": 1})
        ml_logger.log_summary({"tokens/cumulative/sampled": 10})
        ml_logger.log_long_text("k", "text")
        ml_logger.sync()
        assert ml_logger.get_logger_url() is None
        ml_logger.close()
    messages = [r.getMessage() for r in caplog.records if r.name.endswith("ml_log")]
    return [re.sub(r"0x[0-9a-f]+", "0x…", m.replace(str(log_dir), "D")) for m in messages]


def test_setup_logging_writes_and_prints_what_the_cookbooks_does(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    theirs = _log_a_run(cb_ml_log, tmp_path / "cb", caplog)
    ours = _log_a_run(ml_log, tmp_path / "ours", caplog)
    assert ours == theirs
    for name in ("config.json", "metrics.jsonl"):
        assert (tmp_path / "ours" / name).read_text() == (tmp_path / "cb" / name).read_text()
    diff = (tmp_path / "ours" / "code.diff").read_text()
    assert diff.startswith(("### repo: ", "### module: shell (not in a git repository)"))
    assert "modules: shell\n" in diff or "module_path: " in diff


def test_metrics_jsonl_holds_null_where_the_cookbook_writes_nan(tmp_path: Path) -> None:
    for module, log_dir in ((cb_ml_log, tmp_path / "cb"), (ml_log, tmp_path / "ours")):
        module.JsonLogger(log_dir).log_metrics({"x": float("nan"), "y": 1.0}, step=3)
    assert (tmp_path / "cb" / "metrics.jsonl").read_text() == '{"step": 3, "x": NaN, "y": 1.0}\n'
    assert (tmp_path / "ours" / "metrics.jsonl").read_text() == '{"step": 3, "x": null, "y": 1.0}\n'


def test_configure_logging_module_replaces_the_root_handlers_as_the_cookbook(
    tmp_path: Path,
) -> None:
    root = logging.getLogger()
    saved = (root.level, root.handlers[:])
    lines = []
    try:
        for module, name in ((cb_ml_log, "cb.log"), (ml_log, "ours.log")):
            returned = module.configure_logging_module(str(tmp_path / name))
            assert returned is root
            handlers = root.handlers
            assert [type(h).__name__ for h in handlers] == ["StreamHandler", "FileHandler"]
            assert root.level == logging.INFO
            logging.getLogger("some.module").info("hello %d", 7)
            record = logging.LogRecord("n", logging.WARNING, "f", 3, "m", None, None)
            lines.append([h.format(record) for h in handlers])
            for handler in handlers:
                handler.close()
    finally:
        for handler in root.handlers[:]:
            root.removeHandler(handler)
        root.setLevel(saved[0])
        for handler in saved[1]:
            root.addHandler(handler)
    assert lines[0] == lines[1]
    cb_text, ours_text = (
        re.sub(r"^root:\d+ ", "root:N ", (tmp_path / n).read_text(), flags=re.MULTILINE)
        for n in ("cb.log", "ours.log")
    )
    assert ours_text == cb_text
    assert "Command line invocation: " in ours_text and "some.module:" in ours_text


class _FakeWandb(types.ModuleType):
    """A `wandb` module that records the calls a logger makes."""

    class errors:  # wandb's name
        Error = RuntimeError

    def __init__(self) -> None:
        super().__init__("wandb")
        self.calls: list[tuple[Any, ...]] = []
        fake = self

        class Run:
            url = "https://wandb.example/run"

            def define_metric(self, *args: Any, **kwargs: Any) -> None:
                fake.calls.append(("define_metric", args, kwargs))

            class summary:
                @staticmethod
                def update(metrics: dict[str, Any]) -> None:
                    fake.calls.append(("summary", metrics))

        class Config:
            @staticmethod
            def update(config: Any) -> None:
                fake.calls.append(("config.update", config))

        self.run_class, self.config = Run, Config

    def init(self, **kwargs: Any) -> Any:
        self.calls.append(("init", kwargs))
        return self.run_class()

    def log(self, metrics: dict[str, Any], **kwargs: Any) -> None:
        self.calls.append(("log", metrics, kwargs))

    def finish(self) -> None:
        self.calls.append(("finish",))


def test_the_wandb_logger_makes_the_cookbooks_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    for module in (cb_ml_log, ml_log):
        fake = _FakeWandb()
        monkeypatch.setitem(sys.modules, "wandb", fake)
        monkeypatch.setattr(cb_ml_log, "wandb", fake)
        wandb_logger = module.WandbLogger(
            project="p", config={"a": 1}, log_dir=tmp_path, wandb_name="n"
        )
        wandb_logger.log_hparams(_Inner())
        wandb_logger.log_metrics({"x": 1.0}, step=2)
        wandb_logger.log_summary({"tokens/cumulative/trained": 5})
        wandb_logger.log_metrics_event({"test/r": 0.5, "s": 1}, 3, "s", {"test/r": "sampler/step"})
        wandb_logger.log_metrics({"y": 2.0}, step=4)
        assert wandb_logger.get_logger_url() == "https://wandb.example/run"
        wandb_logger.close()
        calls.append(fake.calls)
    assert calls[0] == calls[1]
    assert calls[0][0] == (
        "init",
        {"project": "p", "config": {"a": 1}, "dir": str(tmp_path), "name": "n"},
    )


# --- utils.lr_scheduling, utils.session_naming, utils.git_rev ------------------------------------


@pytest.mark.parametrize("schedule", ["linear", "cosine", "constant"])
@pytest.mark.parametrize("total_steps", [1, 2, 7, 100, 1001])
def test_lr_multipliers_are_the_cookbooks_at_every_step(schedule: str, total_steps: int) -> None:
    for step in [*range(total_steps + 2), 10 * total_steps]:
        args: Any = (schedule, step, total_steps)
        theirs = cb_lr.compute_schedule_lr_multiplier(*args)
        ours = lr_scheduling.compute_schedule_lr_multiplier(*args)
        assert ours == theirs, (schedule, step, total_steps)


@pytest.mark.parametrize(("schedule", "total_steps"), [("cosine", 0), ("linear", -3), ("warm", 5)])
def test_lr_schedule_errors_are_the_cookbooks(schedule: str, total_steps: int) -> None:
    args: Any = (schedule, 1, total_steps)
    with pytest.raises(cb_exceptions.ConfigurationError) as theirs:
        cb_lr.compute_schedule_lr_multiplier(*args)
    with pytest.raises(ConfigurationError) as ours:
        lr_scheduling.compute_schedule_lr_multiplier(*args)
    assert str(ours.value).startswith(str(theirs.value))
    assert lr_scheduling.LRSchedule == cb_lr.LRSchedule


names = st.one_of(st.none(), st.text(max_size=12), st.sampled_from(["", "Math RL", "--", "é!"]))


@settings(max_examples=300, deadline=None)
@given(st.lists(names, max_size=4), names, names)
def test_session_names_are_the_cookbooks(
    parts: list[str | None], wandb_name: str | None, session_name: str | None
) -> None:
    assert session_naming.default_cookbook_session_name(
        *parts, wandb_name=wandb_name
    ) == cb_naming.default_cookbook_session_name(*parts, wandb_name=wandb_name)
    for text in parts:
        if text is not None:
            assert session_naming.slugify(text) == cb_naming.slugify(text)
    assert session_naming.resolve_session_display_name(
        session_name=session_name, wandb_name=wandb_name
    ) == cb_naming.resolve_session_display_name(session_name=session_name, wandb_name=wandb_name)


def test_recipe_user_metadata_has_the_cookbooks_keys() -> None:
    theirs = cb_git_rev.recipe_user_metadata("recipe_rl_loop")
    ours = git_rev.recipe_user_metadata("recipe_rl_loop")
    assert list(ours) == list(theirs) == ["recipe_name", "git_rev"]
    assert ours["recipe_name"] == theirs["recipe_name"]
    assert ours["git_rev"] == importlib.metadata.version("rlpure")  # ours: the code that runs


# --- utils.deprecation ---------------------------------------------------------------------------


def _warned(call: Any) -> tuple[str, type[Warning], str, int] | str:
    """What `call()` warned (message, category, file, line), or the RuntimeError it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            call()
        except RuntimeError as error:
            return f"RuntimeError: {error}"
    assert len(caught) == 1, [str(w.message) for w in caught]
    w = caught[0]
    return str(w.message), w.category, w.filename, w.lineno


@pytest.mark.parametrize("removal", [None, "0.6.2", "1.0", "0.6.1", "0.6.0.dev3", "0.5"])
@pytest.mark.parametrize("message", ["", "Use y instead."])
def test_warn_deprecated_warns_or_raises_as_the_cookbook(removal: str | None, message: str) -> None:
    def through(module: ModuleType) -> Any:
        def caller() -> None:  # both warnings are attributed to this line
            module.warn_deprecated("x", removal_version=removal, message=message)

        return _warned(caller)

    theirs, ours = through(cb_deprecation), through(deprecation)
    if isinstance(theirs, str):
        assert ours == theirs
    else:
        assert isinstance(ours, tuple)
        assert ours[:2] == theirs[:2] and ours[2] == __file__ == theirs[2]
        assert ours[3] == theirs[3]


@pytest.mark.parametrize("removal", [None, "9.0", "0.6.1"])
def test_deprecated_functions_classes_and_attributes_warn_as_the_cookbooks(
    removal: str | None,
) -> None:
    results = []
    for module in (cb_deprecation, deprecation):

        @module.deprecated(message="Use g.", removal_version=removal)
        def f(x: int) -> int:
            return x + 1

        @module.deprecated
        class C:
            def __init__(self, y: int) -> None:
                self.y = y

        getattr_ = module.make_deprecated_module_getattr(
            "pkg.mod", {"Old": ("json.dumps", removal)}
        )
        outcome = [
            _warned(lambda: f(1)),
            _warned(lambda: C(2)),
            _warned(lambda: getattr_("Old")),  # noqa: B023 - called at once
        ]
        with pytest.raises(AttributeError, match=r"module 'pkg\.mod' has no attribute 'Nope'"):
            getattr_("Nope")
        if removal is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                assert f(1) == 2 and C(3).y == 3 and getattr_("Old") is json.dumps
        results.append([o if isinstance(o, str) else o[:2] for o in outcome])
        assert f.__name__ == "f"
    assert results[0] == results[1]


def test_our_deprecation_warnings_point_at_the_code_that_used_the_deprecated_thing() -> None:
    @deprecation.deprecated
    def f() -> None:
        pass

    warned = _warned(lambda: f())  # a deliberate difference: the cookbook points at its wrapper
    assert isinstance(warned, tuple) and warned[2] == __file__


# --- utils.cost_estimation -----------------------------------------------------------------------

KINDS = ("sampled", "prefill_cached", "prefill_uncached", "trained")
usages = st.fixed_dictionaries({kind: st.integers(0, 10**9) for kind in KINDS})
price_values = st.floats(0, 50, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["step", "discard", "extend"]), usages), max_size=6),
    st.one_of(st.none(), st.tuples(price_values, price_values, price_values, price_values)),
    usages,
)
def test_cost_tracker_metrics_are_the_cookbooks(
    events: list[tuple[str, dict[str, int]]],
    prices: tuple[float, float, float, float] | None,
    resumed: dict[str, int],
) -> None:
    trackers = [
        module.CostTracker(
            None if prices is None else module.TokenCostRates(*prices),
            cumulative=module.TokenUsage(**resumed),
        )
        for module in (cb_cost, cost_estimation)
    ]
    outputs: list[list[dict[str, float]]] = [[], []]
    for kind, counts in events:
        for tracker, module, out in zip(trackers, (cb_cost, cost_estimation), outputs, strict=True):
            usage = module.TokenUsage(**counts)
            if kind == "discard":
                tracker.record_discarded_sampling(usage)
                out.append(tracker.cumulative_metrics())
            else:
                out.append((tracker.record_step if kind == "step" else tracker.extend_step)(usage))
    for theirs, ours in zip(*outputs, strict=True):
        assert list(ours) == list(theirs)
        for key, value in theirs.items():
            assert math.isclose(ours[key], value, rel_tol=1e-12, abs_tol=1e-9), key
    assert dataclasses.asdict(trackers[1].cumulative) == dataclasses.asdict(trackers[0].cumulative)


ENTRIES: list[dict[str, object]] = [
    {"tinker_id": "a", "prefill": "$0.13", "cached_prefill": "$0.026", "sample": "$0.40",
     "train": "$0.40", "note": "n"},
    {"tinker_id": "b", "prefill": "$1,234.5", "cached_prefill": 0, "sample": 2.5, "train": "3"},
    {"tinker_id": "c", "prefill": "$1", "sample": "$2", "train": "$3"},
    {"tinker_id": "d", "prefill": "free", "cached_prefill": "$0", "sample": "$1", "train": "$1"},
    {"tinker_id": "e", "prefill": None, "cached_prefill": "", "sample": True, "train": "$1"},
]  # fmt: skip


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: str(e["tinker_id"]))
def test_rates_from_a_pricing_entry_are_the_cookbooks(entry: dict[str, object]) -> None:
    theirs = cb_cost.rates_from_pricing_entry(entry)
    ours = cost_estimation.rates_from_pricing_entry(entry)
    assert (ours is None) == (theirs is None)
    if theirs is not None:
        assert dataclasses.asdict(ours) == dataclasses.asdict(theirs)  # type: ignore[arg-type]


def test_fetch_model_pricing_reads_a_saved_models_json_as_the_cookbook(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved = tmp_path / "models.json"
    saved.write_text(json.dumps(ENTRIES))
    results = []
    for module, flags in ((cb_cost, ("_pricing_entries", "_pricing_fetched")),
                          (cost_estimation, ("_pricing", "_pricing_read"))):  # fmt: skip
        picked = []
        for model in ("a", "b", "c", "unlisted"):
            monkeypatch.setattr(module, flags[0], None)
            monkeypatch.setattr(module, flags[1], False)
            rates = module.fetch_model_pricing(model, url=f"file://{saved}")
            picked.append(None if rates is None else dataclasses.asdict(rates))
        results.append(picked)
    assert results[0] == results[1]
    assert results[1][0] is not None and results[1][3] is None


def test_prices_are_never_fetched_from_the_network(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(cost_estimation, "_pricing", None)
    monkeypatch.setattr(cost_estimation, "_pricing_read", False)
    with caplog.at_level(logging.WARNING):
        assert cost_estimation.fetch_model_pricing("Qwen/Qwen3-8B") is None
        assert cost_estimation.fetch_model_pricing("Qwen/Qwen3-8B") is None
    assert caplog.text.count("Model prices are not fetched") == 1


# --- utils.trace ---------------------------------------------------------------------------------


def _instrumented(module: ModuleType) -> Callable[[], Any]:
    """An async program marked with the module's `scope` / `scope_span` (its phases named as
    a training iteration's)."""

    @module.scope
    async def sample(i: int) -> int:
        module.update_scope_context({"i": i})
        await asyncio.sleep(0)
        return i

    @module.scope
    def train_step() -> None:
        with module.scope_span_sync("forward_backward"):
            module.get_scope_context().attributes["loss"] = 1.5

    async def iteration() -> None:
        async with module.scope_span("sampling"):
            await asyncio.gather(*(asyncio.create_task(sample(i), name=f"s{i}") for i in range(3)))
        train_step()

    return iteration


def test_an_iterations_timing_metrics_have_the_cookbooks_keys_and_counts() -> None:
    shapes = []
    for module in (cb_trace, trace):
        program = _instrumented(module)
        with module.trace_iteration(step=0) as window:
            asyncio.run(program())
        metrics = window.get_timing_metrics()
        assert all(v >= 0 for v in metrics.values())
        assert metrics["time/total"] >= metrics["time/sampling"] >= metrics["time/sample:max"]
        shapes.append(
            {k: v for k, v in metrics.items() if k.endswith(":count")} | {"keys": sorted(metrics)}
        )
        outside = _instrumented(module)
        asyncio.run(outside())  # outside an iteration: nothing recorded, nothing raised
    assert shapes[0] == shapes[1]
    assert shapes[1]["time/sample:count"] == 3


def test_hand_recorded_spans_aggregate_and_serialize_as_the_cookbooks(tmp_path: Path) -> None:
    records = [("sampling", 1.0, 3.5), ("env_step", 1.5, 2.0), ("env_step", 2.0, 3.25)]
    outputs = []
    for module in (cb_trace, trace):
        window = module.IterationWindow()
        for name, start, end in records[:2]:
            window.record_span(name, start, end)
        window.merge_spans(
            [module.SpanRecord(name="env_step", start_time=2.0, end_time=3.25,
                               wall_start=100.0, wall_end=101.25)]
        )  # fmt: skip
        path = tmp_path / f"{module.__name__}.jsonl"
        window.write_spans_jsonl(path, step=4)
        module.IterationWindow().write_spans_jsonl(path, step=5)  # no spans: no line
        row = json.loads(path.read_text())
        outputs.append(
            (
                window.aggregate(),
                window.get_timing_metrics(),
                [(d["name"], d["duration"]) for d in window.get_span_dicts()],
                [r["task"] for r in window.get_span_records()],
                row["step"],
                [(d["name"], d["duration"]) for d in row["spans"]],
                len(path.read_text().splitlines()),
            )
        )
    assert outputs[0] == outputs[1]


def test_the_perfetto_trace_holds_the_cookbooks_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every span event the cookbook writes, ours writes the same; ours writes them all. The
    cookbook's background flusher may drop some (the next test), so what it wrote is a part of
    ours, all of it when it dropped none."""
    traces = []
    for module in (cb_trace, trace):
        path = tmp_path / f"{module.__name__}.jsonl"
        module.trace_init(output_file=str(path))
        try:
            asyncio.run(_instrumented(module)())
        finally:
            module.trace_shutdown()
        events = [json.loads(line) for line in path.read_text().splitlines()]
        main = next((e["args"]["track"] for e in events if e["name"] == "sampling"), None)

        def track(name: str, main: str | None = main) -> str:
            return "main" if name == main else name

        spans = Counter(
            (e["name"], e["ph"], track(e["args"]["track"]), tuple(sorted(e["args"])), e.get("cat"))
            for e in events
            if e["ph"] in "BE"
        )
        tracks = Counter(track(e["args"]["name"]) for e in events if e["name"] == "thread_name")
        traces.append((spans, tracks))
        converted = tmp_path / f"{module.__name__}.json"
        monkeypatch.setattr(sys, "argv", ["convert", str(path), str(converted)])
        module.convert_jsonl_to_json_main()
        assert json.loads(converted.read_text()) == events
    (cookbook_spans, cookbook_tracks), (spans, tracks) = traces
    assert not cookbook_spans - spans
    assert not cookbook_tracks - tracks
    named = Counter((name, ph, where) for name, ph, where, _, _ in spans.elements())
    assert named == Counter(
        {("sample", "B", f"s{i}"): 1 for i in range(3)}
        | {("sample", "E", f"s{i}"): 1 for i in range(3)}
        | {
            (name, ph, "main"): 1
            for name in ("sampling", "train_step", "forward_backward")
            for ph in "BE"
        }
    )
    assert spans[("sample", "E", "s1", ("i", "thread", "track"), "async")] == 1
    assert spans[("train_step", "E", "main", ("loss", "thread", "track"), "async")] == 1


def test_the_cookbooks_flusher_drops_events_queued_while_it_writes_and_ours_keeps_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tinker-cookbook 0.6.1's `TraceCollector._flush_worker` drains the queue at the top of
    its loop, then waits `flush_interval_sec` for one more event and, when none comes,
    `continue`s: what it drained is dropped. So the events queued while it writes a batch are
    lost when nothing follows them in time (README, deliberate differences). Ours writes each
    event as it happens. A write made slow (as on a busy disk) makes the cookbook's loss
    certain: the second span is queued while the first is being written."""
    write = cb_trace.TraceCollector._write_events

    def slow_write(self: Any, events: Any, f: Any) -> None:
        write(self, events, f)
        time.sleep(1.0)

    monkeypatch.setattr(cb_trace.TraceCollector, "_write_events", slow_write)
    written = {}
    for module in (cb_trace, trace):
        path = tmp_path / f"{module.__name__}.jsonl"

        @module.scope
        def first() -> None:
            pass

        @module.scope
        def second() -> None:
            pass

        module.trace_init(flush_interval_sec=0.5, output_file=str(path))
        try:
            # the cookbook's flusher is waiting for an event by now (had `first`'s events come
            # before its first drain, those would be the ones it drops)
            time.sleep(0.2)
            first()
            deadline = time.monotonic() + 10
            while '"first"' not in path.read_text() and time.monotonic() < deadline:
                time.sleep(0.01)  # the cookbook's flusher is now inside its slow write
            second()
            time.sleep(2.0)  # quiet for longer than flush_interval_sec
        finally:
            module.trace_shutdown()
        lines = path.read_text().splitlines()
        written[module] = [(e["name"], e["ph"]) for e in map(json.loads, lines) if e["ph"] in "BE"]
    both = [("first", "B"), ("first", "E"), ("second", "B"), ("second", "E")]
    assert written[trace] == both
    assert written[cb_trace] == both[:2]


def test_the_gantt_chart_is_an_html_page(tmp_path: Path) -> None:
    window = trace.IterationWindow()
    trace.save_gantt_chart_html(window, 3, tmp_path / "empty.html")
    assert not (tmp_path / "empty.html").exists()  # as the cookbook: no spans, no file
    window.record_span("sampling", 1.0, 2.0)
    trace.save_gantt_chart_html(window, 3, tmp_path / "gantt.html")
    html_text = (tmp_path / "gantt.html").read_text()
    assert html_text.startswith("<!DOCTYPE html>") and "data:image/png;base64," in html_text


def test_code_state_is_the_cookbooks_text() -> None:
    modules: list[str | ModuleType] = ["tests.parity.porting", json]  # in this repo; outside any
    assert code_state.code_state(modules) == cb_code_state.code_state(modules)


# --- the recipe entry points these modules let port ----------------------------------------------

MODULES_HERE = (
    "checkpoint_utils",
    "utils.ml_log",
    "utils.lr_scheduling",
    "utils.session_naming",
    "utils.git_rev",
    "utils.deprecation",
    "utils.cost_estimation",
    "utils.trace",
    "utils.code_state",
)
USES_THEM = re.compile(
    r"^\s*(from|import)\s+tinker_cookbook(\s+import\s+.*\bcheckpoint_utils\b|\.checkpoint_utils\b"
    r"|\.utils\s+import\s+.*\b(ml_log|lr_scheduling|session_naming|git_rev|deprecation"
    r"|cost_estimation|trace|code_state)\b|\.utils\.(ml_log|lr_scheduling|session_naming|git_rev"
    r"|deprecation|cost_estimation|trace|code_state)\b)",
    re.MULTILINE,
)
MATH_EXTRAS_MISSING = "math-rl dependencies (sympy, pylatexenc, math-verify) are required"
"""How the math_rl recipe's modules stop without its extras (math-verify, pylatexenc): a file
that stops so is not this test's business (the coverage test lists it)."""


@pytest.fixture(scope="module")
def ported_recipes() -> Iterator[None]:
    """Sibling recipe modules (`shell.cookbook.recipes.*`) served ported while a test runs."""
    with serve_ported_recipes():
        yield


def test_every_file_that_uses_these_modules_ports_or_lacks_another_one(
    ported_recipes: None,
) -> None:
    """Each file of `recipes/` and `rl/` importing one of these modules either imports, or
    stops on a module (or name) that is not one of them."""
    files = sorted(
        p.relative_to(COOKBOOK).as_posix()
        for folder in ("recipes", "rl")
        for p in (COOKBOOK / folder).rglob("*.py")
        if USES_THEM.search(p.read_text())
    )
    assert "recipes/rl_loop.py" in files, "USES_THEM no longer finds the files that use them"
    lacking: dict[str, str] = {}
    for path in files:
        try:
            ported_module(path)
        except ImportError as error:
            if MATH_EXTRAS_MISSING not in str(error):  # else not this test's business
                lacking[path] = str(error).splitlines()[0]
    for path, reason in lacking.items():
        for module in MODULES_HERE:
            leaf = module.rsplit(".", 1)[-1]
            assert f"shell.cookbook.{module}'" not in reason, (path, reason)  # it, or a name in it
            assert f"name '{leaf}' from 'shell.cookbook" not in reason, (path, reason)
