"""`shell.serve.Engine` in-process: training order, deduplication, batching, eviction, close.

The HTTP layer is tested with the real SDK elsewhere in tests/serve; these tests drive the
engine directly, so they can count what reaches the local clients.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tinker import types

from shell.local import LocalSamplingClient, LocalTrainingClient
from shell.serve import Engine
from shell.serve._engine import SamplerSpec
from shell.serve._replies import Reply, json_reply

MODEL = "rlpure/tiny"


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = Engine(state_dir=tmp_path / "state", max_samplers=2)
    try:
        yield engine
    finally:
        engine.close()


def _result(engine: Engine, request_id: str) -> Reply:
    async def wait() -> Reply | None:
        return await engine.wait_result(request_id, 60.0)

    reply = asyncio.run(wait())
    assert reply is not None
    return reply


def _json(reply: Reply) -> dict:
    return json.loads(reply.body)


def _create(engine: Engine, model_id: str = "s-test:train:0") -> str:
    session = model_id.split(":train:")[0]
    request_id = engine.submit_create(
        session,
        model_id,
        "create_model",
        lambda: engine.service.create_lora_training_client(
            MODEL, 8, training_run_id=model_id
        ).result(),
    )
    assert _json(_result(engine, request_id)) == {"model_id": model_id, "type": "create_model"}
    return model_id


def test_training_ops_run_in_seq_id_order_whatever_order_they_arrive_in(engine: Engine) -> None:
    model_id = _create(engine)
    order: list[int] = []

    def op(seq: int):
        def run(client: LocalTrainingClient) -> Reply:
            order.append(seq)
            return json_reply({"seq": seq})

        return run

    ids = {seq: engine.submit_training(model_id, seq, "op", op(seq)) for seq in (3, 1, 4, 2)}
    assert [_json(_result(engine, ids[seq]))["seq"] for seq in (1, 2, 3, 4)] == [1, 2, 3, 4]
    assert order == [1, 2, 3, 4]


def test_an_op_waits_for_its_missing_predecessor(engine: Engine) -> None:
    model_id = _create(engine)
    later = engine.submit_training(model_id, 2, "op", lambda c: json_reply({"seq": 2}))

    async def poll() -> Reply | None:
        return await engine.wait_result(later, 0.3)

    assert asyncio.run(poll()) is None  # seq 1 has not arrived
    first = engine.submit_training(model_id, 1, "op", lambda c: json_reply({"seq": 1}))
    assert _json(_result(engine, first)) == {"seq": 1}
    assert _json(_result(engine, later)) == {"seq": 2}


def test_a_retried_submit_gets_the_first_request_id_and_runs_once(engine: Engine) -> None:
    model_id = _create(engine)
    runs: list[int] = []

    def op(client: LocalTrainingClient) -> Reply:
        runs.append(1)
        return json_reply({})

    first = engine.submit_training(model_id, 1, "op", op)
    again = engine.submit_training(model_id, 1, "op", op)
    assert first == again
    _result(engine, first)
    assert runs == [1]


def test_unknown_model_and_reused_seq_id_fail_the_future_as_user_errors(engine: Engine) -> None:
    unknown = _json(
        _result(engine, engine.submit_training("nope", 1, "optim_step", lambda c: json_reply({})))
    )
    assert unknown["category"] == "user" and "unknown model_id 'nope'" in unknown["error"]
    model_id = _create(engine)
    _result(engine, engine.submit_training(model_id, 1, "op", lambda c: json_reply({})))
    # a different request (new key after the first was purged is impossible here): seq 1 again
    # through a new model op key is refused by the slot
    engine._seen.clear()  # simulate a request id that was forgotten
    reused = _json(
        _result(engine, engine.submit_training(model_id, 1, "op", lambda c: json_reply({})))
    )
    assert reused["category"] == "user" and "seq_id 1" in reused["error"]


def test_an_op_that_raises_is_a_failed_future_not_a_dead_worker(engine: Engine) -> None:
    model_id = _create(engine)

    def bad(client: LocalTrainingClient) -> Reply:
        raise ValueError("datum 3: bad")

    def bug(client: LocalTrainingClient) -> Reply:
        raise ZeroDivisionError("secret detail")

    user = _json(_result(engine, engine.submit_training(model_id, 1, "fb", bad)))
    assert user == {"error": "fb: datum 3: bad", "category": "user"}
    server = _json(_result(engine, engine.submit_training(model_id, 2, "fb", bug)))
    assert server["category"] == "server" and "secret detail" not in server["error"]
    ok = engine.submit_training(model_id, 3, "op", lambda c: json_reply({"fine": True}))
    assert _json(_result(engine, ok)) == {"fine": True}


def _sample_run(prompt: list[int]):
    async def run(client: LocalSamplingClient) -> Reply:
        response = await client.sample(
            types.ModelInput.from_ints(prompt), 2, types.SamplingParams(max_tokens=4, seed=7)
        ).result_async()
        return json_reply({"tokens": [list(s.tokens) for s in response.sequences]})

    return run


def test_concurrent_samples_share_jitted_calls(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    original = LocalSamplingClient._run_requests

    def counting(self: LocalSamplingClient, requests: list) -> list:
        calls.append(len(requests))
        return original(self, requests)

    monkeypatch.setattr(LocalSamplingClient, "_run_requests", counting)
    engine.add_sampler("s-x:sample:0", SamplerSpec(session_id="s-x", base_model=MODEL))
    # warm up (compile) so the batch below is not split by a long first call
    _result(engine, engine.submit_sample("s-x:sample:0", 0, _sample_run([256, 1])))
    calls.clear()
    blocker = threading.Event()
    engine._loop.call_soon_threadsafe(blocker.wait, 30)  # hold the worker while requests arrive
    ids = [engine.submit_sample("s-x:sample:0", i + 1, _sample_run([256, i])) for i in range(32)]
    blocker.set()
    replies = [_json(_result(engine, rid)) for rid in ids]
    assert len(replies) == 32 and all(len(r["tokens"]) == 2 for r in replies)
    assert sum(calls) == 32 and len(calls) == 1, calls  # one batched call served all 32


def test_samplers_are_evicted_least_recently_used_and_saved_ones_rebuilt(engine: Engine) -> None:
    for index in range(3):  # max_samplers=2
        engine.add_sampler(f"s-x:sample:{index}", SamplerSpec(session_id="s-x", base_model=MODEL))
        _result(engine, engine.submit_sample(f"s-x:sample:{index}", 0, _sample_run([256])))
    assert len(engine._samplers) == 2 and "s-x:sample:0" not in engine._samplers
    again = _json(_result(engine, engine.submit_sample("s-x:sample:0", 1, _sample_run([256]))))
    first = _json(_result(engine, engine.submit_sample("s-x:sample:1", 1, _sample_run([256]))))
    assert again["tokens"] == first["tokens"]  # seeded: the rebuilt sampler samples the same


def test_an_evicted_snapshot_sampler_fails_with_what_to_do(engine: Engine) -> None:
    model_id = _create(engine)

    def snapshot(client: LocalTrainingClient) -> Reply:
        sampler = client.save_weights_and_get_sampling_client().result()
        engine.add_snapshot_sampler("s-test:sample:9", "s-test", sampler, model_id)
        return json_reply({})

    _result(engine, engine.submit_training(model_id, 1, "snap", snapshot))
    for index in range(2):
        engine.add_sampler(f"s-x:sample:{index}", SamplerSpec(session_id="s-x", base_model=MODEL))
        _result(engine, engine.submit_sample(f"s-x:sample:{index}", 0, _sample_run([256])))
    failed = _json(_result(engine, engine.submit_sample("s-test:sample:9", 0, _sample_run([256]))))
    assert failed["category"] == "user" and "--max-samplers" in failed["error"]


def test_close_fails_queued_ops_and_refuses_new_work(engine: Engine) -> None:
    model_id = _create(engine)
    waiting = engine.submit_training(model_id, 2, "op", lambda c: json_reply({}))  # seq 1 missing
    engine.close()
    failed = json.loads(engine._futures[waiting].future.result(5).body)
    assert failed["category"] == "server" and "shut down" in failed["error"]
    with pytest.raises(RuntimeError, match="shutting down"):
        engine.submit_training(model_id, 1, "op", lambda c: json_reply({}))


def test_close_lets_the_running_op_finish_and_fails_the_queued_ones_unrun(
    engine: Engine,
) -> None:
    """SIGTERM's promise: ops queued behind the running one (already handed to the worker)
    fail as shut down instead of running after it (they used to run, their results lost)."""
    model_id = _create(engine)
    started, ran = threading.Event(), []

    def slow(client: LocalTrainingClient) -> Reply:
        started.set()
        time.sleep(1.0)
        ran.append(1)
        return json_reply({"seq": 1})

    def quick(seq: int) -> Any:
        def run(client: LocalTrainingClient) -> Reply:
            ran.append(seq)
            return json_reply({"seq": seq})

        return run

    first = engine.submit_training(model_id, 1, "op", slow)
    assert started.wait(30)
    queued = [engine.submit_training(model_id, seq, "op", quick(seq)) for seq in (2, 3)]
    engine.close()
    assert json.loads(engine._futures[first].future.result(5).body) == {"seq": 1}
    for request_id in queued:
        failed = json.loads(engine._futures[request_id].future.result(5).body)
        assert failed["category"] == "server" and "shut down before this ran" in failed["error"]
    assert ran == [1]


def test_reads_answer_while_the_worker_trains(engine: Engine) -> None:
    """A REST call (`read_async`) runs beside a long training operation. REST calls used to
    queue behind training: minutes on a CPU, past the SDK's 60 s timeout."""
    model_id = _create(engine)
    started, release = threading.Event(), threading.Event()

    def slow(client: LocalTrainingClient) -> Reply:
        started.set()
        assert release.wait(30)
        return json_reply({"seq": 1})

    running = engine.submit_training(model_id, 1, "op", slow)
    assert started.wait(30)

    async def read() -> list[str]:
        rest = engine.service.create_rest_client
        runs = await asyncio.wait_for(
            engine.read_async(lambda: rest().list_training_runs().result()), 10
        )
        return [run.training_run_id for run in runs.training_runs]

    try:
        assert model_id in asyncio.run(read())
    finally:
        release.set()
    assert _json(_result(engine, running)) == {"seq": 1}
    engine.close()
    with pytest.raises(RuntimeError, match="shutting down"):
        asyncio.run(engine.read_async(lambda: None))


