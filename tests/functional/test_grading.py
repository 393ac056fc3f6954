"""`pictl bundle`, `pictl verify` and `pictl board` on real runs of a local cluster: a bundle verifies on the cluster
that made it (its re-run pushes the bundle's own code); an edited summary, other code and a foreign key each fail
with their own exit code and one line, before anything runs; a preset's rules are checked before anything runs; a
lossy run is labelled lossy and held to an accuracy floor; the board renders at 80 columns and as Markdown.

Two real runs are shared by every test here (an exact one and a lossy one on labelled data), and one re-run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from support.cifar import write_cifar10
from support.cli import finished, run_pictl, run_pictl_on_terminal
from support.clusters import write_cluster

from pictl import errors as E
from pictl.jobs.grading.bundle import read_bundle, sha256, ssh_sign, write_bundle

RUN = ["run", "--stages", "2", "--split", "blocks.6", "--chunk", "1", "--warmup", "0", "--headless", "--json"]


def _key(folder: Path, name: str, comment: str) -> Path:
    key = folder / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(key)], check=True)
    return key


def _timed(args: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    proc = run_pictl(args, env, timeout=600)
    return proc, time.monotonic() - start


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict:
    """An exact run (bundled by team A, then verified: its re-run timed beside the run) and a lossy one on labelled
    data (bundled by team B), in one runs directory; team A's key is the class's only allowed signer."""
    root = tmp_path_factory.mktemp("grading")
    hosts = write_cluster(root / "cluster", 2)
    env = {**os.environ, "PICTL_RUNS_DIR": str(root / "runs"), "PICTL_CACHE_DIR": str(root / "cache"),
           "PICTL_PROFILES_DIR": str(root / "profiles"), "COLUMNS": "200"}
    alice, mallory = _key(root, "alice", "team-a@class"), _key(root, "mallory", "mallory@elsewhere")
    allowed = root / "allowed_signers"
    pub = alice.with_suffix(".pub").read_text().split()
    allowed.write_text(f'team-a namespaces="pictl-bundle" {pub[0]} {pub[1]}\n')
    exact, run_s = _timed([*RUN, "--hosts", str(hosts), "--images", "4", "--repeats", "3"], env)
    data = write_cifar10(root / "cifar", images=4)
    lossy = run_pictl([*RUN, "--hosts", str(hosts), "--images", "4", "--repeats", "2", "--wire", "fp16",
                       "--data", "cifar10", "--data-path", str(data), "--num-classes", "10"], env, timeout=600)
    board = root / "board"
    board.mkdir()
    made = {}
    for name, proc, key, team in (("exact", exact, alice, "Team A"), ("lossy", lossy, alice, "Team B")):
        assert finished(proc.returncode, proc.stderr), proc.stderr[-3000:]
        run_id = json.loads(proc.stdout)["run_id"]
        made[name] = run_pictl(["bundle", run_id, "--key", str(key), "--team", team, "-o",
                                str(board / f"{name}.bundle.tgz")], env)
    verified, verify_s = _timed(["verify", str(board / "exact.bundle.tgz"), "--hosts", str(hosts),
                                 "--allowed-signers", str(allowed)], env)
    print(f"\nTIMING pictl run {run_s:.1f} s; pictl verify (re-run included) {verify_s:.1f} s; "
          f"ratio {verify_s / run_s:.2f}")
    return {"root": root, "env": env, "hosts": hosts, "alice": alice, "mallory": mallory, "allowed": allowed,
            "board": board, "runs": [json.loads(exact.stdout), json.loads(lossy.stdout)], "made": made,
            "verified": verified, "timing": (run_s, verify_s)}


def _runs(graded: dict) -> list[str]:
    return sorted(p.name for p in (graded["root"] / "runs").iterdir())


def _one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pictl: error: "), proc.stderr[-2000:]
    return lines[0]


def _repacked(source: Path, target: Path, *, change: dict[str, bytes], key: Path | None) -> Path:
    """`source` with members replaced; with `key`, its manifest re-hashed and signed anew by it (else the old
    manifest and signature kept: an edit after signing)."""
    bundle = read_bundle(source)
    members = {**bundle.members, **change}
    manifest, signature = bundle.manifest_bytes, bundle.signature
    if key is not None:
        data = {**json.loads(manifest), "members": {name: sha256(b) for name, b in members.items()}}
        manifest = json.dumps(data, indent=1, sort_keys=True).encode()
        signature = ssh_sign(manifest, key)
    target.write_bytes(write_bundle(manifest, signature, members))
    return target


@pytest.mark.slow
def test_a_bundle_of_a_real_run_verifies_on_the_same_cluster_with_its_own_code(graded) -> None:
    for made in graded["made"].values():
        assert made.returncode == 0, made.stderr[-2000:]
        assert "pictl: note: signed with" in made.stderr
    proc = graded["verified"]
    assert "signed by team-a (SHA256:" in proc.stderr
    if proc.returncode == E.EXIT_NOT_REPRODUCED and graded["runs"][0].get("verdict") == "suspect":
        # Other work on this machine slowed the run's serial baseline (its result SUSPECT, its speedup read high):
        # the re-run against an unslowed one does not reach it, which is what verify is for.
        assert "is above the re-run's" in proc.stderr.strip().splitlines()[-1]
        return
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith(f"verified: {graded['board'] / 'exact.bundle.tgz'}: team Team A, speedup ")
    record = json.loads((graded["board"] / "exact.bundle.tgz.verify.json").read_text())
    assert record["verified"] is True and record["bundle_sha256"] == read_bundle(
        graded["board"] / "exact.bundle.tgz").digest
    rerun = json.loads((graded["root"] / "runs" / record["rerun_id"] / "summary.json").read_text())
    original = graded["runs"][0]
    assert rerun["code"] == original["code"] and rerun["outputs_match"] is True  # the bundle's code ran
    assert rerun["serial_reused"] is False and rerun["split_points"] == original["split_points"]
    low, high = record["rerun"]["low"], record["rerun"]["high"]
    assert low is not None and high is not None and low <= record["rerun"]["median"] <= high


@pytest.mark.slow
def test_an_edit_other_code_or_a_foreign_key_each_fail_with_their_own_code_before_anything_runs(graded,
                                                                                               tmp_path) -> None:
    exact = graded["board"] / "exact.bundle.tgz"
    summary = json.loads(read_bundle(exact).members["summary.json"])
    edited = _repacked(exact, tmp_path / "edited.bundle.tgz", key=None,
                       change={"summary.json": json.dumps({**summary, "speedup": 4.2}).encode()})
    code = read_bundle(exact).members["code/remote/__init__.py"] + b"# faster\n"
    other_code = _repacked(exact, tmp_path / "code.bundle.tgz", key=graded["alice"],
                           change={"code/remote/__init__.py": code})
    run_id = graded["runs"][0]["run_id"]
    made = run_pictl(["bundle", run_id, "--key", str(graded["mallory"]), "-o", str(tmp_path / "foreign")],
                     graded["env"])
    assert made.returncode == 0, made.stderr
    foreign = tmp_path / "foreign.bundle.tgz"  # (a name without the bundles' ending gets it, and says so)
    assert made.stdout.strip() == str(foreign) and foreign.is_file(), made.stdout
    assert "written as foreign.bundle.tgz" in made.stderr, made.stderr
    before = _runs(graded)
    cases = ((edited, E.EXIT_TAMPERED, "summary.json was changed after signing"),
             (other_code, E.EXIT_CODE_MISMATCH, f"is not the code the run's hosts ran ({summary['code']})"),
             (foreign, E.EXIT_SIGNATURE, f"not in {graded['allowed']}"))
    for path, code_expected, said in cases:
        proc = run_pictl(["verify", str(path), "--hosts", str(graded["hosts"]), "--allowed-signers",
                          str(graded["allowed"])], graded["env"])
        assert proc.returncode == code_expected, (path.name, proc.returncode, proc.stderr[-2000:])
        line = _one_line(proc)
        assert line.startswith(f"pictl: error: {path}: ") and said in line, line
    assert _runs(graded) == before  # nothing ran


@pytest.mark.slow
def test_a_presets_rules_are_checked_by_run_and_verify_before_anything_runs(graded, tmp_path) -> None:
    profiles = graded["root"] / "profiles"
    profiles.mkdir(exist_ok=True)
    (profiles / "graded.toml").write_text("stages = 2\nchunk = 2\n[rules]\nchunk = 2\nexact = true\n")
    before = _runs(graded)
    copy = shutil.copy(graded["board"] / "exact.bundle.tgz", tmp_path / "exact.bundle.tgz")  # (its own record)
    proc = run_pictl(["verify", str(copy), "--hosts", str(graded["hosts"]),
                      "--allowed-signers", str(graded["allowed"]), "--profile", "graded"], graded["env"])
    assert proc.returncode == E.EXIT_RULES, proc.stderr[-2000:]
    assert _one_line(proc).endswith("breaks the rule chunk = 2 (this run: 1) of profile 'graded'")
    run = run_pictl(["run", "--hosts", str(graded["hosts"]), "--profile", "graded", "--chunk", "1", "--images",
                     "4", "--headless"], graded["env"])
    assert run.returncode == E.EXIT_BAD_INPUT
    assert _one_line(run) == (f"pictl: error: profile 'graded' ({profiles / 'graded.toml'}): breaks its rule "
                              "chunk = 2 (this run: 1)")
    assert _runs(graded) == before


@pytest.mark.slow
def test_a_lossy_bundle_is_held_to_its_accuracy_floor(graded) -> None:
    lossy = graded["board"] / "lossy.bundle.tgz"
    accuracy = graded["runs"][1]["accuracy"]
    assert graded["runs"][1]["wire"]["lossy"] is True and accuracy is not None
    args = ["verify", str(lossy), "--allowed-signers", str(graded["allowed"]), "--no-rerun"]
    kept = run_pictl([*args, "--min-accuracy", str(accuracy)], graded["env"])
    assert kept.returncode == 0, kept.stderr[-2000:]
    assert kept.stdout.startswith(f"checked: {lossy}: team Team B")
    if accuracy < 1:
        missed = run_pictl([*args, "--min-accuracy", str(round(accuracy + 0.01, 4))], graded["env"])
        assert missed.returncode == E.EXIT_RULES
        assert f"below the accuracy floor: min_accuracy = {round(accuracy + 0.01, 4)} (the run measured " \
               f"{accuracy:.4f})" in _one_line(missed)


@pytest.mark.slow
def test_without_allowed_signers_your_own_key_is_accepted_and_named(graded, tmp_path) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    env = {**graded["env"], "HOME": str(home)}
    bundle = graded["board"] / "exact.bundle.tgz"
    nobody = run_pictl(["bundle", graded["runs"][0]["run_id"], "-o", str(tmp_path / "x.bundle.tgz")], env)
    assert nobody.returncode == E.EXIT_BAD_INPUT and "no SSH key to sign with" in _one_line(nobody)
    assert not (tmp_path / "x.bundle.tgz").exists()
    shutil.copy(graded["alice"], home / ".ssh" / "id_ed25519")
    shutil.copy(graded["alice"].with_suffix(".pub"), home / ".ssh" / "id_ed25519.pub")
    own = run_pictl(["verify", str(bundle), "--no-rerun"], env)
    assert own.returncode == 0, own.stderr
    assert "signed by your own key ~/.ssh/id_ed25519.pub (SHA256:" in own.stderr
    theirs = run_pictl(["verify", str(bundle), "--no-rerun"], {**env, "HOME": str(tmp_path)})
    assert theirs.returncode == E.EXIT_SIGNATURE and "no key of yours" in _one_line(theirs)


@pytest.mark.slow
def test_a_board_of_exact_lossy_and_failed_bundles_at_80_columns_and_as_markdown(graded, tmp_path) -> None:
    board = tmp_path / "board"
    board.mkdir()
    for name in ("exact", "lossy"):  # (the exact one with its verification's record)
        for path in graded["board"].glob(f"{name}.bundle.tgz*"):
            shutil.copy(path, board / path.name)
    summary = json.loads(read_bundle(board / "exact.bundle.tgz").members["summary.json"])
    _repacked(board / "exact.bundle.tgz", board / "edited.bundle.tgz", key=None,
              change={"summary.json": json.dumps({**summary, "team": "x"}).encode()})
    md = tmp_path / "board.md"
    proc = run_pictl_on_terminal(["board", str(board), "--allowed-signers", str(graded["allowed"]), "--markdown",
                                  str(md), "--html", str(tmp_path / "board.html")], graded["env"], columns=80)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines and max(len(line) for line in lines) <= 80, proc.stdout
    text = md.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| team")]
    assert len(rows) == 3, text
    # (yes, unless other work made the run SUSPECT and verify said so: see the first test; its record's reason names
    # where the bundle was verified, then the claim)
    def outcome(row: str) -> bool:
        if graded["verified"].returncode == 0:
            return " | yes |" in row
        return " | no: speedup: " in row and "claimed speedup " in row and "is above the re-run's" in row

    verified = [row for row in rows if outcome(row)]
    assert len(verified) == 1 and verified[0].startswith("| Team A | ") and "| exact |" in verified[0], text
    checked = [row for row in rows if "| checked: signature, hashes, code and rules hold; not re-run" in row]
    assert len(checked) == 1 and checked[0].startswith("| Team B | ") and "| lossy |" in checked[0]
    failed = [row for row in rows if "| no: tampered: summary.json was changed after signing" in row]
    assert len(failed) == 1 and failed[0].startswith("| Team A | ")
    assert "pass: speedup above 3.2x; full marks above 4x; accuracy floor 88%" in text
    for speedup in (r.split(" | ")[3] for r in rows):  # every row's speedup with its interval: `0.94 (0.37-1.89)`
        assert "(" in speedup and "-" in speedup, speedup
    medians = [float(r.split(" | ")[3].split()[0]) for r in rows]
    assert medians == sorted(medians, reverse=True)
    assert "<table>" in (tmp_path / "board.html").read_text()
    assert "lossy" in proc.stdout and "tampered" in proc.stdout


@pytest.mark.slow
def test_a_claim_the_rerun_cannot_reach_is_not_reproduced(graded, tmp_path) -> None:
    """A team that signs a summary claiming ten times its passes' speed passes every check but the re-run's (ten:
    three passes on this shared machine can scatter by a factor of two or three, and the interval says so)."""
    exact = graded["board"] / "exact.bundle.tgz"
    summary = json.loads(read_bundle(exact).members["summary.json"])
    faster = {**summary, "pass_ips": [10 * p for p in summary["pass_ips"]], "speedup": 10 * summary["speedup"]}
    claimed = _repacked(exact, tmp_path / "claimed.bundle.tgz", key=graded["alice"],
                        change={"summary.json": json.dumps(faster).encode()})
    proc = run_pictl(["verify", str(claimed), "--hosts", str(graded["hosts"]), "--allowed-signers",
                      str(graded["allowed"])], graded["env"], timeout=600)
    assert proc.returncode == E.EXIT_NOT_REPRODUCED, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"pictl: error: {claimed}: claimed speedup ") and "is above the re-run's" in last
    record = json.loads((tmp_path / "claimed.bundle.tgz.verify.json").read_text())
    assert record["verified"] is False and record["exit_code"] == E.EXIT_NOT_REPRODUCED
