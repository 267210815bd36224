"""`shell.serve._ttl.CheckpointTtl`: the checkpoint expiry table beside the checkpoints.

`set` stamps `time.time() + ttl_seconds`, so the tests bracket that call with their own clock
readings and pass `now` to `expired` explicitly. The table survives a new instance on the same
root; a table that cannot be read expires nothing and raises nothing (the janitor must never
delete by mistake, nor die); a write replaces the file whole.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from shell.serve._paths import CheckpointRef
from shell.serve._ttl import CheckpointTtl

A = CheckpointRef(run="s1:train:0", kind="weights", name="000010")
B = CheckpointRef(run="s1:train:0", kind="sampler_weights", name="final")
C = CheckpointRef(run="s2:train:1", kind="weights", name="x")


def _stamped(ttl: CheckpointTtl, ref: CheckpointRef, ttl_seconds: int) -> tuple[float, float]:
    """Sets `ref`'s ttl; returns the window `[before, after]` its expiry lies in."""
    before = time.time()
    ttl.set(ref, ttl_seconds)
    after = time.time()
    return before + ttl_seconds, after + ttl_seconds


def _table(root: Path) -> Any:
    return json.loads((root / "ttl.json").read_text(encoding="utf-8"))


def test_set_then_expires_at_and_expired(tmp_path: Path):
    ttl = CheckpointTtl(tmp_path)
    low, high = _stamped(ttl, A, 100)
    expires = ttl.expires_at(A)
    assert expires is not None
    assert expires.tzinfo == dt.UTC
    assert low - 1e-3 <= expires.timestamp() <= high + 1e-3
    assert ttl.expires_at(B) is None
    assert ttl.expired(now=low - 1) == []
    assert ttl.expired(now=high) == [A]
    assert ttl.expired(now=high + 1e6) == [A]


def test_expired_picks_only_the_due_checkpoints(tmp_path: Path):
    ttl = CheckpointTtl(tmp_path)
    _, a_high = _stamped(ttl, A, 10)
    b_low, _ = _stamped(ttl, B, 1000)
    _stamped(ttl, C, 5)  # set later, due earlier than A
    assert sorted(ttl.expired(now=a_high), key=lambda ref: ref.tinker_path) == sorted(
        [A, C], key=lambda ref: ref.tinker_path
    )
    assert set(ttl.expired(now=b_low - 1)) == {A, C}
    assert {ref.tinker_path for ref in ttl.expired(now=b_low + 2000)} == {
        A.tinker_path,
        B.tinker_path,
        C.tinker_path,
    }


def test_expired_defaults_to_the_clock(tmp_path: Path):
    ttl = CheckpointTtl(tmp_path)
    ttl.set(A, 3600)
    ttl.set(B, 0)
    assert ttl.expired() == [B]


def test_a_new_ttl_replaces_the_old(tmp_path: Path):
    ttl = CheckpointTtl(tmp_path)
    _stamped(ttl, A, 10)
    low, high = _stamped(ttl, A, 10_000)
    expires = ttl.expires_at(A)
    assert expires is not None
    assert low - 1e-3 <= expires.timestamp() <= high + 1e-3
    assert ttl.expired(now=low - 1) == []


def test_forget_and_none_remove_the_entry(tmp_path: Path):
    ttl = CheckpointTtl(tmp_path)
    ttl.set(A, 10)
    ttl.set(B, 10)
    ttl.forget(A)
    ttl.set(B, None)
    assert ttl.expires_at(A) is None
    assert ttl.expires_at(B) is None
    assert ttl.expired(now=time.time() + 1e6) == []
    assert _table(tmp_path) == {}
    reread = CheckpointTtl(tmp_path)
    assert reread.expires_at(A) is None
    assert reread.expired(now=time.time() + 1e6) == []


def test_removing_what_is_not_there_writes_nothing(tmp_path: Path):
    ttl = CheckpointTtl(tmp_path)
    ttl.forget(A)
    ttl.set(B, None)
    assert list(tmp_path.iterdir()) == []


def test_the_table_survives_a_new_instance(tmp_path: Path):
    first = CheckpointTtl(tmp_path)
    first.set(A, 50)
    first.set(B, 5000)
    second = CheckpointTtl(tmp_path)
    assert second.expires_at(A) == first.expires_at(A)
    assert second.expires_at(B) == first.expires_at(B)
    table = _table(tmp_path)
    assert isinstance(table, dict)
    assert sorted(table) == sorted([A.tinker_path, B.tinker_path])
    assert second.expired(now=table[A.tinker_path] - 1e-3) == []
    assert second.expired(now=table[A.tinker_path]) == [A]


def test_the_checkpoint_root_is_created_on_the_first_write(tmp_path: Path):
    root = tmp_path / "state" / "checkpoints"
    ttl = CheckpointTtl(root)
    assert ttl.expired(now=time.time() + 1e6) == []
    ttl.set(A, 1)
    assert (root / "ttl.json").is_file()


@pytest.mark.parametrize(
    "text",
    [
        "",
        "garbage {",
        "\x00\xff",
        "[1, 2, 3]",
        '["tinker://s1:train:0/weights/000010", 0]',
        "0",
        '"tinker://s1:train:0/weights/000010"',
        "null",
        '{"tinker://s1:train:0/weights/000010": "0"}',
        '{"tinker://s1:train:0/weights/000010": null}',
        '{"tinker://s1:train:0/weights/000010": true}',
        '{"tinker://s1:train:0/weights/000010": [0]}',
        '{"tinker://s1:train:0/weights/000010": {"at": 0}}',
        '{"tinker://s1:train:0/weights/000010": NaN}',
    ],
)
def test_a_corrupt_table_expires_nothing(tmp_path: Path, text: str):
    (tmp_path / "ttl.json").write_text(text, encoding="utf-8")
    ttl = CheckpointTtl(tmp_path)
    assert ttl.expired(now=time.time() + 1e12) == []


