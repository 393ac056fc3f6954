"""The no-follow helpers on their own (real files, real links): nothing is made, read, written or removed through a
link under the directory given, and files are read as a stream within their cap, saying what was skipped."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pictl import errors as E
from pictl.cluster.artifacts import MODELS_DIR
from pictl.inventory import Host
from pictl.records.files import event_files, make_dir, read_lines, read_regular, write_bytes_atomic
from pictl.records.runs import RunRecord
from remote.floor import nofollow
from remote.host.lease import LEASE_FILE, OWNED


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    target = tmp_path / "outside"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    return target


def _state(path: Path) -> list[tuple[str, int, bytes | None]]:
    return [(str(p), p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else None)
            for p in [path, *sorted(path.rglob("*"))]]


def test_a_link_on_the_way_is_refused_and_nothing_is_made_through_it(tmp_path: Path, outside: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    (base / "runs").symlink_to(outside)
    before = _state(outside)
    for rel in ("runs", "runs/new", "runs/new/deeper"):
        with pytest.raises(nofollow.LinkFound) as found:
            nofollow.open_dir(base, rel, create=True)
        assert found.value.path == str(base / "runs")
    with pytest.raises(nofollow.LinkFound):
        nofollow.open_file(base, "runs/keep.txt", os.O_WRONLY | os.O_TRUNC)
    with pytest.raises(E.ConfigError, match=f"^{base}/runs is a symbolic link"):
        make_dir(base, "runs")
    assert _state(outside) == before
    os.close(nofollow.open_dir(base, "real/a/b", create=True))  # real directories are made as asked
    assert (base / "real" / "a" / "b").is_dir()


def test_a_tree_is_removed_without_reaching_what_its_links_point_to(tmp_path: Path, outside: Path) -> None:
    base = tmp_path / "runs"
    (base / "crashed" / "sub").mkdir(parents=True)
    (base / "crashed" / "sub" / "escape").symlink_to(outside)
    (base / "planted").symlink_to(outside)
    before = _state(outside)
    nofollow.remove_tree(base, "crashed")
    with pytest.raises(nofollow.LinkFound):
        nofollow.remove_tree(base, "planted")
    with pytest.raises(nofollow.LinkFound):
        nofollow.remove_tree(base, "planted/keep.txt")
    assert not (base / "crashed").exists() and (base / "planted").is_symlink() and _state(outside) == before


def test_lines_are_read_as_a_stream_up_to_the_cap_and_the_rest_is_noted(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"one\n" + b"x" * 100 + b"\ntwo\n" + b"y" * 500)
    notes: list[str] = []
    assert list(read_lines(tmp_path, "events.jsonl", notes, limit=10_000, max_line=50)) == ["one", "two"]
    assert notes == [f"{path}: 2 line(s) over 50 bytes skipped"]
    notes.clear()
    assert list(read_lines(tmp_path, "events.jsonl", notes, limit=8, max_line=50)) == ["one"]
    assert notes == [f"{path}: only its first 8 bytes read (it holds {path.stat().st_size:,} bytes); the rest was "
                     "skipped"]


def test_a_fifo_or_a_link_is_never_read(tmp_path: Path, outside: Path) -> None:
    events = tmp_path / "events"
    events.mkdir()
    os.mkfifo(events / "h0.jsonl")  # opening it to read would block: it is not even opened for reading
    (events / "h1.jsonl").symlink_to(outside / "keep.txt")
    (events / "h2.jsonl").write_text("{}\n")
    notes: list[str] = []
    assert event_files(events, notes) == ["h2.jsonl"]
    assert notes == [f"{events}/h1.jsonl is a symbolic link: not read"]
    assert list(read_lines(tmp_path, "events/h0.jsonl", notes)) == []
    assert list(read_lines(tmp_path, "events/h1.jsonl", notes)) == []
    assert notes[1:] == [f"{events}/h0.jsonl: not a regular file, not read",
                         f"{events}/h1.jsonl is a symbolic link: not read"]
    with pytest.raises(E.ConfigError, match="h1.jsonl is a symbolic link"):
        read_regular(tmp_path, "events/h1.jsonl", 100)
    assert read_regular(tmp_path, "events/h2.jsonl", 2) is None and read_regular(tmp_path, "events/h2.jsonl", 3) == \
        b"{}\n"


def test_an_atomic_write_replaces_a_link_rather_than_writing_through_it(tmp_path: Path, outside: Path) -> None:
    (tmp_path / "summary.json").symlink_to(outside / "keep.txt")
    before = _state(outside)
    write_bytes_atomic(tmp_path / "summary.json", b"{}")
    assert not (tmp_path / "summary.json").is_symlink() and (tmp_path / "summary.json").read_bytes() == b"{}"
    assert _state(outside) == before and sorted(p.name for p in tmp_path.iterdir()) == ["outside", "summary.json"]


def test_a_run_record_is_never_opened_through_a_link_at_its_name(tmp_path: Path, outside: Path) -> None:
    root = tmp_path / "runs"
    root.mkdir()
    (root / "20260101-000000-s2-abcd").symlink_to(outside)
    before = _state(outside)
    with pytest.raises(E.RecordWriteFailed, match="cannot create the run directory"):
        RunRecord(root, "20260101-000000-s2-abcd")
    assert _state(outside) == before


def test_the_lease_checks_every_name_pictl_places_in_a_workdir() -> None:
    host = Host(name="h", transport="ssh", address="x", workdir="~/pictl")
    placed = {Path(host.code_dir).name, Path(host.run_dir("r")).parent.name, MODELS_DIR, "cache", "provision"}
    assert placed <= set(OWNED) and LEASE_FILE not in OWNED
