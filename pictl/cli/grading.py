"""Results a TA can verify: `pictl bundle` (a run as one signed file), `pictl verify` (its checks and its re-run)
and `pictl board` (a class's bundles side by side). The work is `pictl.jobs.grading`'s; this is its command line."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from pictl import errors as E
from pictl.cli.common import (
    HostsOpt,
    JsonOpt,
    RunsDirOpt,
    VerboseOpt,
    WaitOpt,
    app,
    checked_runs_root,
    fail,
    note,
    path_arg,
    read_cluster,
    run_cancellable,
    runs_root,
    stderr,
    wide_console,
)

GRADING_PANEL = "Grading"
AllowedOpt = Annotated[Optional[Path], typer.Option(
    "--allowed-signers", help="The class's allowed signers (ssh-keygen's format: `team namespaces=\"pictl-bundle\" "
    "ssh-ed25519 AAAA...`; default: accept your own key).", parser=path_arg, rich_help_panel=GRADING_PANEL)]
ProfileRulesOpt = Annotated[Optional[str], typer.Option(
    "--profile", help="Check the rules of this preset's [rules] (default: the bundled run's own profile's).",
    rich_help_panel=GRADING_PANEL)]
MinAccuracyOpt = Annotated[Optional[float], typer.Option(
    "--min-accuracy", help="The accuracy floor (a share, 0.88): the run must have measured at least this.",
    min=0.0, max=1.0, rich_help_panel=GRADING_PANEL)]


@app.command()
def bundle(
    run: Annotated[str, typer.Argument(help="Run id, unique id prefix, or directory.")],
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="The bundle file (default: "
                                                   "./RUN_ID.bundle.tgz; a name not ending in .bundle.tgz gets it).",
                                                   parser=path_arg)] = None,
    key: Annotated[Optional[Path], typer.Option(help="SSH private key to sign with (default: the first of "
                                                "~/.ssh/id_ed25519, id_ecdsa, id_rsa).", parser=path_arg)] = None,
    team: Annotated[Optional[str], typer.Option(help="The team the board names (default: the signer).")] = None,
    runs_dir: RunsDirOpt = None,
) -> None:
    """Pack a finished run into one file signed with your SSH key, for `pictl verify`.

    The bundle holds the protocol and options, the code the hosts ran, the model artifact, the summary, flags,
    host facts, traces and the outputs' hash."""
    from pictl.jobs.grading.bundle import BUNDLE_SUFFIX, default_key, make_bundle
    from pictl.jobs.grading.manifest import BundleManifest
    from pictl.records import catalog
    from pictl.records.files import write_bytes_atomic

    try:
        path = catalog.resolve_run(runs_root(runs_dir), run)
        chosen = key or default_key()
        if chosen is None:
            raise E.ConfigError("no SSH key to sign with: none of ~/.ssh/id_ed25519, id_ecdsa, id_rsa exists; give "
                                "--key PATH")
        if not chosen.expanduser().is_file():
            raise E.ConfigError(f"--key {chosen}: no such file")
        if team is not None and not team.strip():
            raise E.ConfigError("--team: empty (give the team's name, or leave it out to be named by your key)")
        data, written = make_bundle(path, chosen.expanduser(), team=team)
        manifest = BundleManifest.view(written)
        target = output or Path.cwd() / f"{manifest.run_id}{BUNDLE_SUFFIX}"
        if target.is_dir():
            target = target / f"{manifest.run_id}{BUNDLE_SUFFIX}"
        elif not target.name.endswith(BUNDLE_SUFFIX):  # `pictl board` and the TA's folder know bundles by it
            target = target.with_name(target.name + BUNDLE_SUFFIX)
            note(f"written as {target.name}: a bundle's name ends in {BUNDLE_SUFFIX} (`pictl board` finds it by that)")
        try:
            write_bytes_atomic(target, data)
        except OSError as exc:
            raise E.ConfigError(f"--output {target}: cannot be written ({exc.strerror or exc})") from None
    except E.PictlError as exc:
        fail(exc)
    signer = manifest.signer_record()
    note(f"signed with {chosen} ({signer.fingerprint if signer else None}): {len(manifest.members or {})} members, "
         f"{len(data) / 1e6:.1f} MB")
    if manifest.suspect_because:
        note(f"the run's result is SUSPECT ({manifest.suspect_because}): the board marks it so")
    typer.echo(str(target))


