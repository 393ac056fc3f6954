"""A bundle file read back: what `pictl bundle` writes reads the same, and a file that is not one (a link or a
path out of the bundle among its members, a member twice, no signature, not a gzip'd tar) is refused by name,
never unpacked. No hosts, no torch: the members are written here."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import pytest

from pictl.errors import ConfigError
from pictl.jobs.grading.bundle import MANIFEST, SIGNATURE, read_bundle, sha256, write_bundle
from pictl.jobs.grading.manifest import BundledArtifact, BundleManifest, ManifestSigner

MEMBERS = {"summary.json": b'{"run_id": "r"}', "code/remote/__init__.py": b"", "outputs/logits-pipeline.f32": b"\0" * 8}


def _manifest() -> bytes:
    return json.dumps({"format": "pictl-bundle", "version": 1, "members": {n: sha256(b) for n, b in MEMBERS.items()}},
                      sort_keys=True).encode()


def _tar(entries: list[tarfile.TarInfo | tuple[str, bytes]]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for entry in entries:
            if isinstance(entry, tarfile.TarInfo):
                tar.addfile(entry)
            else:
                info = tarfile.TarInfo(entry[0])
                info.size = len(entry[1])
                tar.addfile(info, io.BytesIO(entry[1]))
    return gzip.compress(raw.getvalue())


def test_a_written_bundle_reads_back_member_for_member_and_byte_for_byte_the_same(tmp_path: Path) -> None:
    data = write_bundle(_manifest(), b"sig", MEMBERS)
    assert data == write_bundle(_manifest(), b"sig", dict(reversed(MEMBERS.items())))  # one layout, one file
    (tmp_path / "b.bundle.tgz").write_bytes(data)
    bundle = read_bundle(tmp_path / "b.bundle.tgz")
    assert bundle.members == MEMBERS and bundle.signature == b"sig" and bundle.digest == sha256(data)
    assert bundle.code_tree() == {"remote/__init__.py": b""} and bundle.outputs() == b"\0" * 8


def test_a_manifest_is_written_with_sorted_keys_and_read_back_field_by_field_as_written(tmp_path: Path) -> None:
    made = BundleManifest(format="pictl-bundle", version=1, run_id="r", team=None, created_at=12.5, code="c",
                          artifact=BundledArtifact(name="a.pt", digest=None, bundled=False, missing=True),
                          outputs_sha256=None, signer=ManifestSigner(key="ssh-ed25519 AAAA me@x", fingerprint="f"),
                          suspect_because=None, members={n: sha256(b) for n, b in MEMBERS.items()})
    written = json.loads(made.to_bytes())
    assert list(written) == sorted(written) and written["team"] is None and written["created_at"] == 12.5
    assert written["artifact"] == {"name": "a.pt", "digest": None, "bundled": False, "missing": True}  # (no size)
    (tmp_path / "b.bundle.tgz").write_bytes(write_bundle(made.to_bytes(), b"sig", MEMBERS))
    back = read_bundle(tmp_path / "b.bundle.tgz").manifest
    assert (back.format, back.version, back.run_id, back.created_at, back.code) == ("pictl-bundle", 1, "r", 12.5, "c")
    assert back.members == made.members and back.team is None and back.outputs_sha256 is None
    artifact, signer = back.artifact_record(), back.signer_record()
    assert artifact is not None and artifact.missing is True and artifact.size is None
    assert signer is not None and signer.key == "ssh-ed25519 AAAA me@x"
    # A manifest is read as the file holds it (its signature, not its shape, is what is trusted): a field it
    # lacks reads as None, a nested record that is no object as none, a value of another type as it is.
    odd = BundleManifest.view({"format": "pictl-bundle", "version": "1", "artifact": ["a.pt"], "signer": "me"})
    assert odd.version == "1" and odd.team is None and odd.members is None
    assert odd.artifact_record() is None and odd.signer_record() is None


@pytest.mark.parametrize("entries, said", [
    ([(MANIFEST, b"{}"), (SIGNATURE, b"s"), ("../escape", b"x")], "member '../escape' is not a plain file"),
    ([(MANIFEST, b"{}"), (SIGNATURE, b"s"), ("/etc/passwd", b"x")], "member '/etc/passwd' is not a plain file"),
    ([(MANIFEST, b"{}"), (SIGNATURE, b"s"), ("a", b"x"), ("a", b"y")], "member 'a' appears twice"),
    ([(MANIFEST, b"{}"), (MANIFEST, b"{}"), (SIGNATURE, b"s")], "member 'manifest.json' appears twice"),
    ([(MANIFEST, b"{}")], "no manifest.json or no manifest.json.sig"),
    ([(MANIFEST, b'{"format": "zip"}'), (SIGNATURE, b"s")], "not a pictl bundle of version 1"),
])
def test_a_file_that_is_not_a_bundle_is_refused_by_name(tmp_path: Path, entries: list, said: str) -> None:
    path = tmp_path / "x.bundle.tgz"
    path.write_bytes(_tar(entries))
    with pytest.raises(ConfigError, match=f"^{path}: .*{said}"):
        read_bundle(path)


def test_a_link_member_is_refused_and_nothing_is_unpacked(tmp_path: Path) -> None:
    link = tarfile.TarInfo("code/remote/x.py")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    path = tmp_path / "x.bundle.tgz"
    path.write_bytes(_tar([(MANIFEST, b"{}"), (SIGNATURE, b"s"), link]))
    with pytest.raises(ConfigError, match="member 'code/remote/x.py' is not a plain file"):
        read_bundle(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.bundle.tgz"]
    path.write_bytes(b"not a tar")
    with pytest.raises(ConfigError, match="not a pictl bundle"):
        read_bundle(path)


def test_a_board_row_names_a_check_without_the_bundles_path_wherever_it_was_verified() -> None:
    from pictl.jobs.grading.board import _short

    here = Path("/class/board/exact.bundle.tgz")
    # The verification ran where the student's bundle was, before the TA copied it to the board.
    assert _short("/home/team/a/exact.bundle.tgz: claimed speedup 1.74x is above the re-run's", here) == (
        "claimed speedup 1.74x is above the re-run's")
    assert _short(f"{here}: summary.json was changed after signing", here) == "summary.json was changed after signing"
    assert _short("other.bundle.tgz: not this one", here) == "other.bundle.tgz: not this one"