def test_a_refused_requests_seq_id_is_skipped_so_the_next_one_runs(engine: Engine) -> None:
    model_id = _create(engine)
    engine.skip_training_seq(model_id, 1, "save_weights")  # refused with a 400 by the app
    after = engine.submit_training(model_id, 2, "op", lambda c: json_reply({"seq": 2}))
    assert _json(_result(engine, after)) == {"seq": 2}


def test_finishing_a_session_releases_its_models_but_keeps_checkpoints(engine: Engine) -> None:
    model_id = _create(engine)

    def save(client: LocalTrainingClient) -> Reply:
        return json_reply({"path": client.save_state("a").result().path})

    path = _json(_result(engine, engine.submit_training(model_id, 1, "save", save)))["path"]
    engine.finish_session("s-test")
    gone = _json(
        _result(engine, engine.submit_training(model_id, 2, "op", lambda c: json_reply({})))
    )
    assert "unknown model_id" in gone["error"]
    assert (Path(path) / "manifest.json").is_file()
    with pytest.raises(KeyError):
        engine.info(model_id)


def test_get_info_names_a_tokenizer_directory_the_sdk_loads(engine: Engine) -> None:
    from transformers import AutoTokenizer

    info = engine.info(_create(engine))
    tokenizer_id = info.model_data.tokenizer_id
    assert tokenizer_id is not None and ":" not in tokenizer_id
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_id)
    assert tokenizer.encode("hi") == [256, 104, 105]
    assert np.array_equal(tokenizer.encode("hé"), [256, 104, 0xC3, 0xA9])


