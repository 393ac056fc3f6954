"""`pictl verify`: a bundle's checks, in the order a TA trusts them, and its re-run on the reference cluster.

1. the signature (`check_signature`): `ssh-keygen -Y verify` over the manifest, against the class's allowed
   signers; without them, against the user's own keys, and the line says whose key it was;
2. the members (`check_members`): each one's sha256 is the manifest's, none missing, none added;
3. the code (`check_code`): the bundled tree's digest is the one the run's summary names;
4. the rules (`check_rules`): the run's options keep the preset's `[rules]` (`planning.rules`), its accuracy the
   floor, and the run finished with outputs that matched its serial run;
5. the re-run (`rerun`): the bundle's configuration on the given cluster, its code pushed as the run's tree and
   its artifact shipped, a fresh serial baseline; then `compare_rerun`: the outputs' sha256 identical, the
   accuracy identical, and the claimed speedup not above the re-run's interval (`compare_stats.spread` over the
   timed passes, each over the run's serial img/s) above the claimed median.

Each failed check raises its own error (`pictl.errors`: SignatureInvalid 11, BundleTampered 12, CodeMismatch 13,
RulesBroken 14, OutputMismatch 5, NotReproduced 15), one line. What a verification found is kept beside the bundle
(`<bundle>.verify.json`, keyed by the bundle's sha256) for `pictl board`.
"""

from __future__ import annotations

import getpass
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pictl import errors as E
from pictl.cluster.push import manifest_digest
from pictl.events import EventSink
from pictl.inventory import Cluster
from pictl.jobs.grading.bundle import (
    ARTIFACT_DIR,
    KEY_NAMES,
    NAMESPACE,
    OUTPUT_FILES,
    SIGNATURE,
    Bundle,
    last_line,
    sha256,
    ssh_keygen,
)
from pictl.planning.options import RunOptions
from pictl.planning.presets import preset_rules, resolve_options
from pictl.planning.rules import GradingRules, below_floor, broken_rule
from pictl.records.compare_stats import MIN_EFFECT, Spread, spread
from pictl.records.files import read_regular
from pictl.records.run_config import RunConfigRecord
from pictl.records.runs import CONFIG_FILE, SUMMARY_FILE
from pictl.summary import terminal_text
from pictl.summary_figures import Open
from pictl.summary_models import RunSummary

__all__ = ["Checked", "Signer", "VerifyRecord", "check_bundle", "compare_rerun", "record_path", "rerun",
           "run_options", "speedup_spread", "write_record"]

RECORD_SUFFIX = ".verify.json"


@dataclass(frozen=True)
class Signer:
    """Who signed a bundle, as the check established it."""

    principal: str
    fingerprint: str
    own: bool
    """Accepted as the user's own key (no allowed signers were given)."""

    def text(self) -> str:
        if self.own:
            return f"your own key ~/.ssh/{self.principal}.pub ({self.fingerprint})"
        return f"{self.principal} ({self.fingerprint})"


@dataclass(frozen=True)
class Checked:
    """A bundle that passed every check before the re-run: what the re-run and the board need of it."""

    bundle: Bundle
    signer: Signer
    summary: RunSummary
    options: RunOptions
    """The run's options from its config.json, checked anew (`run_options`)."""
    team: str
    lossy: bool
    """A lossy wire or other numerics: outputs judged by top-1 agreement with the serial run, not bit for bit."""


class VerifyRecord(Open):
    """What a verification found, kept beside the bundle (`<bundle>.verify.json`, `write_record`) for `pictl
    board`: read back as written (a file beside a bundle may hold anything; `bundle_sha256` ties it to one file)."""

    bundle_sha256: str | None = None
    """The sha256 of the bundle file verified: a record of another file is not read as this one's."""
    checked: bool | None = None
    verified: bool | None = None
    """Re-run and reproduced (False: a check or the re-run failed)."""
    exit_code: int | None = None
    """The failed check's exit code (`pictl.errors`)."""
    why: str | None = None
    team: str | None = None
    signer: str | None = None
    claimed: dict[str, Any] | None = None
    """The bundled run's speedup spread (`Spread.to_json`)."""
    rerun: dict[str, Any] | None = None
    """The re-run's speedup spread."""
    rerun_id: str | None = None
    run_duration_s: float | None = None
    verify_s: float | None = None


