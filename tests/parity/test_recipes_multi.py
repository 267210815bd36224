"""The cookbook's multi-player and sandboxed recipes, ported, train offline through their own entry.

Each recipe's `train.py` is imported by the port rule (`tinker_cookbook` → `shell.cookbook` in its
imports, nothing else; sibling recipe files served by `serve_ported_recipes`), its `CLIConfig` is
parsed by `chz.entrypoint(CLIConfig, argv=[...])` as its `__main__` does, overridden only by
model, sizes and paths, and the `Config` its own code builds trains through the facade's
`main` on the local backend:

- `multiplayer_rl/twenty_questions`: the player trains in process (`LocalServiceClient`); the
  answerer is the dataset builder's own `tinker.ServiceClient(base_url=...)` talking to
  `rlpure serve` on a loopback port (the builder's `base_url` and `answerer_base_model` fields
  are the only things set after `build_config`: the recipe's CLI has neither).
- `multiplayer_rl/text_arena`: tic-tac-toe from `textarena` (0.7.4), self-play in training and
  the cookbook's own random opponent (`test_opponent=random`) in the evaluation.
- `code_rl`: see `test_code_rl_trains_with_a_local_run_code_server`.

Speed (2 CPU cores, JAX's compilation cache warm): the player is a micro model (one layer,
width 16, with the byte tokenizer's 2048-token context) that compiles in seconds; the answerer
runs `rlpure/tiny` on the server.
"""

from __future__ import annotations

import asyncio
import json
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import chz
import pytest

from rlpure.model import VOCAB_SIZE, ModelConfig
from shell.cookbook.rl import train
from shell.local import LocalServiceClient
from tests.parity.porting import import_ported, require_cookbook, serve_ported_recipes
from tests.serve.server import running_server, sdk_env

require_cookbook()

PLAYER = "test/recipe-micro"
PLAYER_CONFIG = ModelConfig(
    vocab_size=VOCAB_SIZE, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=2048
)
ANSWERER = "rlpure/tiny"
"""A model `rlpure serve` knows by name; its recommended renderer is `role_colon`."""
RENDERER = "role_colon"


@pytest.fixture(scope="module", autouse=True)
def _ported_recipes() -> Iterator[None]:
    with serve_ported_recipes():
        yield


def _recipe(path: str) -> types.ModuleType:
    """The cookbook's `recipes/<path>` imported by the port rule."""
    return import_ported(f"recipes/{path}")


def _service(log_path: Path) -> LocalServiceClient:
    return LocalServiceClient(
        seed=0,
        checkpoint_dir=log_path / "local_states",
        model_configs={PLAYER: PLAYER_CONFIG},
    )


def _cli(module: types.ModuleType, log_path: Path, **overrides: Any) -> Any:
    """`chz.entrypoint(CLIConfig, argv=...)`, as the recipe's `__main__` parses its arguments."""
    argv = [
        f"model_name={PLAYER}",
        f"renderer_name={RENDERER}",
        f"log_path={log_path}",
        *(f"{name}={value}" for name, value in overrides.items()),
    ]
    return chz.entrypoint(module.CLIConfig, argv=argv)


def _rows(log_path: Path) -> list[dict[str, Any]]:
    lines = (log_path / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _step_rows(log_path: Path) -> list[dict[str, Any]]:
    """The training steps' rows (not the final totals row)."""
    return [row for row in _rows(log_path) if "final_totals" not in row]


def _checkpoints(log_path: Path) -> list[dict[str, Any]]:
    lines = (log_path / "checkpoints.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_twenty_questions_trains_with_the_answerer_on_rlpure_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One step of 2 twenty-turn episodes: every player turn gets the answerer's reply, sampled
    by the recipe's own answerer client through `rlpure serve`."""
    module = _recipe("multiplayer_rl/twenty_questions/train.py")
    log_path = tmp_path / "run"
    cli = _cli(
        module, log_path, batch_size=1, group_size=2, max_tokens=8, eval_every=0, max_steps=1
    )
    config = module.build_config(cli)
    assert isinstance(config, train.Config) and config.log_path == str(log_path)
    with running_server(tmp_path / "state", "-v") as server:
        for name, value in sdk_env(server).items():
            monkeypatch.setenv(name, value)
        builder = chz.replace(
            config.dataset_builder, base_url=server.url, answerer_base_model=ANSWERER
        )
        config = chz.replace(config, dataset_builder=builder)
        result = asyncio.run(train.main(config, service_client=_service(log_path)))
        log = server.log_text()

    assert (result.start_step, result.end_step) == (0, 1)
    (row,) = _step_rows(log_path)
    assert row["step"] == 0
    assert row["env/all/total_episodes"] == 2 and row["env/all/total_turns"] == 40, row
    assert 0.0 <= row["env/all/reward/total"] <= 1.0, row
    # the answerer's sampler: one session on its base model, sampled once per player turn
    assert log.count('"POST /api/v1/create_sampling_session HTTP/1.1" 200') == 1, log[-3000:]
    assert log.count('"POST /api/v1/asample HTTP/1.1" 200') >= 40, log[-3000:]
    (final,) = _checkpoints(log_path)
    assert final["name"] == "final" and final["batch"] == 1


def test_text_arena_tictactoe_trains_by_self_play(tmp_path: Path) -> None:
    """Two steps of self-play tic-tac-toe and the evaluation against the random opponent."""
    module = _recipe("multiplayer_rl/text_arena/train.py")
    log_path = tmp_path / "run"
    cli = _cli(
        module,
        log_path,
        batch_size=2,
        num_train_datapoints=4,
        num_test_datapoints=2,
        test_opponent="random",
        max_tokens=8,
        eval_every=1,
        save_every=1,
        max_steps=2,
    )
    config = module.build_config(cli)
    assert config.dataset_builder.game_name == "TicTacToe-v0"
    result = asyncio.run(train.main(config, service_client=_service(log_path)))

    assert (result.start_step, result.end_step) == (0, 2)
    *rows, final_eval = _step_rows(log_path)
    assert [row["step"] for row in rows] == [0, 1]
    for row in rows:
        assert row["env/all/total_episodes"] == 2, row  # one game, both sides
        # an illegal move costs its player -2 (ILLEGAL_MOVE_REWARD); a game's result is ±1 or 0
        assert -2.0 <= row["env/all/reward/total"] <= 1.0, row
        assert row["test/env/all/total_episodes"] == 2, row  # each side against the opponent
        assert -2.0 <= row["test/env/all/reward/total"] <= 1.0, row
    assert final_eval["final_eval"] == 1 and final_eval["step"] == 2, final_eval
    saved = _checkpoints(log_path)
    assert [(c["name"], c["batch"]) for c in saved] == [("000001", 1), ("000002", 2), ("final", 2)]
