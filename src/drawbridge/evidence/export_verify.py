"""What ``drawbridge evidence verify-export`` checks in an auditor package: every row of
auditor-evidence.md table 6.8, recomputed from the package's bytes.

Invariant: the report is ``ok`` only when every check holds: the package's files are exactly those
its DSSE attestation names, with those digests; the bundle passes Assay's integrity rules and its own
attestation (ADR-044); carriers and recipe rows cohere; no side effect is recorded above what its
evidence supports; the trace's chain, its signed checkpoint (which covers every line) and every
checkpoint held elsewhere agree; the run is sealed; the bundle's checkpoint event is exactly the
package's checkpoint (its fields recomputed from the note) and covers the run, as the export
statement's predicate says; every bundle event is
named by the run's trace lines and every record they name is in the bundle, in order, each at the
time (``at``) of the trace line that names it and with the source of the log's origin; the package
holds exactly one tlog-proof for each trace line of the run that names a bundled record (no other), in
the package's checkpoint, and each verifies. Changing any byte of any file fails at least one check.
A file the layout requires (``REQUIRED``) that is absent fails every check that reads it, as "<name> is
missing" (the CLI refuses such a directory as unreadable before any check); a check that needs the
verified bundle fails when the bundle does not verify, never passes on no events.

Keys: the checkpoint verifier key and the attestation key are the auditor's (pinned out of band)
when given; otherwise the package's own ``keys/``, which proves only that the package is consistent
with itself (``signer_identity`` is then listed among the claims not made).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from drawbridge.canonical import CanonicalizationError, parse_json
from drawbridge.evidence.bundle import BundleError, VerifiedBundle, autosi_time, verify_bundle
from drawbridge.evidence.chain import split_lines
from drawbridge.evidence.dsse import (
    EXPORT_PREDICATE,
    envelope_bytes_are_canonical,
    keyid,
    open_envelope,
    verify_bundle_attestation,
)
from drawbridge.evidence.export_package import (
    CHECKPOINT_EVENT,
    NAMED_TYPES,
    RECIPE_ROW_TYPE,
    checkpoint_event_data,
    named_records,
    source_of,
)
from drawbridge.evidence.observed_read import confirmations, is_confirmation
from drawbridge.evidence.runs import runs_of
from drawbridge.evidence.audit_import import describe_rejection, package_audit_record
from drawbridge.evidence.side_effect_verify import SurfaceFormatError, verify_side_effects
from drawbridge.evidence.signed_note import NoteVerifier
from drawbridge.evidence.tlog import CheckpointError, open_checkpoint, parse_tlog_proof, verify_tlog_proof
from drawbridge.evidence.trace_audit import HeldCheckpoint, audit_trace
from drawbridge.evidence.truth.carrier import SCHEMA as CARRIER_SCHEMA
from drawbridge.evidence.truth.vectors import verify_carriers
from drawbridge.evidence.vocabulary import SURFACE_SCHEMA

REPORT_SCHEMA: Final = "drawbridge.export_verify.report.v0"
BUNDLE: Final = "bundle.tar.gz"
BUNDLE_ATTESTATION: Final = "bundle.tar.gz.intoto.json"
EXPORT_ATTESTATION: Final = "export.intoto.json"
TRACE: Final = "trace/trace.ndjson"
CHECKPOINT: Final = "trace/checkpoint"
CHECKPOINTS: Final = "trace/checkpoints.ndjson"
PROOFS: Final = "trace/proofs/"
AUDIT_IMPORT: Final = "audit-import/"
VKEY: Final = "keys/checkpoint.vkey"
ATTESTATION_PUB: Final = "keys/attestation.pub.pem"
REQUIRED: Final = (BUNDLE, BUNDLE_ATTESTATION, EXPORT_ATTESTATION, TRACE, CHECKPOINT, CHECKPOINTS, VKEY,
                   ATTESTATION_PUB)
"""The files every package holds (auditor-package.md, Layout); ``audit-import/`` and the proofs vary."""
CLAIMS_NOT_MADE: Final = (
    "completeness_after_last_external_checkpoint",
    "provider_side_persistence",
    "policy_correctness",
    "key_not_compromised",
)


class _Checks:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add(self, check_id: str, ok: bool, detail: str) -> bool:
        self.rows.append({"id": check_id, "ok": ok, "detail": detail})
        return ok

    def run(self, check_id: str, body: Callable[[], str]) -> bool:
        try:
            return self.add(check_id, True, body())
        except (ValueError, KeyError, TypeError) as exc:
            return self.add(check_id, False, str(exc) or type(exc).__name__)


def missing(files: Mapping[str, bytes]) -> list[str]:
    """The files of ``REQUIRED`` that the package lacks."""
    return [name for name in REQUIRED if name not in files]


def _file(files: Mapping[str, bytes], name: str) -> bytes:
    try:
        return files[name]
    except KeyError:
        raise ValueError(f"{name} is missing") from None


def _json(data: bytes, what: str) -> Any:
    try:
        return parse_json(data)
    except (CanonicalizationError, UnicodeDecodeError):
        raise ValueError(f"{what} is not JSON") from None


def verify_export(
    files: Mapping[str, bytes],
    *,
    vkey: NoteVerifier,
    attestation_key: Ed25519PublicKey,
    keys_pinned: bool,
    known: Sequence[HeldCheckpoint] = (),
) -> dict[str, Any]:
    """The verify-export report of a package given as ``{relative path: bytes}`` (module docstring)."""
    checks = _Checks()
    predicate: list[Any] = []  # the export statement's predicate, once its envelope verifies

    def attested() -> str:
        envelope = _file(files, EXPORT_ATTESTATION)
        if not envelope_bytes_are_canonical(envelope):
            raise ValueError(f"{EXPORT_ATTESTATION} is not in its one written form (one signature, pretty JSON)")
        statement = open_envelope(envelope, attestation_key)
        if _json(envelope, EXPORT_ATTESTATION)["signatures"][0]["keyid"] != keyid(attestation_key):
            raise ValueError("the export statement's key id is not the trusted key's")
        if statement.get("predicateType") != EXPORT_PREDICATE:
            raise ValueError(f"the export statement's predicate type is not {EXPORT_PREDICATE}")
        predicate.append(statement.get("predicate"))
        subjects = statement.get("subject")
        if not isinstance(subjects, list):
            raise ValueError("the export statement has no subjects")
        named = {}
        for subject in subjects:
            digest = subject.get("digest") if isinstance(subject, dict) else None
            if not isinstance(digest, dict) or set(digest) != {"sha256"} or not isinstance(subject.get("name"), str):
                raise ValueError("a subject is not {name, digest: {sha256}}")
            named[subject["name"]] = digest["sha256"]
        present = set(files) - {EXPORT_ATTESTATION}
        if set(named) != present:
            extra, lacking = sorted(present - set(named)), sorted(set(named) - present)
            raise ValueError(f"files not attested: {extra}; attested but absent: {lacking}")
        for name, digest in sorted(named.items()):
            if hashlib.sha256(files[name]).hexdigest() != digest:
                raise ValueError(f"{name} is not the file the statement attests (sha256 differs)")
        return f"{len(named)} files, each with the attested sha256"

    checks.run("export_attestation", attested)
    bundle: VerifiedBundle | None = None

    def bundle_verified() -> str:
        nonlocal bundle
        bundle = verify_bundle(_file(files, BUNDLE))
        return f"{len(bundle.events)} events, run_root {bundle.manifest['run_root']}"

    checks.run("bundle_integrity", bundle_verified)

    def bundle_attested() -> str:
        verify_bundle_attestation(_file(files, BUNDLE_ATTESTATION), attestation_key, _file(files, BUNDLE))
        return "evidence-bundle/v1 statement over the archive's sha256 (ADR-044)"

    checks.run("bundle_attestation", bundle_attested)
    events = bundle.events if bundle is not None else []
    by_type: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        by_type.setdefault(event["type"], []).append(event)

    def truth() -> str:
        _needs(bundle)
        carriers = [e["data"] for e in by_type.get(CARRIER_SCHEMA, [])]
        rows = [e["data"] for e in by_type.get(RECIPE_ROW_TYPE, [])]
        if not carriers and not rows:
            return "no truth carriers in this run"
        report = verify_carriers(carriers, rows)
        if not report["ok"] or len(rows) != len(carriers):
            failed = [c["id"] for c in report["checks"] if not c["ok"]]
            raise ValueError(f"carriers and recipe rows do not cohere: {failed or 'a carrier without its row'}")
        return f"{len(carriers)} carriers, each cited by a verified recipe row"

    checks.run("tool_decision_truth", truth)

    def side_effects() -> str:
        _needs(bundle)
        decisions = [d for e in by_type.get(SURFACE_SCHEMA, []) for d in e["data"].get("observed_tool_decisions", [])]
        document = {"schema": SURFACE_SCHEMA, "observed_tool_decisions": decisions, "non_claims": []}
        records = [(name, package_audit_record(name, data)) for name, data in sorted(files.items())
                   if name.startswith(AUDIT_IMPORT)]
        try:
            report = verify_side_effects(document, records, bundle=BUNDLE)
        except SurfaceFormatError as exc:
            raise ValueError(str(exc)) from None
        if not report["ok"]:
            reasons = [f"{row['source']}: {describe_rejection(row['check'])}" for row in report["audit_records"]
                       if row["status"] == "rejected"]
            if report["levels_not_reproduced"]:
                reasons.append(f"{report['levels_not_reproduced']} side effect(s) recorded above their evidence "
                               "(or with a verification_subject_digest that is not their call's)")
            raise ValueError("; ".join(reasons))
        restated = sum(1 for row in report["calls"] if "restates" in row)  # a confirmation is its write
        copies = sum(1 for row in report["audit_records"] if row["status"] == "duplicate")
        counted = f"{len(decisions) - restated} decisions"
        if restated:
            counted += f" (and {restated} observed_confirmed restatement(s) of them)"
        counted += f", {report['promoted']} verified through {report['audit_records_imported']} audit record(s)"
        return counted + (f" ({copies} more file(s) a copy of one, counted once)" if copies else "")

    checks.run("side_effects", side_effects)
    _trace_checks(files, checks, events, bundle, vkey, known, predicate)
    claims = list(CLAIMS_NOT_MADE) + ([] if keys_pinned else ["signer_identity"])
    ok = all(row["ok"] for row in checks.rows)
    run_id = bundle.manifest["run_id"] if bundle is not None else None
    return {"schema": REPORT_SCHEMA, "ok": ok, "run_id": run_id, "keys": "pinned" if keys_pinned else "package",
            "checks": checks.rows, "claims_not_made": claims}


def _needs(bundle: VerifiedBundle | None) -> VerifiedBundle:
    if bundle is None:
        raise ValueError("the bundle does not verify (bundle_integrity): there is nothing to check")
    return bundle


def _trace_checks(
    files: Mapping[str, bytes],
    checks: _Checks,
    events: list[dict[str, Any]],
    bundle: VerifiedBundle | None,
    vkey: NoteVerifier,
    known: Sequence[HeldCheckpoint],
    predicate: Sequence[Any],
) -> None:
    """``predicate``: the export statement's predicate once its envelope verified (empty when it did not,
    which fails the attestation check on its own); a statement that states none is no statement of this
    package."""
    lines = split_lines(files.get(TRACE, b""))
    latest = HeldCheckpoint(CHECKPOINT, files[CHECKPOINT].decode("utf-8", "replace")) if CHECKPOINT in files else None
    history: list[HeldCheckpoint] = []
    unreadable = []
    for number, raw in enumerate(files.get(CHECKPOINTS, b"").split(b"\n"), start=1):
        if raw:
            try:
                value = parse_json(raw)
            except (CanonicalizationError, UnicodeDecodeError):
                value = None
            note = value.get("note") if isinstance(value, dict) else None
            size = value.get("tree_size") if isinstance(value, dict) else None
            if not isinstance(note, str) or set(value) != {"tree_size", "note"} or type(size) is not int:
                unreadable.append(f"{CHECKPOINTS} line {number} is not {{tree_size, note}}")
                continue
            history.append(HeldCheckpoint(f"{CHECKPOINTS} line {number}", note, size))
    audit = audit_trace(lines, vkey, latest, history, known)
    codes: dict[str, list[str]] = {}
    for problem in audit.problems:
        codes.setdefault(problem["code"], []).append(problem["message"])

    def failing(*names: str) -> list[str]:
        return [message for name in names for message in codes.get(name, [])]

    chain = failing("chain")
    checks.add("trace_chain", not chain, "; ".join(chain) or f"{audit.chain['entries']} entries, hash-linked")
    signed = failing("checkpoint_signature", "checkpoint_root_mismatch", "checkpoint_history", "cut_tail",
                     "origin_mismatch", "not_covered") + unreadable
    if latest is None:
        signed.append(f"{CHECKPOINT} is missing")
    checks.add("checkpoint", not signed, "; ".join(signed) or f"signed by {vkey.name} over all {audit.lines} lines")
    if known:
        bad = [row for row in audit.known if not row["ok"]]
        detail = "; ".join(f"{row['source']}: {row.get('finding')}" for row in bad)
        checks.add("known_checkpoints", not bad, detail or f"{len(known)} held elsewhere, each a prefix of the log")
    run_id = bundle.manifest["run_id"] if bundle is not None else None
    run = next((r for r in runs_of([line for line in lines if line.endswith(b"\n")]) if r.run_id == run_id), None)
    if bundle is None:
        checks.add("run_sealed", False, "the bundle does not verify (bundle_integrity): it names no run to find")
    elif run is None:
        checks.add("run_sealed", False, f"the trace holds no run {run_id}")
    else:
        why = run.unsealed_because(audit.checkpoint["tree_size"] if audit.checkpoint else None)
        checks.add("run_sealed", why is None, f"run {run_id}: " + (why or "run_end and a covering checkpoint"))

    def checkpoint_event() -> str:
        if not events or events[-1]["type"] != CHECKPOINT_EVENT:
            raise ValueError("the bundle's last event is not its checkpoint")
        data = events[-1]["data"]
        if latest is None or data.get("note") != latest.note:
            raise ValueError("the bundle's checkpoint is not the package's trace/checkpoint")
        signed_tree = open_checkpoint(data["note"], vkey)
        if run is None or data.get("covers") != {"first_index": run.start_index, "last_index": run.last_index}:
            raise ValueError("the bundle's checkpoint does not cover the run's lines in the trace")
        expected = checkpoint_event_data(signed_tree, latest.note, run)
        if data != expected:
            differ = sorted(key for key in set(data) | set(expected) if data.get(key) != expected.get(key))
            raise ValueError(f"the checkpoint event is not its note's checkpoint: {differ} differ (schema, origin, "
                             "tree_size, root_hash, note, covers, and nothing else)")
        if events[-1].get("source") != source_of(signed_tree.origin):
            raise ValueError(f"the checkpoint event's source is not {source_of(signed_tree.origin)}")
        stated = {"run_id": run.run_id, "origin": signed_tree.origin, "bundle_id": bundle.manifest["bundle_id"],
                  "tree_size": signed_tree.size, "covers": expected["covers"]} if bundle is not None else None
        if predicate and predicate[0] != stated:
            raise ValueError("the export statement's predicate is not this package's {run_id, origin, bundle_id, "
                             "tree_size, covers}")
        return f"covers lines {run.start_index}..{run.last_index} of a tree of {signed_tree.size}"

    checks.run("bundle_checkpoint", checkpoint_event)

    def binding() -> str:
        if run is None:
            raise ValueError("no run to bind")
        complete = [line for line in lines if line.endswith(b"\n")]
        records = named_records(complete, run)
        named = [(kind, digest) for _index, _at, kind, digest in records]
        recorded = [e for e in events if e["type"] in NAMED_TYPES and not is_confirmation(e["data"])]
        bundled = [(e["type"], e["assaycontenthash"]) for e in recorded]
        if named != bundled:
            unbundled, unnamed = Counter(named) - Counter(bundled), Counter(bundled) - Counter(named)
            if unbundled or unnamed:
                raise ValueError(f"{unnamed.total()} bundle event(s) no trace line names; {unbundled.total()} named "
                                 "record(s) not in the bundle")
            first = next(i for i, (n, b) in enumerate(zip(named, bundled, strict=True)) if n != b)
            raise ValueError(f"the bundle's records are out of order: its record {first} is not the one the trace "
                             f"names there (line {records[first][0]})")
        others = {e["type"] for e in events if e["type"] not in NAMED_TYPES} - {RECIPE_ROW_TYPE, CHECKPOINT_EVENT}
        if others:
            raise ValueError(f"the bundle holds events of unknown types {sorted(others)}")
        for (index, at, _kind, _digest), event in zip(records, recorded, strict=True):
            if event.get("time") != autosi_time(at):
                raise ValueError(f"bundle event {event.get('assayseq')}: its time is not the `at` of trace line {index}")
        carrier_times = [e.get("time") for e in recorded if e["type"] == CARRIER_SCHEMA]
        row_times = [e.get("time") for e in events if e["type"] == RECIPE_ROW_TYPE]
        if any(row != carrier for row, carrier in zip(row_times, carrier_times, strict=False)):
            raise ValueError("a recipe row's time is not its carrier's")
        source = source_of(vkey.name)
        foreign = [e.get("assayseq") for e in events if e.get("source") != source]
        if foreign:
            raise ValueError(f"bundle event(s) {foreign[:5]} do not have the source {source}")
        return f"{len(named)} records: each named by one trace line of the run, in order, at its time, and bundled"

    checks.run("trace_binding", binding)

    def observed() -> str:
        if run is None:
            raise ValueError("no run")
        complete = [line for line in lines if line.endswith(b"\n")]
        named = [(index, kind) for index, _at, kind, _digest in named_records(complete, run)]
        recorded = [e for e in events if e["type"] in NAMED_TYPES and not is_confirmation(e["data"])]
        writes = [(index, e["data"]) for (index, kind), e in zip(named, recorded, strict=False) if kind == SURFACE_SCHEMA]
        made = confirmations(complete, run, writes)
        expected = [record for _at, record in made]
        bundled = [e for e in events if e["type"] == SURFACE_SCHEMA and is_confirmation(e["data"])]
        found = [e["data"] for e in bundled]
        if found == expected and [e.get("time") for e in bundled] != [autosi_time(at) for at, _record in made]:
            raise ValueError("an observed_confirmed record's time is not the `at` of the read that confirms it")
        if found != expected:
            raise ValueError(f"the bundle's {len(found)} observed_confirmed record(s) are not the {len(expected)} the "
                             "trace's later reads of the same targets make (a later, allowed, successful read)")
        return f"{len(found)} write(s) confirmed by a later read of the same target in the run"

    checks.run("observed_confirmed", observed)

    def proofs() -> str:
        if run is None:
            raise ValueError("no run: the proofs the package must hold are not known")
        complete = [line for line in lines if line.endswith(b"\n")]
        wanted = {f"{PROOFS}{index}.tlog-proof" for index, _at, _kind, _digest in named_records(complete, run)}
        held = {name for name in files if name.startswith(PROOFS)}
        if held != wanted:
            lacking, extra = sorted(wanted - held, key=_proof_order), sorted(held - wanted, key=_proof_order)
            raise ValueError(f"the proofs are not one for each line of the run that names a bundled record: "
                             f"lacking {_few(lacking)}; not such a line {_few(extra)}")
        for name in sorted(wanted, key=_proof_order):
            try:
                proof = parse_tlog_proof(files[name].decode("utf-8"))
                if name != f"{PROOFS}{proof.index}.tlog-proof":
                    raise CheckpointError("it proves another line than its name says")
                if latest is None or proof.note != latest.note:
                    raise CheckpointError(f"its checkpoint is not the package's {CHECKPOINT}")
                verify_tlog_proof(proof, lines[proof.index], vkey)
            except (CheckpointError, UnicodeDecodeError) as exc:
                reason = "not UTF-8" if isinstance(exc, UnicodeDecodeError) else str(exc)
                raise ValueError(f"{name}: {reason}") from None
        return f"{len(wanted)} tlog-proofs, one for each line of the run naming a record, each to the signed root"

    checks.run("tlog_proofs", proofs)


def _proof_order(name: str) -> tuple[int, str]:
    index = name.removeprefix(PROOFS).removesuffix(".tlog-proof")
    return (int(index), name) if index.isdigit() else (-1, name)


def _few(names: Sequence[str]) -> str:
    if not names:
        return "none"
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


__all__ = ["CLAIMS_NOT_MADE", "REPORT_SCHEMA", "REQUIRED", "missing", "verify_export"]
