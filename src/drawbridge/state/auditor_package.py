"""The auditor package: one run's evidence, written to a directory an auditor can take away.

Invariant: a package is written only from an evidence directory whose trace verifies against its own
signed checkpoints (a cut or rewritten trace, or a checkpoint history edited or out of order, is
refused, never re-signed), with keys whose public files are their own and whose origin and key are
the log's (its latest checkpoint's, its ``run_start`` entries': refused as the gateway refuses them at
startup, a usage error naming both), into a directory that is
new or empty; it holds public material only (no private key, no raw argument), and every file is
named with its SHA-256 in ``export.intoto.json``, a DSSE envelope signed by the attestation key.

Layout (auditor-evidence.md 6.1)::

    bundle.tar.gz               Assay evidence bundle v1 of the run (``evidence.export_package``)
    bundle.tar.gz.intoto.json   DSSE, Assay's evidence-bundle/v1 statement over the archive
    audit-import/*.json         provider audit records, byte for byte as given
    trace/trace.ndjson          the trace up to the export's checkpoint (every run's lines: the tree needs them)
    trace/checkpoint            the checkpoint signed at export, covering every line
    trace/checkpoints.ndjson    every checkpoint of the log up to it
    trace/proofs/<i>.tlog-proof the inclusion of each trace line that names a bundled record
    keys/checkpoint.vkey        the log's verifier key (a hint: auditors pin theirs)
    keys/attestation.pub.pem    the attestation public key (a hint too)
    export.intoto.json          DSSE over every file above

At export a checkpoint is signed over every line of the trace (the latest one is reused when it
already covers them); it is kept in the evidence directory too (``checkpoint``,
``checkpoints.ndjson``) unless a running gateway holds those files, in which case the package alone
carries it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from drawbridge.canonical import CanonicalizationError, parse_json
from drawbridge.evidence.bundle import Producer, record_hash, write_bundle
from drawbridge.evidence.chain import split_lines
from drawbridge.evidence.dsse import bundle_statement, export_statement, sign_statement
from drawbridge.evidence.export_package import ExportError, ExportUsageError, named_records, run_events
from drawbridge.evidence.merkle import MerkleTree
from drawbridge.evidence.runs import runs_of
from drawbridge.evidence.tlog import Checkpoint, open_checkpoint, sign_checkpoint, trace_leaf
from drawbridge.evidence.trace_audit import HeldCheckpoint, audit_trace
from drawbridge.evidence.truth.carrier import SCHEMA as CARRIER_SCHEMA
from drawbridge.evidence.vocabulary import SURFACE_SCHEMA
from drawbridge.state.append_only import AppendOnlyError
from drawbridge.state.checkpoint_files import (
    CHECKPOINT_FILE,
    CHECKPOINTS_FILE,
    CheckpointFiles,
    checkpoint_line,
    log_origins,
    parse_checkpoint_lines,
)
from drawbridge.state.signing_keys import (
    ATTESTATION_PUB,
    CHECKPOINT_VKEY,
    KEYS_DIR,
    load_keys,
    refuse_other_key,
    refuse_other_origin,
)

TRACE_FILE = "trace.ndjson"
SURFACE_FILE = "tool-decisions.ndjson"


@dataclass(frozen=True)
class ExportSummary:
    run_id: str
    events: int
    surfaces: int
    carriers: int
    tree_size: int
    sealed: bool
    recorded_locally: bool
    files: int


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ExportError(f"cannot read {what} {path}: {exc.strerror}") from None


def _records(data: bytes, kind: str, label: str) -> dict[tuple[str, str], Any]:
    index: dict[tuple[str, str], Any] = {}
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not line:
            continue
        try:
            record = parse_json(line)
        except CanonicalizationError:
            raise ExportError(f"{label} line {number} is not JSON") from None
        digest = record_hash(kind, record)
        if digest is not None:
            index[(kind, digest)] = record
    return index


def _export_checkpoint(evidence: Path, keys: Any, lines: list[bytes], latest: str | None) -> tuple[str, Checkpoint, bool]:
    """The note covering every line (the latest when it does), and whether it was kept in ``evidence``."""
    tree = MerkleTree([trace_leaf(line) for line in lines])
    checkpoint = Checkpoint(keys.origin, len(lines), tree.root())
    if latest is not None and open_checkpoint(latest, keys.verifier) == checkpoint:
        return latest, checkpoint, True
    note = sign_checkpoint(checkpoint, keys.checkpoint)
    try:
        files = CheckpointFiles(evidence)
    except AppendOnlyError:  # a running gateway holds the checkpoint log: the package carries this one
        return note, checkpoint, False
    try:
        files.write(checkpoint.size, note)
    finally:
        files.close()
    return note, checkpoint, True


def build_package(
    evidence_dir: str | os.PathLike[str],
    *,
    run_id: str | None = None,
    carriers_file: str | os.PathLike[str] | None = None,
    audit_imports: Sequence[tuple[str, bytes]] = (),
    keys_dir: str | os.PathLike[str] | None = None,
) -> tuple[dict[str, bytes], ExportSummary]:
    """The package's files (relative path -> bytes) for one run (default: the last) of ``evidence_dir``."""
    from drawbridge import __version__

    evidence = Path(evidence_dir)
    keys_path = Path(keys_dir) if keys_dir is not None else evidence / KEYS_DIR
    keys = load_keys(keys_path)
    lines = [line for line in split_lines(_read(evidence / TRACE_FILE, "the trace")) if line.endswith(b"\n")]
    latest_path = evidence / CHECKPOINT_FILE
    latest_bytes = _read(latest_path, "the checkpoint") if latest_path.exists() else b""
    # The gateway's startup rule (trace-chain.md, Keys): a log keeps its origin and its key.
    refuse_other_origin(keys_path, keys.origin, log_origins(latest_bytes, evidence / TRACE_FILE))
    refuse_other_key(keys_path, keys, latest_bytes)
    latest = latest_bytes.decode("utf-8") if latest_path.exists() else None
    history_path = evidence / CHECKPOINTS_FILE
    stored = parse_checkpoint_lines(_read(history_path, "the checkpoint log"), str(history_path)) \
        if history_path.exists() else []
    held = [HeldCheckpoint(f"{CHECKPOINTS_FILE} line {s.line}", s.note, s.tree_size) for s in stored]
    audit = audit_trace(lines, keys.verifier, HeldCheckpoint(CHECKPOINT_FILE, latest) if latest else None, held)
    if audit.status == "failed":
        problems = "; ".join(p["message"] for p in audit.problems)
        raise ExportError(f"the trace does not verify against its own checkpoints, nothing is exported: {problems}")
    runs = runs_of(lines)
    run = next((r for r in runs if r.run_id == run_id), None) if run_id is not None else (runs[-1] if runs else None)
    if run is None:
        raise ExportUsageError(f"the trace holds no run {run_id}" if run_id else "the trace holds no run")
    records = _records(_read(evidence / SURFACE_FILE, "the surface records"), SURFACE_SCHEMA, SURFACE_FILE) \
        if (evidence / SURFACE_FILE).exists() else {}
    named = named_records(lines, run)
    if any(kind == CARRIER_SCHEMA for _i, _at, kind, _d in named):
        if carriers_file is None:
            raise ExportUsageError("the run's trace names truth carriers: give the carrier file (--carriers)")
        records.update(_records(_read(Path(carriers_file), "the carriers"), CARRIER_SCHEMA, str(carriers_file)))
    note, checkpoint, recorded = _export_checkpoint(evidence, keys, lines, latest)
    producer = Producer("drawbridge", __version__)
    built = run_events(lines, run, records, origin=keys.origin, producer=producer, checkpoint=checkpoint,
                       note=note, at=_now())
    bundle = write_bundle(built.events, producer)
    files: dict[str, bytes] = {
        "bundle.tar.gz": bundle.archive,
        "bundle.tar.gz.intoto.json": sign_statement(bundle_statement(bundle.archive), keys.attestation),
        "trace/trace.ndjson": b"".join(lines),
        "trace/checkpoint": note.encode("utf-8"),
        "keys/checkpoint.vkey": (keys.verifier.vkey + "\n").encode("ascii"),
        "keys/attestation.pub.pem": keys.attestation_public_pem,
    }
    # Each stored tree_size was checked against the size its note signs, in order, by audit_trace above.
    history = [checkpoint_line(s.tree_size, s.note) for s in stored if s.tree_size <= checkpoint.size]
    if not stored or stored[-1].note != note:
        history.append(checkpoint_line(checkpoint.size, note))
    files["trace/checkpoints.ndjson"] = b"".join(history)
    tree = MerkleTree([trace_leaf(line) for line in lines])
    from drawbridge.evidence.tlog import make_tlog_proof

    for index in sorted({i for i, _at, _kind, _digest in named}):
        files[f"trace/proofs/{index}.tlog-proof"] = make_tlog_proof(tree, index, note, checkpoint.size).text.encode()
    for name, data in audit_imports:
        files[f"audit-import/{name}"] = data
    predicate = {"run_id": run.run_id, "origin": keys.origin, "bundle_id": bundle.run_root,
                 "tree_size": checkpoint.size, "covers": {"first_index": run.start_index, "last_index": run.last_index}}
    files["export.intoto.json"] = sign_statement(export_statement(files, predicate), keys.attestation)
    sealed = run.sealed(checkpoint.size)
    summary = ExportSummary(run.run_id, len(built.events), built.surfaces, built.carriers, checkpoint.size, sealed,
                            recorded, len(files))
    return files, summary


def check_out_dir(out_dir: str | os.PathLike[str]) -> None:
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportUsageError(f"{out} exists and is not an empty directory: nothing is overwritten")


def write_package(out_dir: str | os.PathLike[str], files: dict[str, bytes]) -> None:
    """Write the files under ``out_dir``, which must not exist or be empty (nothing is overwritten)."""
    out = Path(out_dir)
    check_out_dir(out)
    for name, data in sorted(files.items()):
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "xb") as handle:
            handle.write(data)


__all__ = ["ATTESTATION_PUB", "CHECKPOINT_VKEY", "ExportSummary", "build_package", "check_out_dir", "write_package"]