@app.command()
def verify(
    bundle_file: Annotated[Path, typer.Argument(metavar="BUNDLE", help="A bundle `pictl bundle` wrote.",
                                                parser=path_arg)],
    allowed_signers: AllowedOpt = None,
    profile: ProfileRulesOpt = None,
    min_accuracy: MinAccuracyOpt = None,
    no_rerun: Annotated[bool, typer.Option("--no-rerun", help="Check signature, hashes, code and rules only.",
                                           rich_help_panel=GRADING_PANEL)] = False,
    data_path: Annotated[Optional[Path], typer.Option(help="Your copy of the run's data set (default: the path "
                                                      "the run used).", parser=path_arg,
                                                      rich_help_panel=GRADING_PANEL)] = None,
    hosts: HostsOpt = None,
    runs_dir: RunsDirOpt = None,
    wait: WaitOpt = False,
    as_json: JsonOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Check a bundle and re-run it on the cluster: exit 0 when it is reproduced.

    Checks the signature, the hashes, the code digest and the preset's rules, then re-runs the configuration with
    the bundle's own code and compares: outputs identical, accuracy identical, speedup within the re-run's
    interval. Exit 11 signature, 12 tampered, 13 code, 14 rules, 5 outputs or accuracy, 15 speedup."""
    from pictl.jobs.grading.bundle import Bundle, read_bundle
    from pictl.jobs.grading.verify import (
        VerifyRecord,
        check_bundle,
        compare_rerun,
        rerun,
        speedup_spread,
        write_record,
    )

    started = time.monotonic()
    read: Bundle | None = None
    try:
        read = read_bundle(bundle_file)
        checked = check_bundle(read, allowed=allowed_signers, profile=profile, min_accuracy=min_accuracy)
        claimed = speedup_spread(checked.summary)
        said = stderr()
        said.print(f"pictl verify: signed by {checked.signer.text()}; members, code digest "
                   f"{checked.summary.code} and rules hold", markup=False)
        if checked.summary.verdict == "suspect":
            note(f"the bundled run's result was SUSPECT: {checked.summary.suspect_because}")
        # (built as found, nothing coerced: `--json` prints it as it is, `write_record` checks it when kept)
        result = VerifyRecord.model_construct(checked=True, verified=not no_rerun, team=checked.team,
                                              signer=checked.signer.text(),
                                              claimed=claimed.to_json() if claimed else None, rerun=None,
                                              run_duration_s=checked.summary.duration_s)
        if no_rerun:
            result.why = "checked; not re-run (--no-rerun)"
        else:
            from pictl.headless import HeadlessRenderer

            cluster = read_cluster(hosts)
            root = checked_runs_root(runs_dir)
            renderer = HeadlessRenderer(verbose=verbose)
            try:
                summary, outputs = asyncio.run(run_cancellable(rerun(checked, cluster, root, on_event=renderer,
                                                                     data_path=data_path, wait=wait)))
            finally:
                renderer.close()
            measured = compare_rerun(checked, summary, outputs)
            result.rerun = measured.to_json() if measured else None
            result.rerun_id = summary.run_id
            result.why = (f"re-run {summary.run_id} reproduced it: outputs identical, speedup "
                          f"{measured.text('.2f', 'x') if measured else 'n/a'}")
        result.verify_s = verify_s = round(time.monotonic() - started, 2)
    except E.PictlError as exc:
        if read is not None and not no_rerun and not isinstance(exc, E.Interrupted):
            failed = VerifyRecord.model_construct(verified=False, exit_code=exc.exit_code, why=str(exc),
                                                  verify_s=round(time.monotonic() - started, 2))
            write_record(read, failed.written(), note)
        fail(exc)
    if not no_rerun:  # the board reads the last full verification's outcome, not a check's
        write_record(read, result.written(), note)
    if as_json:
        typer.echo(json.dumps(result.written(), indent=1, sort_keys=True))
        return
    took = f"; verification {verify_s:.1f} s (the run {checked.summary.duration_s or 0:.1f} s)"
    claim = claimed.text(".2f", "x") if claimed else "n/a"
    said_of = "checked" if no_rerun else "verified"
    typer.echo(f"{said_of}: {read.path}: team {checked.team}, speedup {claim}; {result.why}{took}")


@app.command()
def board(
    folder: Annotated[Path, typer.Argument(metavar="DIR", help="A folder of bundles (*.bundle.tgz).",
                                           parser=path_arg)],
    allowed_signers: AllowedOpt = None,
    profile: ProfileRulesOpt = None,
    min_accuracy: MinAccuracyOpt = None,
    passing: Annotated[float, typer.Option("--pass", help="A speedup above this passes.", min=0)] = 3.2,
    full: Annotated[float, typer.Option("--full", help="A speedup above this gets full marks.", min=0)] = 4.0,
    floor: Annotated[float, typer.Option("--accuracy-floor", help="Accuracies below this are marked.", min=0,
                                         max=1)] = 0.88,
    markdown: Annotated[Optional[Path], typer.Option("--markdown", help="Also write the board as Markdown here.",
                                                     parser=path_arg)] = None,
    html: Annotated[Optional[Path], typer.Option("--html", help="Also write the board as HTML here.",
                                                 parser=path_arg)] = None,
) -> None:
    """A class's bundles side by side, fastest first, the lab's thresholds marked.

    Team, configuration, exact or lossy, speedup and its interval, accuracy, the mark, and whether `pictl verify`
    reproduced it (and why not); also as Markdown and HTML."""
    from pictl.jobs.grading import board as B
    from pictl.records.files import write_bytes_atomic

    marks = B.Thresholds(passing, full, floor)
    try:
        rows = B.board_rows(folder, allowed=allowed_signers, profile=profile, min_accuracy=min_accuracy)
        for target, text in ((markdown, B.markdown), (html, B.html)):
            if target is not None:
                try:
                    write_bytes_atomic(target, text(rows, marks).encode())
                except OSError as exc:
                    raise E.ConfigError(f"{target}: cannot be written ({exc.strerror or exc})") from None
    except E.PictlError as exc:
        fail(exc)
    wide_console().print(B.table(rows, marks))
