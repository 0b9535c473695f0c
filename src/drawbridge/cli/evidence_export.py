"""``drawbridge evidence export | verify-export``: the auditor package of one run, and its check.

Invariant: ``export`` writes a package only from a trace that verifies against its own signed
checkpoints, into a new or empty directory, with public material only; ``verify-export`` reads every
file of a package and recomputes every check from its bytes (``drawbridge.evidence.export_verify``),
with the keys the auditor pins (``--vkey``, ``--attestation-key``) or, failing those, the package's
own (reported as such).

Exit codes: ``export`` 0 written, 1 the evidence does not verify or lacks a record its trace names,
2 usage error or unreadable input (keys of another origin or key than the log's are refused, as the
gateway refuses them); ``verify-export`` 0 verified, 1 failed, 2 unreadable (a file the layout requires
is missing).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from drawbridge.cli.evidence_io import _finish, audit_import_files
from drawbridge.cli.evidence_trace import load_vkey, read_held
from drawbridge.cli.output import EXIT_FAILED, InputError, console, emit_json, format_option, key_values, plain, table, verdict
from drawbridge.evidence.classify import record_text


@click.command(name="export")
@click.option("--evidence-dir", required=True, type=click.Path(file_okay=False, exists=True), help="The gateway's evidence directory.")
@click.option("--run", "run_id", metavar="ID", help="The run to export (default: the last run of the trace).")
@click.option("--out", required=True, type=click.Path(), help="A new or empty directory for the package.")
@click.option("--carriers", type=click.Path(dir_okay=False, exists=True), help="The truth carrier file (--tool-decision-truth-out): required when the run's trace names carriers.")
@click.option("--audit-import", "audit_imports", multiple=True, type=click.Path(exists=True),
              help="Provider audit records (a .json file, or a directory whose *.json files are read) to include as "
                   "imported, each record once. Repeatable.")
@click.option("--keys-dir", type=click.Path(file_okay=False), help="The signing keys (default: keys inside --evidence-dir).")
@format_option
def export_cmd(
    evidence_dir: str, run_id: str | None, out: str, carriers: str | None, audit_imports: tuple[str, ...],
    keys_dir: str | None, output_format: str,
) -> None:
    """Write the auditor package of one run: an Assay evidence bundle (bundle.tar.gz) with its DSSE
    attestation, the trace with its checkpoints (one signed now, covering every line) and tlog-proofs, the
    imported audit records, the public keys, and a DSSE attestation over every file (export.intoto.json).

    Exit codes: 0 written, 1 the evidence does not verify or lacks a record its trace names, 2 usage error
    or unreadable input.
    """
    from drawbridge.evidence.export_package import ExportError, ExportUsageError
    from drawbridge.evidence.audit_import import AuditImportError
    from drawbridge.state.auditor_package import build_package, check_out_dir, write_package
    from drawbridge.state.checkpoint_files import CheckpointFileError
    from drawbridge.state.signing_keys import KeyFileError

    try:
        check_out_dir(out)
    except ExportUsageError as exc:
        raise InputError(str(exc)) from None
    try:
        imported, skipped = _audit_imports(audit_imports)
    except AuditImportError as exc:
        raise InputError(f"{exc}: nothing is exported") from None
    try:
        files, summary = build_package(evidence_dir, run_id=run_id, carriers_file=carriers, audit_imports=imported,
                                       keys_dir=keys_dir)
    except (KeyFileError, CheckpointFileError, ExportUsageError) as exc:
        raise InputError(str(exc)) from None
    except ExportError as exc:
        click.echo(f"drawbridge: {exc}", err=True)
        click.get_current_context().exit(EXIT_FAILED)
    try:
        write_package(out, files)
    except ExportError as exc:
        raise InputError(str(exc)) from None
    except OSError as exc:
        raise InputError(f"{out}: cannot write: {exc.strerror}") from None
    report = {"out": out, **summary.__dict__, "audit_records": len(imported), "audit_imports_skipped": skipped}
    if output_format == "json":
        emit_json(report)
        return
    state = "sealed" if summary.sealed else "INCOMPLETE (no run_end: the gateway still runs, or crashed)"
    console().print(key_values("Auditor package", [
        ("written to", out), ("run", summary.run_id), ("run state", state), ("bundle events", summary.events),
        ("surface records", summary.surfaces), ("truth carriers", summary.carriers),
        ("checkpoint", f"tree of {summary.tree_size} lines" + ("" if summary.recorded_locally
                                                                 else " (kept in the package only: a gateway holds the log)")),
        ("audit records", len(imported)), ("files", summary.files),
    ]))
    if skipped:
        console().print(table("Skipped imports", ("source", "reason"), ((s["source"], s["reason"]) for s in skipped)))


def _audit_imports(paths: Sequence[str]) -> tuple[list[tuple[str, bytes]], list[dict[str, str]]]:
    """``(package name, bytes)`` of each distinct audit record ``--audit-import`` names, and what is not
    exported, with why. A package holds nothing its verify-export would reject (``package_audit_record``)
    and each record once (``distinct_audit_records``: a copy is skipped, a conflict refused)."""
    from drawbridge.evidence.audit_import import distinct_audit_records, package_audit_record

    files, skipped = audit_import_files(paths)
    data: dict[str, bytes] = {}
    records: list[tuple[str, Any]] = []
    for file in files:
        try:
            data[str(file)] = file.read_bytes()
        except OSError as exc:
            raise InputError(f"{record_text(str(file))}: cannot read: {exc.strerror}") from None
        records.append((str(file), package_audit_record(str(file), data[str(file)])))
    kept, copies = distinct_audit_records(records)
    skipped += [{"source": record_text(label), "reason": f"the same record as {record_text(first)}: exported once"}
                for label, _record, first in copies]
    names: dict[str, str] = {}
    for label, _record in kept:
        name = Path(label).name
        if name in names:
            raise InputError(f"two audit records are named {record_text(name)}: {record_text(names[name])} and "
                             f"{record_text(label)}")
        names[name] = label
    return [(Path(label).name, data[label]) for label, _record in kept], sorted(skipped, key=lambda s: s["source"])


def read_package(directory: str) -> dict[str, bytes]:
    root = Path(directory)
    if not root.is_dir():
        raise InputError(f"{directory}: not a directory")
    files: dict[str, bytes] = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            raise InputError(f"{path}: a symbolic link in a package is not read")
        if path.is_file():
            try:
                files[path.relative_to(root).as_posix()] = path.read_bytes()
            except OSError as exc:
                raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    if not files:
        raise InputError(f"{directory}: the directory holds no file")
    return files


@click.command(name="verify-export")
@click.argument("package", metavar="DIR")
@click.option("--known-checkpoint", "known_files", multiple=True, metavar="FILE",
              help="A checkpoint of this log held elsewhere: the package's trace must be consistent with it. Repeatable.")
@click.option("--vkey", metavar="FILE", help="The checkpoint verifier key you pinned (default: the package's keys/checkpoint.vkey).")
@click.option("--attestation-key", metavar="PEM", help="The attestation public key you pinned (default: the package's).")
@format_option
def verify_export_cmd(
    package: str, known_files: tuple[str, ...], vkey: str | None, attestation_key: str | None, output_format: str
) -> None:
    """Verify an auditor package: every file attested, the bundle (Assay's integrity rules and its
    attestation), carriers and recipe rows, side effects against the imported audit records, the trace's
    chain and signed checkpoint, checkpoints held elsewhere, the run sealed, the bundle bound to the trace
    both ways, and every tlog-proof. Prints a report: ok, checks, claims_not_made.

    Exit codes: 0 verified, 1 failed, 2 unreadable input.
    """
    from drawbridge.evidence.export_verify import missing, verify_export
    from drawbridge.state.signing_keys import KeyFileError, read_public_pem

    files = read_package(package)
    lacking = missing(files)
    if lacking:
        raise InputError(f"{package}: {', '.join(lacking)} {'is' if len(lacking) == 1 else 'are'} missing: "
                         "not a whole auditor package (docs/auditor-package.md, Layout)")
    pinned = vkey is not None and attestation_key is not None
    root = Path(package)
    try:
        verifier = load_vkey(vkey if vkey is not None else str(root / "keys" / "checkpoint.vkey"))
        public = read_public_pem(attestation_key if attestation_key is not None else root / "keys" / "attestation.pub.pem")
    except KeyFileError as exc:
        raise InputError(str(exc)) from None
    known = [read_held(path) for path in known_files]
    report = verify_export(files, vkey=verifier, attestation_key=public, keys_pinned=pinned, known=known)
    if output_format == "json":
        emit_json(report)
        _finish(report["ok"])
    _print(package, report)
    _finish(report["ok"])


def _print(package: str, report: dict[str, Any]) -> None:
    out = console()
    passed = sum(1 for check in report["checks"] if check["ok"])
    out.print(key_values("Auditor package", [
        ("package", package), ("run", report["run_id"]),
        ("keys", "pinned by you" if report["keys"] == "pinned" else "the package's own (pin yours: --vkey, --attestation-key)"),
        ("checks passed", f"{passed} of {len(report['checks'])}"), ("result", verdict(report["ok"])),
    ]))
    rows = ((c["id"], verdict(c["ok"], "ok", "FAIL"), c["detail"]) for c in report["checks"])
    out.print(table("Checks", ("check", "ok", "detail"), rows))
    out.print(plain("Not claimed: " + ", ".join(report["claims_not_made"])))


COMMANDS = (export_cmd, verify_export_cmd)

__all__ = ["COMMANDS", "export_cmd", "read_package", "verify_export_cmd"]