def _good_fingerprint(proc: Any) -> str:
    """The `SHA256:...` in ssh-keygen's `Good "..." signature ... key SHA256:...` line."""
    words = (proc.stdout + proc.stderr).decode(errors="replace").split()
    return next((w for w in words if w.startswith("SHA256:")), "unknown key")


def _own_allowed_signers(folder: Path) -> Path | None:
    """An allowed-signers file of the user's own public keys (~/.ssh/id_*.pub), or None when there is none."""
    lines = []
    for name in KEY_NAMES:
        pub = Path.home() / ".ssh" / f"{name}.pub"
        if pub.is_file():
            fields = pub.read_text(errors="replace").split()
            if len(fields) >= 2:
                lines.append(f'{name} namespaces="{NAMESPACE}" {fields[0]} {fields[1]}')  # (the principal: its file)
    if not lines:
        return None
    target = folder / "allowed_signers"
    target.write_text("\n".join(lines) + "\n")
    return target


def check_signature(bundle: Bundle, allowed: Path | None) -> Signer:
    """Whose key signed the manifest: one of `allowed`'s principals, or (no `allowed`) the user's own key."""
    if allowed is not None and not allowed.is_file():
        raise E.ConfigError(f"--allowed-signers {allowed}: no such file")
    with tempfile.TemporaryDirectory(prefix="pictl-verify-") as tmp:
        folder = Path(tmp)
        sig = folder / SIGNATURE
        sig.write_bytes(bundle.signature)
        plain = ssh_keygen(["-Y", "check-novalidate", "-n", NAMESPACE, "-s", str(sig)], stdin=bundle.manifest_bytes)
        if plain.returncode:
            raise E.SignatureInvalid(f"{bundle.path}: the signature does not hold over its manifest "
                                     f"({last_line(plain)})")
        key = _good_fingerprint(plain)
        own = allowed is None
        signers = _own_allowed_signers(folder) if own else allowed
        if signers is None:
            raise E.SignatureInvalid(f"{bundle.path}: signed by {key}; no --allowed-signers given and no key of "
                                     f"yours in ~/.ssh to accept it by")
        found = ssh_keygen(["-Y", "find-principals", "-s", str(sig), "-f", str(signers)])
        principals = found.stdout.decode(errors="replace").split() if found.returncode == 0 else []
        if not principals:
            whose = "not your own key: give the class's --allowed-signers" if own else f"not in {allowed}"
            raise E.SignatureInvalid(f"{bundle.path}: signed by {key}, {whose}")
        checked = ssh_keygen(["-Y", "verify", "-f", str(signers), "-I", principals[0], "-n", NAMESPACE,
                              "-s", str(sig)], stdin=bundle.manifest_bytes)
        if checked.returncode:
            raise E.SignatureInvalid(f"{bundle.path}: signed by {key}, which {signers} does not allow for "
                                     f"{NAMESPACE} ({last_line(checked)})")
        return Signer(principals[0], _good_fingerprint(checked), own)


def check_members(bundle: Bundle) -> None:
    """Every member's sha256 is the one the (signed) manifest gives; none missing, none added."""
    manifest = bundle.manifest
    listed = manifest.members
    if not isinstance(listed, dict):
        raise E.BundleTampered(f"{bundle.path}: its manifest lists no members")
    for name in sorted(set(listed) | set(bundle.members)):
        if name not in bundle.members:
            raise E.BundleTampered(f"{bundle.path}: {terminal_text(name, 80)} is listed in its manifest but missing")
        if name not in listed:
            raise E.BundleTampered(f"{bundle.path}: {terminal_text(name, 80)} was added after signing (not in its "
                                   "manifest)")
        if sha256(bundle.members[name]) != listed[name]:
            raise E.BundleTampered(f"{bundle.path}: {terminal_text(name, 80)} was changed after signing (its sha256 "
                                   "is not the manifest's)")
    outputs = bundle.outputs()
    if manifest.outputs_sha256 != (sha256(outputs) if outputs is not None else None):
        raise E.BundleTampered(f"{bundle.path}: its outputs are not the ones its manifest hashes")


def check_code(bundle: Bundle, summary: RunSummary) -> str:
    """The bundled code's digest, which must be the one the run's summary names (and the manifest's)."""
    digest = manifest_digest(bundle.code_tree())
    if digest != summary.code or digest != bundle.manifest.code:
        raise E.CodeMismatch(f"{bundle.path}: the bundled code's digest {digest} is not the code the run's hosts ran "
                             f"({summary.code})")
    return digest