def test_an_unreadable_table_expires_nothing(tmp_path: Path):
    (tmp_path / "ttl.json").write_bytes(b"\xff\xfe{not utf-8")
    assert CheckpointTtl(tmp_path).expired(now=time.time() + 1e12) == []
    (tmp_path / "ttl.json").unlink()
    (tmp_path / "ttl.json").mkdir()  # a folder where the file should be
    assert CheckpointTtl(tmp_path).expired(now=time.time() + 1e12) == []


def test_good_entries_survive_beside_bad_values(tmp_path: Path):
    table = {A.tinker_path: 100, B.tinker_path: "soon", C.tinker_path: False}
    (tmp_path / "ttl.json").write_text(json.dumps(table), encoding="utf-8")
    ttl = CheckpointTtl(tmp_path)
    assert ttl.expired(now=99) == []
    assert ttl.expired(now=100) == [A]
    assert ttl.expires_at(A) == dt.datetime.fromtimestamp(100, tz=dt.UTC)
    assert ttl.expires_at(B) is None
    assert ttl.expires_at(C) is None


def test_a_key_that_is_not_a_tinker_path_expires_nothing(tmp_path: Path):
    table = {"garbage": 0, "tinker://r/state/x": 0, A.tinker_path: 0}
    (tmp_path / "ttl.json").write_text(json.dumps(table), encoding="utf-8")
    ttl = CheckpointTtl(tmp_path)
    assert ttl.expired(now=1) == [A]


def test_a_huge_integer_in_the_table_does_not_raise(tmp_path: Path):
    (tmp_path / "ttl.json").write_text(f'{{"{A.tinker_path}": 1{"0" * 400}}}', encoding="utf-8")
    ttl = CheckpointTtl(tmp_path)
    assert ttl.expired(now=time.time() + 1e12) == []


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e300"])
def test_a_corrupt_time_does_not_break_expires_at(tmp_path: Path, value: str):
    (tmp_path / "ttl.json").write_text(f'{{"{A.tinker_path}": {value}}}', encoding="utf-8")
    ttl = CheckpointTtl(tmp_path)
    ttl.expires_at(A)  # must not raise: listings read it for every checkpoint


@pytest.mark.parametrize("ttl_seconds", [10**12, 10**400], ids=["1e12", "1e400"])
def test_a_huge_ttl_is_refused_or_readable(tmp_path: Path, ttl_seconds: int):
    ttl = CheckpointTtl(tmp_path)
    try:
        ttl.set(A, ttl_seconds)
    except ValueError as err:  # refusing it, naming the field, is fine
        assert "ttl_seconds" in str(err)
        assert ttl.expires_at(A) is None
    else:
        ttl.expires_at(A)  # must not raise
        assert CheckpointTtl(tmp_path).expired(now=time.time() + 1e6) == []


def test_the_file_after_set_is_whole_json_and_no_staging_file_remains(tmp_path: Path):
    ttl = CheckpointTtl(tmp_path)
    for step, ref in enumerate((A, B, C, A)):
        ttl.set(ref, 10 * (step + 1))
        assert isinstance(_table(tmp_path), dict)
        assert sorted(path.name for path in tmp_path.iterdir()) == ["ttl.json"]
    ttl.forget(B)
    assert sorted(_table(tmp_path)) == sorted([A.tinker_path, C.tinker_path])
    assert sorted(path.name for path in tmp_path.iterdir()) == ["ttl.json"]


def test_a_crash_before_the_rename_leaves_the_old_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    ttl = CheckpointTtl(tmp_path)
    ttl.set(A, 100)
    old = (tmp_path / "ttl.json").read_bytes()

    def crash(src: object, dst: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk gone"):
        ttl.set(B, 100)
    monkeypatch.undo()
    assert (tmp_path / "ttl.json").read_bytes() == old  # never half a table
    assert CheckpointTtl(tmp_path).expires_at(B) is None


def test_the_write_goes_through_a_staging_file_and_os_replace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    moves: list[tuple[str, str, object]] = []
    real_replace = os.replace

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        moves.append((os.fspath(src), os.fspath(dst), json.loads(Path(src).read_text())))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    CheckpointTtl(tmp_path).set(A, 5)
    ((src, dst, staged),) = moves
    assert Path(dst) == tmp_path / "ttl.json"
    assert Path(src).parent == tmp_path
    assert Path(src) != Path(dst)
    assert isinstance(staged, dict)
    assert list(staged) == [A.tinker_path]


def test_concurrent_sets_keep_every_entry(tmp_path: Path):
    ttl = CheckpointTtl(tmp_path)
    refs = [
        CheckpointRef(run=f"r{t}", kind="weights", name=f"{i:03d}")
        for t in range(4)
        for i in range(15)
    ]

    def work(chunk: list[CheckpointRef]) -> None:
        for ref in chunk:
            ttl.set(ref, 60)

    threads = [threading.Thread(target=work, args=(refs[t::4],)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(_table(tmp_path)) == sorted(ref.tinker_path for ref in refs)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["ttl.json"]
