"""A run as one signed file (`pictl bundle`): what defines the run and what proves it, and reading one back.

A bundle is a gzip'd tar of regular files, laid out as:

    manifest.json          format, version, the run's id, the team, when, the code digest, the artifact's hash,
                           the outputs' hash, and `members`: every other member's sha256 (not the signature's)
    manifest.json.sig      `ssh-keygen -Y sign -n pictl-bundle` over manifest.json
    summary.json           the run's summary as the run wrote it (its figures, flags, host facts, traces)
    config.json            the run's resolved options, profile, placement and plan
    run.json               the run as the TA reads it: protocol, options, the profile's rules, flags, host facts
    code/remote/...        the code the hosts ran (the pushed tree; its manifest digest is the summary's `code`)
    outputs/logits-*.f32   the check logits the run kept (the pipeline's and the serial run's)
    artifact/<file>        the model artifact, when the run used one no larger than ARTIFACT_LIMIT
    traces*/...            the run's chrome traces, if it took any

The signature covers the manifest and the manifest covers every member by hash, so changing any byte of any
member shows. Signing and checking are `ssh-keygen`'s (`ssh_sign`): started with an argument list, never a shell.
Checking a bundle is `verify.py`'s; this module writes and reads the file.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pictl import errors as E
from pictl.cluster.push import manifest_digest, placed_name
from pictl.jobs.grading.manifest import BundledArtifact, BundleManifest, ManifestSigner
from pictl.records.files import read_regular
from pictl.records.run_config import RunConfigRecord
from pictl.records.runs import CONFIG_FILE, SUMMARY_FILE
from pictl.summary import parse_summary, read_json_object, terminal_text
from pictl.summary_models import RunSummary
from remote.floor import protocol as P

__all__ = ["ARTIFACT_LIMIT", "BUNDLE_SUFFIX", "Bundle", "CODE_DIR", "MANIFEST", "NAMESPACE", "SIGNATURE",
           "default_key", "make_bundle", "read_bundle", "sha256", "write_bundle"]

FORMAT, VERSION = "pictl-bundle", 1
NAMESPACE = "pictl-bundle"
"""The `ssh-keygen -Y` namespace: a signature made for anything else (a git commit, a file) is not a bundle's."""
MANIFEST, SIGNATURE = "manifest.json", "manifest.json.sig"
RUN_FILE = "run.json"
CODE_DIR, OUTPUTS_DIR, ARTIFACT_DIR = "code", "outputs", "artifact"
BUNDLE_SUFFIX = ".bundle.tgz"
ARTIFACT_LIMIT = 256 << 20
"""The largest artifact carried inside a bundle (a pruned DeiT-S is about 60 MB); a larger one is named by hash."""
TRACES_LIMIT = 64 << 20
"""The most trace bytes a bundle carries (a few DeiT-S steps per rank are a few MB)."""
MEMBERS_LIMIT = ARTIFACT_LIMIT + (128 << 20)
"""The most a bundle's members may hold together when read back: a bundle cannot make pictl allocate without bound."""
KEY_NAMES = ("id_ed25519", "id_ecdsa", "id_rsa")
OUTPUT_FILES = (P.LOGITS_FILE_PIPELINE, P.LOGITS_FILE_SERIAL)
SSH_KEYGEN_TIMEOUT_S = 60


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def default_key() -> Path | None:
    """The user's SSH key pictl signs with when none is given: the first of ~/.ssh/id_ed25519, id_ecdsa, id_rsa."""
    for name in KEY_NAMES:
        path = Path.home() / ".ssh" / name
        if path.is_file():
            return path
    return None