def check_rules(bundle: Bundle, summary: RunSummary, options: RunOptions, *, profile: str | None,
                min_accuracy: float | None) -> GradingRules | None:
    """The run keeps the rules of `profile` (default: the run's own profile, as this machine has it) and the
    accuracy floor, and it finished with outputs that matched its serial run. Returns the rules applied."""
    name = profile if profile is not None else summary.profile
    try:
        rules = preset_rules(name)
    except E.ConfigError:
        if profile is not None:
            raise  # the TA's own --profile must exist
        rules = None  # the student's own profile is not here: only the floor applies
    broken = broken_rule(rules, options) if rules is not None else None
    if broken:
        raise E.RulesBroken(f"{bundle.path}: breaks the rule {broken} of profile '{name}'")
    floor = below_floor(rules or GradingRules(), summary.accuracy, min_accuracy)
    if floor:
        raise E.RulesBroken(f"{bundle.path}: below the accuracy floor: {floor}")
    if summary.status != "ok" or summary.outputs_match is not True:
        raise E.OutputMismatch(f"{bundle.path}: the bundled run's own outputs did not match its serial run "
                               f"(status {summary.status})")
    return rules


def _summary(bundle: Bundle) -> RunSummary:
    try:
        return RunSummary.model_validate(bundle.json(SUMMARY_FILE))
    except ValueError as exc:
        raise E.BundleTampered(f"{bundle.path}: {SUMMARY_FILE} is not a run summary ({terminal_text(exc, 120)})") \
            from None


def run_options(bundle: Bundle, *, artifact_dir: Path | None = None, data_path: Path | None = None) -> RunOptions:
    """The run's options from its config.json (checked anew), its final cuts as an explicit split, with the
    bundled artifact (written under `artifact_dir`) and `data_path` (the verifier's copy of the data set) in place
    of the run's own paths."""
    given = RunConfigRecord.view(bundle.json(CONFIG_FILE)).options
    if not isinstance(given, dict):
        raise E.BundleTampered(f"{bundle.path}: config.json holds no options")
    # (a re-run that loses a host ends: going on with fewer stages would verify another configuration)
    fields = {**given, "master_port": None, "track": [], "on_host_loss": "fail"}
    split: Any = RunSummary.view(bundle.json(SUMMARY_FILE)).split_points  # (as written: checked here)
    if isinstance(split, list) and split and all(isinstance(p, str) for p in split):
        # The cuts the run ended with, not a new search: a lossy wire's outputs depend on where it cuts.
        fields["split"] = split
    artifact = bundle.manifest.artifact_record()
    if artifact is not None and artifact_dir is not None:
        name = f"{ARTIFACT_DIR}/{artifact.name}"
        if name not in bundle.members:
            raise E.ConfigError(f"{bundle.path}: the run's model artifact {artifact.name} (digest "
                                f"{artifact.digest}) is not in the bundle (too large): it cannot be re-run")
        path = artifact_dir / str(artifact.name)
        path.write_bytes(bundle.members[name])
        fields.update(model=str(path), artifact=None)
    if data_path is not None:
        fields["data_path"] = str(data_path)
    return resolve_options(None, fields, source=f"{bundle.path}: config.json")


def check_bundle(bundle: Bundle, *, allowed: Path | None, profile: str | None, min_accuracy: float | None,
                 team: str | None = None) -> Checked:
    """Checks 1 to 4 (nothing runs): the first that fails raises its error."""
    signer = check_signature(bundle, allowed)
    check_members(bundle)
    summary = _summary(bundle)
    check_code(bundle, summary)
    options = run_options(bundle)
    check_rules(bundle, summary, options, profile=profile, min_accuracy=min_accuracy)
    named = bundle.manifest.team
    chosen = team or (named if isinstance(named, str) and named else None) or (
        getpass.getuser() if signer.own else signer.principal)
    return Checked(bundle, signer, summary, options, chosen, options.lossy_wire or options.numerics != "fp32")


