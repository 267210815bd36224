"""`shell.serve._paths`: tinker paths resolve inside the checkpoint root, and nowhere else.

A path from a request is `tinker://<run>/<weights|sampler_weights>/<name>`, three plain folder
names; everything else is a `PathError` whose message starts with the field it came from. The
property tests throw arbitrary text at the parser and check that whatever it accepts names a
folder exactly three levels below the root (compared after `os.path.normpath`, which collapses
`..` the way the filesystem would, without following links).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shell.serve._paths import (
    CheckpointRef,
    PathError,
    check_folder_name,
    parse_checkpoint_id,
    parse_tinker_path,
    ref_from_directory,
)

ROOT = Path("/srv/state/checkpoints")

# Text with the characters that matter here drawn often: separators, dots, NUL, backslash.
_TRICKY = st.lists(
    st.sampled_from(["/", "\\", ".", "..", "\x00", "a", "0", ":", " ", "~", "%2e", "é"])
    | st.characters(),
    max_size=8,
).map("".join)
_PARTS = st.lists(
    st.one_of(
        st.sampled_from(["", ".", "..", "weights", "sampler_weights", "state", "s1:train:0"]),
        st.text(max_size=8),
        st.lists(st.sampled_from(["/", "\\", ".", "..", "\x00", "a"]), max_size=5).map("".join),
    ),
    max_size=5,
).map("/".join)
_TAILS = st.one_of(
    st.text(),
    _PARTS,
    st.tuples(_TRICKY, st.sampled_from(["weights", "sampler_weights", "state"]), _TRICKY).map(
        "/".join
    ),
)


def _assert_inside(ref: CheckpointRef, root: Path) -> None:
    """`ref.directory(root)` is exactly three levels below `root` once `..` is collapsed."""
    directory = os.path.normpath(ref.directory(root))
    assert os.path.commonpath([str(root), directory]) == str(root), directory
    relative = Path(directory).relative_to(root)
    assert len(relative.parts) == 3, relative
    assert ".." not in relative.parts
    assert Path(directory) == ref.directory(root)  # nothing was collapsed on the way


@pytest.mark.parametrize(
    ("path", "run", "kind", "name"),
    [
        ("tinker://s1:train:0/weights/000010", "s1:train:0", "weights", "000010"),
        ("tinker://s1:train:0/sampler_weights/final", "s1:train:0", "sampler_weights", "final"),
        ("tinker://run/weights/...", "run", "weights", "..."),  # three dots is a plain name
        ("tinker://a b/weights/x.y", "a b", "weights", "x.y"),
    ],
)
def test_parse_tinker_path_accepts_checkpoint_paths(path: str, run: str, kind: str, name: str):
    ref = parse_tinker_path(path)
    assert ref == CheckpointRef(run=run, kind=kind, name=name)  # type: ignore[arg-type]
    assert ref.tinker_path == path
    assert ref.checkpoint_id == f"{kind}/{name}"
    local = {"weights": "state", "sampler_weights": "sampler"}[kind]
    assert ref.directory(ROOT) == ROOT / run / local / name


@pytest.mark.parametrize("path", [None, 3, b"tinker://a/weights/b", Path("tinker://a/weights/b")])
def test_parse_tinker_path_refuses_non_strings(path: object):
    with pytest.raises(PathError, match=r"^model_path: expected a tinker:// path, got "):
        parse_tinker_path(path, field="model_path")


@pytest.mark.parametrize(
    ("path", "fault"),
    [
        ("s1:train:0/weights/000010", "is not a tinker:// path"),
        ("/srv/state/checkpoints/r/state/x", "is not a tinker:// path"),
        ("./r/state/x", "is not a tinker:// path"),
        ("file:///etc/passwd", "is not a tinker:// path"),
        ("TINKER://r/weights/x", "is not a tinker:// path"),
        ("tinker:/r/weights/x", "is not a tinker:// path"),
        ("", "is not a tinker:// path"),
        ("tinker://r/weights", "must have three parts"),
        ("tinker://r", "must have three parts"),
        ("tinker://", "must have three parts"),
        ("tinker://a/r/weights/x", "must have three parts"),
        ("tinker://r/weights/x/", "must have three parts"),
        ("tinker://r/weights/../../x", "must have three parts"),
        ("tinker:///etc/passwd/x", "must have three parts"),
        ("tinker://r/state/x", "unknown checkpoint kind 'state'"),
        ("tinker://r/sampler/x", "unknown checkpoint kind 'sampler'"),
        ("tinker://r/Weights/x", "unknown checkpoint kind 'Weights'"),
        ("tinker://r/../x", "unknown checkpoint kind '..'"),
        ("tinker://../weights/x", "run: '..' is not a plain name"),
        ("tinker://./weights/x", "run: '.' is not a plain name"),
        ("tinker://r/weights/..", "name: '..' is not a plain name"),
        ("tinker://r/sampler_weights/.", "name: '.' is not a plain name"),
        ("tinker:///weights/x", "run: '' is not a plain name"),
        ("tinker://r/weights/", "name: '' is not a plain name"),
        ("tinker://r\\..\\..\\etc/weights/x", "run: .* is not a plain name"),
        ("tinker://r/weights/..\\x", "name: .* is not a plain name"),
        ("tinker://r/weights/x\x00", "name: .* is not a plain name"),
        ("tinker://r\x00/weights/x", "run: .* is not a plain name"),
        (f"tinker://r/weights/{'x' * 256}", "name: .* is not a plain name"),
    ],
)
def test_parse_tinker_path_refuses(path: str, fault: str):
    with pytest.raises(PathError, match=rf"^model_path[ :].*{fault}"):
        parse_tinker_path(path, field="model_path")


def test_the_default_field_is_path():
    with pytest.raises(PathError, match=r"^path: "):
        parse_tinker_path("/tmp/x")
    with pytest.raises(PathError, match=r"^path name: "):
        parse_tinker_path("tinker://r/weights/..")


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "a\\b", "a\x00", "x" * 256])
def test_check_folder_name_refuses(name: str):
    with pytest.raises(PathError, match=r"^the name: "):
        check_folder_name(name, "the name")


def test_check_folder_name_accepts_plain_names():
    for name in ("a", "...", ".hidden", "x" * 255, "s1:train:0", "é"):
        assert check_folder_name(name, "n") == name


@settings(deadline=None, max_examples=300)
@given(run=_TRICKY, kind=st.sampled_from(["weights", "sampler_weights"]), name=_TRICKY)
def test_whatever_parses_from_run_and_name_stays_inside_the_root(run: str, kind: str, name: str):
    ref = CheckpointRef(run=run, kind=kind, name=name)  # type: ignore[arg-type]
    try:
        parsed = parse_tinker_path(ref.tinker_path)
    except PathError:
        return
    assert parsed == ref  # the round trip is exact whenever it succeeds
    _assert_inside(parsed, ROOT)
    assert ref_from_directory(parsed.directory(ROOT), ROOT) == parsed


@settings(deadline=None, max_examples=300)
@given(tail=_TAILS)
def test_whatever_parses_after_the_scheme_stays_inside_the_root(tail: str):
    try:
        ref = parse_tinker_path(f"tinker://{tail}")
    except PathError:
        return
    assert ref.tinker_path == f"tinker://{tail}"
    _assert_inside(ref, ROOT)


@settings(deadline=None, max_examples=100)
@given(
    run=st.text(min_size=1, max_size=10).filter(lambda t: "/" not in t and t not in (".", "..")),
    name=st.text(min_size=1, max_size=10).filter(lambda t: "/" not in t and t not in (".", "..")),
)
def test_plain_names_round_trip(run: str, name: str):
    """Every name without `/`, `\\`, NUL, `.` or `..` parses (the refusals are exactly those)."""
    ref = CheckpointRef(run=run, kind="sampler_weights", name=name)
    if "\\" in run + name or "\x00" in run + name:
        with pytest.raises(PathError):
            parse_tinker_path(ref.tinker_path)
    else:
        assert parse_tinker_path(ref.tinker_path) == ref


def test_ref_from_directory_inverts_directory(tmp_path: Path):
    root = tmp_path / "checkpoints"
    for ref in (
        CheckpointRef(run="s1:train:0", kind="weights", name="000010"),
        CheckpointRef(run="s1:train:0", kind="sampler_weights", name="final"),
    ):
        assert ref_from_directory(ref.directory(root), root) == ref
        assert ref_from_directory(str(ref.directory(root)), root) == ref


@pytest.mark.parametrize(
    ("relative", "fault"),
    [
        ("../other/r/state/x", "is not a checkpoint under"),  # beside the root
        ("r/state/../../../../etc/passwd", "is not a checkpoint under"),  # `..` out of it
        ("", "is not a checkpoint under"),  # the root itself
        ("r", "is not a checkpoint under"),
        ("r/state", "is not a checkpoint under"),
        ("r/state/x/extra", "is not a checkpoint under"),
        ("r/weights/x", "unknown local checkpoint kind 'weights'"),  # the SDK's word
        ("r/tmp/x", "unknown local checkpoint kind 'tmp'"),
    ],
)
def test_ref_from_directory_refuses(tmp_path: Path, relative: str, fault: str):
    root = tmp_path / "checkpoints"
    with pytest.raises(PathError, match=fault):
        ref_from_directory(os.path.join(root, relative), root)


def test_ref_from_directory_refuses_a_sibling_with_the_same_prefix(tmp_path: Path):
    root = tmp_path / "checkpoints"
    with pytest.raises(PathError, match="is not a checkpoint under"):
        ref_from_directory(tmp_path / "checkpoints2" / "r" / "state" / "x", root)


def test_parse_checkpoint_id():
    assert parse_checkpoint_id("s1:train:0", "weights/x") == CheckpointRef(
        run="s1:train:0", kind="weights", name="x"
    )
    ref = parse_checkpoint_id("r", "sampler_weights/000010")
    assert ref.kind == "sampler_weights"
    assert parse_checkpoint_id(ref.run, ref.checkpoint_id) == ref


@pytest.mark.parametrize(
    ("run", "checkpoint_id"),
    [
        ("r", "weights"),
        ("r", "weights/x/y"),
        ("r", "state/x"),
        ("r", "weights/.."),
        ("r", ""),
        ("..", "weights/x"),
        ("a/b", "weights/x"),
        ("", "weights/x"),
    ],
)
def test_parse_checkpoint_id_refuses(run: str, checkpoint_id: str):
    with pytest.raises(PathError, match=r"^checkpoint_id"):
        parse_checkpoint_id(run, checkpoint_id)