def ssh_keygen(args: list[str], *, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """`ssh-keygen ARGS` (an argument list: nothing a user gives reaches a shell); ConfigError when it is missing."""
    try:
        return subprocess.run(["ssh-keygen", *args], input=stdin, capture_output=True, timeout=SSH_KEYGEN_TIMEOUT_S,
                              stdin=None if stdin is not None else subprocess.DEVNULL, check=False)
    except FileNotFoundError:
        raise E.ConfigError("ssh-keygen is not installed (OpenSSH's client tools sign and check bundles)") from None
    except subprocess.TimeoutExpired:
        raise E.ConfigError(f"ssh-keygen {args[0]} {args[1]} did not answer in {SSH_KEYGEN_TIMEOUT_S} s (a key "
                            "with a passphrase needs ssh-agent)") from None


def last_line(proc: subprocess.CompletedProcess[bytes]) -> str:
    text = (proc.stderr or proc.stdout or b"").decode(errors="replace").strip().splitlines()
    return terminal_text(text[-1] if text else f"exit {proc.returncode}", 160)


def public_key(key: Path) -> str:
    """The public half of `key` as one `TYPE BASE64 COMMENT` line (KEY.pub, else derived from the private key)."""
    pub = Path(f"{key}.pub")
    if pub.is_file():
        return pub.read_text(errors="replace").strip().splitlines()[0]
    proc = ssh_keygen(["-y", "-f", str(key)])
    if proc.returncode:
        raise E.ConfigError(f"--key {key}: not a key ssh-keygen can read ({last_line(proc)})")
    return proc.stdout.decode(errors="replace").strip()


def fingerprint(public: str) -> str:
    """`SHA256:...` of a public key line."""
    proc = ssh_keygen(["-l", "-f", "-"], stdin=public.encode())
    fields = proc.stdout.decode(errors="replace").split()
    return fields[1] if proc.returncode == 0 and len(fields) > 1 else "unknown fingerprint"


def ssh_sign(manifest: bytes, key: Path) -> bytes:
    """The SSH signature of `manifest` by `key` in the bundle's namespace."""
    with tempfile.TemporaryDirectory(prefix="pictl-sign-") as tmp:
        target = Path(tmp) / MANIFEST
        target.write_bytes(manifest)
        proc = ssh_keygen(["-Y", "sign", "-f", str(key), "-n", NAMESPACE, str(target)])
        signature = Path(f"{target}.sig")
        if proc.returncode or not signature.is_file():
            raise E.ConfigError(f"--key {key}: ssh-keygen could not sign with it ({last_line(proc)})")
        return signature.read_bytes()


@dataclass(frozen=True)
class Bundle:
    """A bundle read back: its manifest, signature and members (names as laid out above), nothing checked yet."""

    path: Path
    manifest_bytes: bytes
    signature: bytes
    members: dict[str, bytes]
    digest: str
    """The sha256 of the whole file: what a verification record is kept against."""

    @property
    def manifest(self) -> BundleManifest:
        """The manifest read by field, as the file holds it (`BundleManifest`: nothing coerced or checked)."""
        return BundleManifest.view(_json_member(self.path, MANIFEST, self.manifest_bytes))

    def json(self, name: str) -> dict[str, Any]:
        return _json_member(self.path, name, self.members.get(name, b""))

    def code_tree(self) -> dict[str, bytes]:
        """The bundled code as the hosts get it (`remote/...` paths)."""
        prefix = f"{CODE_DIR}/"
        return {name[len(prefix):]: data for name, data in self.members.items() if name.startswith(prefix)}

    def outputs(self) -> bytes | None:
        """The outputs the run was judged by: the pipeline's check logits (the serial run's for a serial run)."""
        for name in OUTPUT_FILES:
            found = self.members.get(f"{OUTPUTS_DIR}/{name}")
            if found is not None:
                return found
        return None


def _json_member(path: Path, name: str, data: bytes) -> dict[str, Any]:
    try:
        found = json.loads(data)
    except (ValueError, RecursionError):
        found = None
    if not isinstance(found, dict):
        raise E.BundleTampered(f"{path}: {name} is not a JSON object")
    return found


def _run_files(run_dir: Path) -> dict[str, bytes]:
    """The members a run directory gives: summary, config, outputs and traces (no link followed, reads capped)."""
    members: dict[str, bytes] = {}
    for name in (SUMMARY_FILE, CONFIG_FILE):
        data = read_regular(run_dir, name, 64 << 20)
        if data is None:
            raise E.ConfigError(f"{run_dir / name}: larger than pictl writes; not bundled")
        members[name] = data
    for name in OUTPUT_FILES:
        if (run_dir / name).is_file():
            data = read_regular(run_dir, name, 512 << 20)
            if data is not None:
                members[f"{OUTPUTS_DIR}/{name}"] = data
    left = TRACES_LIMIT
    for top in sorted(p.name for p in run_dir.iterdir() if p.name.startswith(P.TRACES_DIR) and p.is_dir()
                      and not p.is_symlink()):
        for folder, dirs, files in os.walk(run_dir / top):  # (os.walk does not follow links into directories)
            dirs[:] = sorted(d for d in dirs if not (Path(folder) / d).is_symlink())
            for name in sorted(files):
                rel = (Path(folder) / name).relative_to(run_dir).as_posix()
                data = read_regular(run_dir, rel, left) if not (Path(folder) / name).is_symlink() else None
                if data is not None:
                    members[rel] = data
                    left -= len(data)
    return members


def make_bundle(run_dir: Path, key: Path, *, team: str | None = None,
                code: dict[str, bytes] | None = None) -> tuple[bytes, dict[str, Any]]:
    """The bundle of the run in `run_dir`, signed by `key`, as bytes, and its manifest. `code`: the tree the hosts
    ran (default: pictl's own `remote/` now, which must be the run's: its digest is checked against the
    summary's). ConfigError for a run that cannot be bundled (unfinished, older than code digests, other code)."""
    from pictl.cluster.push import local_tree
    from pictl.planning.presets import preset_rules

    try:
        members = _run_files(run_dir)
    except OSError as exc:  # no summary yet (a run in progress), a FIFO where a record should be
        raise E.ConfigError(f"run {run_dir.name}: not a finished run's record ({exc.strerror or exc})") from None
    written = read_json_object(run_dir / SUMMARY_FILE)
    summary = parse_summary(run_dir / SUMMARY_FILE, written)
    config = read_json_object(run_dir / CONFIG_FILE)
    run_id = summary.run_id or run_dir.name
    if summary.status != "ok":
        raise E.ConfigError(f"run {run_id}: did not finish ({summary.status}): only a finished run is bundled")
    if summary.host_lost:  # (its figures are two configurations' passes: no claim of one, no re-run of it)
        raise E.ConfigError(f"run {run_id}: lost {summary.host_lost[0].host} mid-run and went on with fewer stages: "
                            "only a run measured whole on one configuration is bundled")
    if not summary.code:
        raise E.ConfigError(f"run {run_id}: its summary names no code digest (made by an older pictl); run it "
                            "again to bundle it")
    tree = code if code is not None else local_tree()
    digest = manifest_digest(tree)
    if digest != summary.code:
        raise E.ConfigError(f"run {run_id}: the code here (digest {digest}) is not the code the run's hosts ran "
                            f"({summary.code}): bundle it from the checkout that ran it")
    members.update({f"{CODE_DIR}/{name}": data for name, data in tree.items()})
    artifact = _artifact_member(summary, members)
    given = RunConfigRecord.view(config).options  # (copied into run.json as the run resolved them)
    options = given if isinstance(given, dict) else {}
    profile = summary.profile
    rules = None
    if isinstance(profile, str):
        try:
            found = preset_rules(profile)
            rules = found.to_json() if found else None
        except E.ConfigError:
            rules = None  # (the profile is gone from here: the verifier checks its own copy's rules anyway)
    as_written = RunSummary.view(written)  # (the summary's parts copied into run.json as the run wrote them)
    members[RUN_FILE] = json.dumps({
        "run_id": run_id, "profile": profile, "rules": rules, "options": options,
        "protocol": {k: written.get(k) for k in ("stages", "replicas", "images", "chunk", "warmup", "repeats",
                                                 "threads", "data")},
        "flags": as_written.flags, "hosts": as_written.hosts,
    }, indent=1, sort_keys=True).encode()
    outputs = next((members[f"{OUTPUTS_DIR}/{n}"] for n in OUTPUT_FILES if f"{OUTPUTS_DIR}/{n}" in members), None)
    public = public_key(key)
    manifest = BundleManifest(
        format=FORMAT, version=VERSION, run_id=run_id, team=team, created_at=time.time(), code=digest,
        artifact=artifact, outputs_sha256=sha256(outputs) if outputs is not None else None,
        signer=ManifestSigner(key=public, fingerprint=fingerprint(public)),
        suspect_because=summary.suspect_because if summary.verdict == "suspect" else None,
        members={name: sha256(data) for name, data in sorted(members.items())})
    manifest_bytes = manifest.to_bytes()
    return write_bundle(manifest_bytes, ssh_sign(manifest_bytes, key), members), manifest.written()


def _artifact_member(summary: RunSummary, members: dict[str, bytes]) -> BundledArtifact | None:
    """The artifact's record for the manifest, its file added to `members` when it is small enough."""
    if summary.artifact is None or not summary.artifact.path:
        return None
    path = Path(summary.artifact.path)
    try:
        size = path.stat().st_size
        if not (path.is_file() and not path.is_symlink() and size <= ARTIFACT_LIMIT):
            return BundledArtifact(name=path.name, digest=summary.artifact.digest, bundled=False, size=size)
        data = path.read_bytes()
    except OSError:  # named by its digest only: the verifier needs its own copy
        return BundledArtifact(name=path.name, digest=summary.artifact.digest, bundled=False, missing=True)
    members[f"{ARTIFACT_DIR}/{path.name}"] = data
    return BundledArtifact(name=path.name, digest=summary.artifact.digest, bundled=True, sha256=sha256(data),
                           size=size)


def write_bundle(manifest: bytes, signature: bytes, members: dict[str, bytes]) -> bytes:
    """The bundle file's bytes: the manifest, its signature, then the members in name order (a fixed mtime and
    owner, so one set of members always makes the same bytes)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in [(MANIFEST, manifest), (SIGNATURE, signature), *sorted(members.items())]:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


def read_bundle(path: Path) -> Bundle:
    """The bundle at `path`, read whole within MEMBERS_LIMIT: only regular files with plain relative names, each
    once (ConfigError naming the file otherwise: not a bundle pictl wrote)."""
    try:
        with path.open("rb") as fh:
            packed = fh.read(MEMBERS_LIMIT + 1)
    except OSError as exc:
        raise E.ConfigError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if len(packed) > MEMBERS_LIMIT:
        raise E.ConfigError(f"{path}: larger than a bundle may be ({MEMBERS_LIMIT >> 20} MB)")
    members: dict[str, bytes] = {}
    total = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(packed), mode="r:gz") as tar:
            for info in tar:
                if info.name in members:
                    raise E.ConfigError(f"{path}: member {terminal_text(info.name, 80)!r} appears twice (not a "
                                        "pictl bundle)")
                if not info.isfile() or not placed_name(info.name):
                    raise E.ConfigError(f"{path}: member {terminal_text(info.name, 80)!r} is not a plain file "
                                        "pictl bundles (not a pictl bundle)")
                total += info.size
                if total > MEMBERS_LIMIT:
                    raise E.ConfigError(f"{path}: its members hold more than {MEMBERS_LIMIT >> 20} MB")
                extracted = tar.extractfile(info)
                members[info.name] = extracted.read() if extracted is not None else b""
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise E.ConfigError(f"{path}: not a pictl bundle ({terminal_text(exc, 120)})") from None
    manifest, signature = members.pop(MANIFEST, None), members.pop(SIGNATURE, None)
    if manifest is None or signature is None:
        raise E.ConfigError(f"{path}: not a pictl bundle (no {MANIFEST} or no {SIGNATURE})")
    bundle = Bundle(path, manifest, signature, members, sha256(packed))
    found = bundle.manifest
    if found.format != FORMAT or found.version != VERSION:
        raise E.ConfigError(f"{path}: not a pictl bundle of version {VERSION} (format {found.format!r}, "
                            f"version {found.version!r})")
    return bundle