async def rerun(checked: Checked, cluster: Cluster, runs_root: Path, *, on_event: EventSink | None = None,
                data_path: Path | None = None, wait: bool = False) -> tuple[RunSummary, bytes | None]:
    """The bundle's configuration run again on `cluster` with the bundle's code (pushed as the run's tree, its
    digest keying the caches) and artifact, against a fresh serial baseline: its summary and its outputs. A run
    that fails raises its own error (RunFailed 3, OutputMismatch 5 when its outputs miss its serial run's)."""
    from pictl.run.session import RunSession

    bundle = checked.bundle
    with tempfile.TemporaryDirectory(prefix="pictl-verify-artifact-") as tmp:
        options = run_options(bundle, artifact_dir=Path(tmp), data_path=data_path)
        session = RunSession(cluster, options, on_event=on_event, runs_root=runs_root, reuse_baseline=False,
                             wait=wait)
        tree = bundle.code_tree()
        object.__setattr__(session.ctx, "tree", tree)  # (frozen: the run's code is the bundle's, set before it runs)
        object.__setattr__(session.ctx, "code", manifest_digest(tree))
        summary = await session.run()
    run_dir = Path(summary.run_dir or runs_root / summary.run_id)
    for name in OUTPUT_FILES:
        if (run_dir / name).is_file():
            return summary, read_regular(run_dir, name, 512 << 20)
    return summary, None


def speedup_spread(summary: RunSummary) -> Spread | None:
    """The run's speedup over its timed passes: each pass's img/s over the serial run's (`compare_stats.spread`:
    the median, the 95 % interval of the typical value, the range); None without passes or a serial figure."""
    passes = [p for p in summary.pass_ips if p and p > 0]
    if not passes or not summary.serial_ips:
        return None
    return spread([p / summary.serial_ips for p in passes])


def compare_rerun(checked: Checked, rerun: RunSummary, outputs: bytes | None) -> Spread | None:
    """The re-run against the bundle: outputs identical (sha256), accuracy identical, and the claimed speedup (its
    median over the run's passes) inside or below the re-run's interval (`compare_stats.spread`; its range with one
    pass), its upper end widened by the re-run's serial scatter and `MIN_EFFECT`: a claim below it is no mismatch
    (the reference cluster may be faster). Returns the re-run's speedup spread."""
    path, claimed = checked.bundle.path, checked.summary
    want = checked.bundle.manifest.outputs_sha256
    got = sha256(outputs) if outputs is not None else None
    if want != got:
        raise E.OutputMismatch(f"{path}: the re-run's outputs differ from the bundle's (sha256 {str(got)[:12]}, "
                               f"bundled {str(want)[:12]})")
    if rerun.accuracy != claimed.accuracy:
        raise E.OutputMismatch(f"{path}: the re-run's accuracy {rerun.accuracy} is not the bundle's "
                               f"{claimed.accuracy}")
    mine, theirs = speedup_spread(rerun), speedup_spread(claimed)
    if mine is None or theirs is None:
        raise E.NotReproduced(f"{path}: no speedup to compare (the bundle's or the re-run's has no timed passes)")
    # The re-run's passes divide by its one serial figure, whose own passes scattered too (kept as their range):
    # its interval's upper end is taken at its serial run's slowest pass.
    rerun_high = (mine.high if mine.high is not None else mine.most) * _serial_slack(rerun)
    if theirs.median > rerun_high * (1 + MIN_EFFECT):
        raise E.NotReproduced(f"{path}: claimed speedup {theirs.text(unit='x')} is above the re-run's "
                              f"{mine.text(unit='x')}")
    return mine


def _serial_slack(summary: RunSummary) -> float:
    """The run's serial img/s over its serial run's slowest timed pass: how far its speedups rise if the serial
    figure were that pass's instead of the middle one (1 without a recorded range)."""
    scatter = [v for v in (summary.serial_spread_ips or []) if v and v > 0]
    if not scatter or not summary.serial_ips:
        return 1.0
    return max(1.0, summary.serial_ips / min(scatter))


def record_path(bundle_path: Path) -> Path:
    return bundle_path.with_name(bundle_path.name + RECORD_SUFFIX)


def write_record(bundle: Bundle, result: dict[str, Any], note: Callable[[str], None]) -> None:
    """What the verification found, beside the bundle (for `pictl board`); a folder it cannot write in is a note,
    not a failure: the exit code is the verdict."""
    target = record_path(bundle.path)
    try:
        with tempfile.NamedTemporaryFile("w", dir=target.parent, prefix=".verify-", delete=False) as fh:
            json.dump(VerifyRecord.model_validate({"bundle_sha256": bundle.digest, **result}).written(), fh,
                      indent=1, sort_keys=True)
        Path(fh.name).replace(target)
    except OSError as exc:
        note(f"the verification's record could not be written beside the bundle ({target}: {exc.strerror or exc})")

