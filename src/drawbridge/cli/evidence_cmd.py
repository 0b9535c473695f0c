"""``drawbridge evidence``: recompute and verify evidence offline, from files alone.

Invariant: every verdict printed here is recomputed from the bytes of the
files given, by the pure core (``drawbridge.canonical``, ``drawbridge.evidence``);
nothing is looked up, fetched or trusted from a producer. This module only
reads files, calls the core and prints.

Exit codes (all subcommands): 0 verified (or, for the two computing commands,
done); 1 verification failed; 2 usage error or unreadable input (missing file,
invalid JSON, a document of the wrong shape). Messages for code 2 go to stderr
and name the file and line or field at fault, never a raw value from it.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from drawbridge.canonical import (
    CanonicalizationError,
    DuplicateKeyError,
    canonicalize_text,
    is_sha256_digest,
    jcs_digest,
    parse_json,
)
from drawbridge.cli import evidence_export, evidence_trace
from drawbridge.cli.evidence_io import AUDIT_IMPORT_FORMAT, _finish, _label, audit_import_files, read_bytes
from drawbridge.cli.output import (
    InputError,
    console,
    emit_json,
    format_option,
    key_values,
    plain,
    table,
    verdict,
)
from drawbridge.evidence.vocabulary import SIDE_EFFECT_LEVELS, TARGET_HASH_DOMAINS

TDT_VECTORS_SCHEMA = "assay.tool_decision_truth.vectors.v0"


@click.group(name="evidence", context_settings={"help_option_names": ["-h", "--help"]})
def command() -> None:
    """Recompute digests and verify evidence files offline.

    \b
    Exit codes:
      0  verified (canonicalize, target-hash: done)
      1  verification failed
      2  usage error or unreadable input
    """


# --------------------------------------------------------------------------- input helpers


def parse_ndjson(data: bytes, label: str) -> list[Any]:
    """One JSON value per non-blank line; a line that gives a key twice is refused (it could verify
    under one reading and mean another, e.g. two ``decision_verdict`` values)."""
    values: list[Any] = []
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            values.append(parse_json(line, unique_keys=True))
        except CanonicalizationError as exc:
            raise InputError(f"{label} line {number}: {exc}") from None
    return values


def read_surface(data: bytes, label: str) -> Any:
    """A surface document, or NDJSON of surface documents merged into one (decisions in file order)."""
    try:
        return parse_json(data, unique_keys=True)
    except DuplicateKeyError as exc:
        raise InputError(f"{label}: {exc}") from None
    except CanonicalizationError:
        pass
    documents = parse_ndjson(data, label)
    decisions: list[Any] = []
    for number, document in enumerate(documents, start=1):
        entries = document.get("observed_tool_decisions") if isinstance(document, dict) else None
        if not isinstance(entries, list):
            raise InputError(f"{label} line {number}: not an assay.tool_decision_surface.v0 document")
        decisions.extend(entries)
    first = documents[0] if documents else {}
    return {
        "schema": first.get("schema"),
        "observed_tool_decisions": decisions,
        "non_claims": first.get("non_claims", []),
    }


# --------------------------------------------------------------------------- canonicalize


@command.command(name="canonicalize")
@click.argument("file", default="-", metavar="[FILE|-]")
@format_option
def canonicalize_cmd(file: str, output_format: str) -> None:
    """Print the RFC 8785 (JCS) canonical form of a JSON document.

    FILE defaults to standard input. In table format (the default) the canonical
    bytes are written exactly, with no newline added, so that
    `drawbridge evidence canonicalize doc.json | sha256sum` prints the hex of the
    document's sha256: digest. --format json prints {"canonical", "digest"}.

    Exit codes: 0 done, 2 usage error, unreadable file or invalid JSON.
    """
    data = read_bytes(file)
    try:
        canonical = canonicalize_text(data)
    except CanonicalizationError as exc:
        raise InputError(f"{_label(file)}: {exc}") from None
    if output_format == "json":
        emit_json({"canonical": canonical.decode("utf-8"), "digest": jcs_digest(parse_json(canonical))})
        return
    out = sys.stdout.buffer
    out.write(canonical)
    out.flush()


# --------------------------------------------------------------------------- target-hash


@command.command(name="target-hash")
@click.argument("domain", type=click.Choice(TARGET_HASH_DOMAINS), metavar="DOMAIN")
@click.argument("value")
@format_option
def target_hash_cmd(domain: str, value: str, output_format: str) -> None:
    """Print the pseudonymised target hash of VALUE in DOMAIN.

    DOMAIN is one of: {domains}.

    target_hash = "sha256:" + hex(sha256("assay.tool_target.v0:" + DOMAIN + ":" +
    lower(trim(VALUE)))). VALUE "-" reads the value from standard input (which keeps it
    out of the process list and shell history); a VALUE that starts with "-" goes after
    "--". The value is never printed back.

    Exit codes: 0 done, 2 usage error (unknown DOMAIN).
    """
    from drawbridge.evidence.classify import target_hash

    if value == "-":
        try:
            value = sys.stdin.buffer.read().decode("utf-8")
        except UnicodeDecodeError:
            raise InputError("standard input: the value is not valid UTF-8") from None
    digest = target_hash(domain, value)
    if output_format == "json":
        emit_json({"domain": domain, "target_hash": digest})
    else:
        click.echo(digest)


target_hash_cmd.help = (target_hash_cmd.help or "").replace("{domains}", ", ".join(TARGET_HASH_DOMAINS))


# --------------------------------------------------------------------------- verify-tdt


def _tdt_checks(report: dict[str, Any]) -> list[dict[str, Any]]:
    checks = report.get("checks", report.get("items", []))
    return checks if isinstance(checks, list) else []


@command.command(name="verify-tdt")
@click.argument("file", metavar="FILE")
@click.option("--rows", "rows_file", metavar="FILE", help="NDJSON recipe rows citing the carriers in FILE.")
@click.option(
    "--declared-policy-digest",
    "policy_digest",
    metavar="DIGEST",
    help="With carriers: the sha256: digest of the declared policy every carrier must cite.",
)
@format_option
def verify_tdt_cmd(file: str, rows_file: str | None, policy_digest: str | None, output_format: str) -> None:
    """Verify tool-decision-truth evidence.

    FILE is either a conformance vectors document (one JSON object with schema
    assay.tool_decision_truth.vectors.v0), every expectation of which is
    recomputed, or NDJSON carriers (assay.tool_decision_truth.v0, one per line),
    checked alone or, with --rows, together with the recipe rows that cite them.

    Exit codes: 0 verified, 1 verification failed, 2 usage error or unreadable input.
    """
    from drawbridge.evidence.truth import vectors as tdt

    data = read_bytes(file)
    document: Any = None
    try:
        document = parse_json(data, unique_keys=True)
    except DuplicateKeyError as exc:
        raise InputError(f"{_label(file)}: {exc}") from None
    except CanonicalizationError:
        document = None  # not one JSON document: read as NDJSON below
    if isinstance(document, dict) and document.get("schema") == TDT_VECTORS_SCHEMA:
        if rows_file is not None or policy_digest is not None:
            raise click.UsageError(
                "--rows and --declared-policy-digest apply to carriers, not to a vectors document"
            )
        kind = "vectors document"
        report = tdt.verify_tdt_document(document)
    else:
        kind = "carriers"
        carriers = [document] if isinstance(document, dict) else parse_ndjson(data, _label(file))
        rows = parse_ndjson(read_bytes(rows_file), rows_file) if rows_file is not None else None
        if policy_digest is not None and not is_sha256_digest(policy_digest):
            raise click.BadParameter(
                "must be sha256: + 64 lowercase hex", param_hint="--declared-policy-digest"
            )
        report = tdt.verify_carriers(carriers, rows, declared_policy_digest=policy_digest)
    if not isinstance(report, dict) or not isinstance(report.get("ok"), bool):
        raise RuntimeError("the truth verifier returned a report without a boolean 'ok'")
    ok = report["ok"]
    if output_format == "json":
        emit_json(report)
        _finish(ok)
    checks = _tdt_checks(report)
    passed = sum(1 for check in checks if isinstance(check, dict) and check.get("ok") is True)
    out = console()
    summary: list[tuple[str, Any]] = [("input", f"{file} ({kind})")]
    for key in ("carrier_count", "row_count", "verified_rows"):
        if key in report:
            summary.append((key.replace("_", " "), report[key]))
    summary.append(("checks passed", f"{passed} of {len(checks)}"))
    summary.append(("result", verdict(ok)))
    out.print(key_values("Tool-decision truth", summary))
    out.print(
        table(
            "Checks",
            ("check", "ok", "detail"),
            (
                (c.get("id"), verdict(c.get("ok") is True, "ok", "FAIL"), c.get("detail"))
                for c in checks
                if isinstance(c, dict)
            ),
        )
    )
    claims_not_made = report.get("claims_not_made")
    if isinstance(claims_not_made, list) and claims_not_made:
        out.print(plain("Not claimed: " + ", ".join(str(c) for c in claims_not_made)))
    _finish(ok)


# --------------------------------------------------------------------------- verify-side-effects


def _rank(level: Any) -> int:
    return SIDE_EFFECT_LEVELS.index(level) if level in SIDE_EFFECT_LEVELS else -1


@command.command(name="verify-side-effects")
@click.argument("surface_json", metavar="SURFACE_JSON")
@click.argument("more_imports", nargs=-1, metavar="[PATH...]")
@click.option(
    "--audit-import",
    "audit_imports",
    multiple=True,
    metavar="PATH",
    help="Provider audit records: a .json file, or a directory whose *.json files are read "
    "in file-name order (other entries are listed as skipped). Repeatable; further PATHs may "
    "follow the first; a file named twice is one import.",
)
@format_option
def verify_side_effects_cmd(
    surface_json: str, more_imports: tuple[str, ...], audit_imports: tuple[str, ...], output_format: str
) -> None:
    """Re-derive each recorded side effect's level from imported provider audit records.

    SURFACE_JSON is an assay.tool_decision_surface.v0 document, or the gateway's
    tool-decisions.ndjson (one such document per line, read as one). Each call's level is
    re-derived (asserted; verified only through an audit record that binds to the
    call) and compared with the level the document records. Fails when a recorded
    level is higher than the evidence supports, or when an imported record is
    inconsistent in itself. Files in an import that are not
    assay.provider_audit_record.v0 (or not *.json in a directory) are listed as
    skipped; a second copy of a record (same provider and record_id, or same
    content) counts once. Without --audit-import every call re-derives to asserted.

    Exit codes: 0 verified, 1 verification failed, 2 usage error or unreadable input
    (an unreadable surface document or audit file, an audit file that is not strict
    JSON, or two different records under one record_id: it fails, as verify-export
    fails it in a package, never passes as skipped).
    """
    from drawbridge.evidence.audit_import import (
        AuditImportError,
        describe_rejection,
        load_audit_records,
        parse_audit_file,
    )
    from drawbridge.evidence.side_effect_verify import SurfaceFormatError, verify_side_effects

    if more_imports and not audit_imports:
        raise click.UsageError("extra arguments after SURFACE_JSON: audit records go after --audit-import")
    surface_doc = read_surface(read_bytes(surface_json), _label(surface_json))
    files, not_read = audit_import_files((*audit_imports, *more_imports))
    items: list[tuple[str, Any]] = []
    for file in files:
        try:
            items.append((str(file), parse_audit_file(str(file), read_bytes(str(file)))))
        except AuditImportError as exc:
            raise InputError(f"{exc}: {AUDIT_IMPORT_FORMAT}") from None
    records, skipped = load_audit_records(items)
    skipped = sorted(skipped + not_read, key=lambda item: item["source"])
    try:
        report = verify_side_effects(surface_doc, records, bundle=_label(surface_json))
    except SurfaceFormatError as exc:
        raise InputError(f"{_label(surface_json)}: {exc}") from None
    except AuditImportError as exc:
        raise InputError(str(exc)) from None
    report = {**report, "audit_imports_skipped": skipped}
    ok = report["ok"] is True
    if output_format == "json":
        emit_json(report)
        _finish(ok)

    out = console()
    ceiling = report.get("weakest_occurrence_ceiling") or {}
    out.print(
        key_values(
            "Side effects",
            [
                ("surface", _label(surface_json)),
                ("calls", len(report["calls"])),
                ("audit records imported", report["audit_records_imported"]),
                ("promoted to verified", report["promoted"]),
                ("levels not reproduced", report["levels_not_reproduced"]),
                ("observed_confirmed, not credited", report["levels_not_credited"]),
                ("audit records rejected", report["audit_records_rejected"]),
                ("weakest occurrence ceiling", ceiling.get("ceiling", ceiling.get("state"))),
                ("result", verdict(ok)),
            ],
        )
    )
    call_rows = []
    for index, call in enumerate(report["calls"]):
        before, after = call.get("level_before"), call.get("level")
        overclaimed = before in SIDE_EFFECT_LEVELS and SIDE_EFFECT_LEVELS.index(before) > _rank(after)
        shown = f"{after} (recorded {before})"
        if "recorded_subject_digest" in call:
            overclaimed, shown = True, f"{after} (recorded digest {call['recorded_subject_digest']} is not the call's)"
        binding = describe_rejection(call.get("binding"))
        call_rows.append(
            (
                index,
                call.get("tool"),
                call.get("asserted"),
                before if before is not None else "(none recorded)",
                verdict(not overclaimed, str(after), shown),
                f"restates call {call['restates']}" if "restates" in call else binding,
            )
        )
    columns = ("#", "tool", "asserted", "level before", "level after", "binding")
    out.print(table("Decisions", columns, call_rows))
    record_rows = []
    for record in report["audit_records"]:
        if record.get("status") == "rejected":  # its own check failed: that is the reason, for every call
            reasons = [describe_rejection(record.get("check"))]
        elif record.get("status") == "duplicate":
            reasons = [f"the same record as {record.get('duplicate_of')}: counted once"]
        elif record.get("matched_call") is not None:
            # Its "matched call" says it all: the calls it was tried against before are no reason of
            # its, and listing them here would read as why it matched (the JSON keeps every attempt).
            reasons = []
        else:  # why it matched none: each call it was tried against, with what that attempt found
            reasons = [
                f"call {r.get('call')}: {describe_rejection(r.get('binding'))}"
                for r in record.get("rejections", [])
            ]
        status = str(record.get("status"))
        record_rows.append(
            (
                record.get("source"),
                record.get("record_id"),
                verdict(status != "rejected", status, status),
                record.get("matched_call"),
                "; ".join(reasons) or None,
            )
        )
    if record_rows:
        columns = ("source", "record_id", "status", "matched call", "reasons (not matched)")
        out.print(table("Audit records", columns, record_rows))
    if skipped:
        skipped_rows = ((s["source"], s["reason"]) for s in skipped)
        out.print(table("Skipped imports", ("source", "reason"), skipped_rows))
    _finish(ok)


# --------------------------------------------------------------------------- the trace and the auditor package

for _command in (*evidence_trace.COMMANDS, *evidence_export.COMMANDS):
    command.add_command(_command)