def test_errors_name_checkpoints_by_tinker_path_never_by_folder(engine: Engine) -> None:
    model_id = _create(engine)

    def save(client: LocalTrainingClient) -> Reply:
        return json_reply({"path": client.save_state("a").result().path})

    _result(engine, engine.submit_training(model_id, 1, "save", save))
    again = _json(_result(engine, engine.submit_training(model_id, 2, "save_weights", save)))
    assert again["category"] == "user"
    assert f"tinker://{model_id}/weights/a" in again["error"]
    assert str(engine.state_dir) not in again["error"]


def test_an_unclaimed_result_is_kept_an_hour_from_its_finish_not_from_its_request(
    engine: Engine,
) -> None:
    model_id = _create(engine)
    slow = engine.submit_training(model_id, 1, "op", lambda c: json_reply({"slow": 1}))
    gone = engine.submit_training(model_id, 2, "op", lambda c: json_reply({}))
    engine._future(slow).result(30), engine._future(gone).result(30)  # finished, never fetched
    engine._futures[slow].created = 0.0  # asked at the epoch: it ran for decades, finished now
    engine._futures[gone].finished_at = 0.0  # finished at the epoch: its client is long gone
    assert engine.purge_results() == 1
    assert _json(_result(engine, slow)) == {"slow": 1}
    with pytest.raises(KeyError):
        _result(engine, gone)


def test_purge_forgets_results_delivered_long_ago_and_keeps_recent_ones(engine: Engine) -> None:
    model_id = _create(engine)
    old = engine.submit_training(model_id, 1, "op", lambda c: json_reply({}))
    recent = engine.submit_training(model_id, 2, "op", lambda c: json_reply({}))
    _result(engine, old), _result(engine, recent)
    engine._futures[old].delivered_at = 0.0  # delivered at the epoch: long past the grace
    assert engine.purge_results() == 1
    with pytest.raises(KeyError):
        _result(engine, old)
    assert _json(_result(engine, recent)) == {}
