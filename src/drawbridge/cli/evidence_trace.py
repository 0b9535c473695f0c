"""``drawbridge evidence verify-chain | keys | prove | verify-proof``: the trace, its signed checkpoints
and their keys, checked from files alone.

Invariant: a verdict is recomputed here from the bytes given, by the pure core
(``drawbridge.evidence.trace_audit``, ``tlog``); a verifier key found beside the trace is used but
reported as found there (an auditor pins it out of band: ``--vkey``). No private key is ever read by
a verifying command, nor printed by any.

Exit codes: 0 verified (``keys``, ``prove``: done); 1 verification failed, or the trace is incomplete
(lines no signature covers, a run not sealed); 2 usage error or unreadable input.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from drawbridge.cli.evidence_io import _finish, _label, parse_document, read_bytes, write_out
from drawbridge.cli.output import EXIT_FAILED, InputError, console, emit_json, format_option, key_values, plain, table, verdict
from drawbridge.evidence.chain import (
    ChainFormatError,
    ChainHead,
    checkpoint_bytes,
    make_checkpoint,
    parse_checkpoint,
    split_lines,
    verify_chain,
)
from drawbridge.evidence.signed_note import NoteVerifier
from drawbridge.evidence.trace_audit import HeldCheckpoint, audit_trace
from drawbridge.state.checkpoint_files import (
    CHECKPOINT_FILE,
    CHECKPOINTS_FILE,
    CheckpointFileError,
    parse_checkpoint_lines,
)
from drawbridge.state.signing_keys import CHECKPOINT_VKEY, KEYS_DIR, KeyFileError, read_vkey


def load_vkey(path: str) -> NoteVerifier:
    try:
        return read_vkey(path)
    except KeyFileError as exc:
        raise InputError(str(exc)) from None


def read_held(path: str) -> HeldCheckpoint:
    """A checkpoint held elsewhere: the signed note as served (``GET /evidence/checkpoint``), or one
    line of ``checkpoints.ndjson``."""
    data = read_bytes(path)
    if data.lstrip().startswith(b"{"):
        document = parse_document(data, _label(path))
        if not isinstance(document, dict) or not isinstance(document.get("note"), str):
            raise InputError(f'{_label(path)}: a JSON checkpoint is {{"tree_size": N, "note": "..."}}')
        return HeldCheckpoint(_label(path), document["note"])
    try:
        return HeldCheckpoint(_label(path), data.decode("utf-8"))
    except UnicodeDecodeError:
        raise InputError(f"{_label(path)}: not UTF-8 text") from None


def beside(trace_file: str, name: str) -> Path | None:
    if trace_file == "-":
        return None
    path = Path(trace_file).parent / name
    return path if path.is_file() else None


def audit_inputs(
    trace_file: str, checkpoint: str | None, history_file: str | None, vkey: str | None
) -> tuple[NoteVerifier | None, str | None, HeldCheckpoint | None, list[HeldCheckpoint]]:
    """The verifier (and where it came from), the latest checkpoint and the history, given or beside the trace."""
    vkey_source = None
    verifier = None
    found_vkey = beside(trace_file, f"{KEYS_DIR}/{CHECKPOINT_VKEY}")
    if vkey is not None:
        verifier, vkey_source = load_vkey(vkey), vkey
    elif found_vkey is not None:
        verifier, vkey_source = load_vkey(str(found_vkey)), f"{found_vkey} (found beside the trace: pin it elsewhere)"
    latest_path = checkpoint if checkpoint is not None else beside(trace_file, CHECKPOINT_FILE)
    latest = read_held(str(latest_path)) if latest_path is not None else None
    history_path = history_file if history_file is not None else beside(trace_file, CHECKPOINTS_FILE)
    history: list[HeldCheckpoint] = []
    if history_path is not None:
        label = str(history_path)
        try:
            stored = parse_checkpoint_lines(read_bytes(label), label)
        except CheckpointFileError as exc:
            raise InputError(str(exc)) from None
        history = [HeldCheckpoint(f"{label} line {item.line}", item.note, item.tree_size) for item in stored]
    return verifier, vkey_source, latest, history


@click.command(name="verify-chain")
@click.argument("trace_file", metavar="TRACE_FILE")
@click.option(
    "--known-checkpoint",
    "known_files",
    multiple=True,
    metavar="FILE",
    help="A signed checkpoint held elsewhere (as GET /evidence/checkpoint serves it, or a line of "
    "checkpoints.ndjson): the trace must hold it and the log's latest checkpoint must be consistent with it "
    "(RFC 6962 consistency proof), else 'cut tail / rollback'. Repeatable.",
)
@click.option("--vkey", metavar="FILE", help="The log's verifier key (default: keys/checkpoint.vkey beside the trace).")
@click.option("--checkpoint", metavar="FILE", help="The log's latest signed checkpoint (default: checkpoint beside the trace).")
@click.option("--checkpoints", "history_file", metavar="FILE", help="Every checkpoint the log signed (default: checkpoints.ndjson beside the trace).")
@click.option(
    "--expected-head",
    "checkpoint_file",
    metavar="CHECKPOINT_JSON",
    help="An unsigned drawbridge.trace_checkpoint.v0 file: the log must reach its seq with its entry_hash.",
)
@format_option
def verify_chain_cmd(
    trace_file: str,
    known_files: tuple[str, ...],
    vkey: str | None,
    checkpoint: str | None,
    history_file: str | None,
    checkpoint_file: str | None,
    output_format: str,
) -> None:
    """Verify a hash-chained trace log and its signed checkpoints.

    Every entry's hash is recomputed and every link checked (the first changed, missing, reordered or
    duplicated entry is named by line and seq). Then the log's signed checkpoints (C2SP signed notes
    over the RFC 6962 tree of the lines) are checked under the verifier key: their signatures, that the
    trace holds what they sign, and that every run of the trace is sealed (its run_end entry and a
    checkpoint covering it). Lines after the last checkpoint are reported as not covered by a signature;
    a run without run_end and a final checkpoint as incomplete. With --known-checkpoint, a trace shorter
    than, or inconsistent with, a checkpoint held elsewhere is a cut tail or a rollback. Without any
    checkpoint, a log whose last entries were cut off still verifies. See docs/trace-chain.md.

    Exit codes: 0 verified, 1 verification failed or incomplete, 2 usage error or unreadable input.
    """
    expected = None
    if checkpoint_file is not None:
        try:
            expected = parse_checkpoint(parse_document(read_bytes(checkpoint_file), _label(checkpoint_file)))
        except ChainFormatError as exc:
            raise InputError(f"{_label(checkpoint_file)}: {exc}") from None
    lines = split_lines(read_bytes(trace_file))
    verifier, vkey_source, latest, history = audit_inputs(trace_file, checkpoint, history_file, vkey)
    known = [read_held(path) for path in known_files]
    audit = audit_trace(lines, verifier, latest, history, known, expected_head=expected)
    result = audit.to_dict()
    result["vkey_source"] = vkey_source
    if expected is not None:
        result["expected_head"] = {"seq": expected.seq, "entry_hash": expected.entry_hash}
    ok = audit.ok
    if output_format == "json":
        emit_json(result)
        _finish(ok)
    _print_audit(trace_file, result, expected)
    _finish(ok)


def _print_audit(trace_file: str, result: dict[str, Any], expected: ChainHead | None) -> None:
    chain = result
    head = chain["head"] or {}
    pairs: list[tuple[str, Any]] = [
        ("trace", _label(trace_file)),
        ("entries verified", chain["entries"]),
        ("head seq", head.get("seq")),
        ("head entry_hash", head.get("entry_hash")),
    ]
    if expected is not None:
        pairs.append(("unsigned checkpoint", f"seq {expected.seq} {expected.entry_hash}"))
    signed = result["checkpoint"]
    if signed is not None:
        pairs.append(("signed checkpoint", f"{signed['origin']} size {signed['tree_size']} root {signed['root']}"))
    pairs.append(("verifier key", result.get("vkey_source") or "none"))
    if chain["first_problem"] is not None:
        problem = chain["first_problem"]
        pairs += [("problem", problem["code"]), ("at line", problem["line"]), ("seq", problem["seq"]),
                  ("detail", problem["message"])]
    status = result["status"]
    pairs.append(("result", verdict(result["ok"], "VERIFIED", "FAILED" if status == "failed" else "INCOMPLETE")))
    out = console()
    out.print(key_values("Trace chain", pairs))
    if result["runs"]:
        rows = ((r["run_id"], r["first_index"], r["last_index"], verdict(r["state"] == "sealed", r["state"], r["state"]))
                for r in result["runs"])
        out.print(table("Runs", ("run", "first line", "last line", "state"), rows))
    if result["known_checkpoints"]:
        rows = ((k["source"], k.get("tree_size"), verdict(k["ok"], k.get("finding"), k.get("finding")))
                for k in result["known_checkpoints"])
        out.print(table("Checkpoints held elsewhere", ("source", "size", "finding"), rows))
    if result["problems"]:
        out.print(table("Problems", ("code", "detail"), ((p["code"], p["message"]) for p in result["problems"])))
    out.print(plain("Not claimed: " + ", ".join(result["claims_not_made"])))


@click.command(name="keys")
@click.option("--evidence-dir", type=click.Path(file_okay=False), help="The gateway's evidence directory (its keys/).")
@click.option("--keys-dir", type=click.Path(file_okay=False), help="The keys directory itself.")
@click.option("--init", is_flag=True, help="Make the keys now if the directory holds none (else they are made at first start).")
@click.option("--origin", help="With --init: the log's origin (default drawbridge.local/<random hex>).")
@format_option
def keys_cmd(evidence_dir: str | None, keys_dir: str | None, init: bool, origin: str | None, output_format: str) -> None:
    """Print the public keys auditors pin: the checkpoint verifier key (C2SP vkey, naming the origin) and the
    attestation key (Ed25519 SubjectPublicKeyInfo PEM, DSSE key id). Private keys are never printed.

    Exit codes: 0 done, 2 no keys there, or a key file that cannot be read or trusted.
    """
    from drawbridge.state.signing_keys import ATTESTATION_PUB, dsse_keyid, open_keys, read_public_pem

    if (evidence_dir is None) == (keys_dir is None):
        raise click.UsageError("give one of --evidence-dir or --keys-dir"
                               + (", not both" if keys_dir is not None else ""))
    directory = Path(keys_dir) if keys_dir is not None else Path(evidence_dir or ".") / KEYS_DIR
    if origin is not None and not init:
        raise click.UsageError("--origin goes with --init")
    try:
        if init:
            open_keys(directory, origin)
        verifier = read_vkey(directory / CHECKPOINT_VKEY)
        public = read_public_pem(directory / ATTESTATION_PUB)
    except KeyFileError as exc:
        raise InputError(str(exc)) from None
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    report = {
        "origin": verifier.name,
        "checkpoint_vkey": verifier.vkey,
        "attestation_keyid": dsse_keyid(public),
        "attestation_public_key_pem": public.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode("ascii"),
    }
    if output_format == "json":
        emit_json(report)
        return
    click.echo(f"origin:            {report['origin']}")
    click.echo(f"checkpoint vkey:   {report['checkpoint_vkey']}")
    click.echo(f"attestation keyid: {report['attestation_keyid']}")
    click.echo(report["attestation_public_key_pem"], nl=False)


@click.command(name="prove")
@click.option("--evidence-dir", required=True, type=click.Path(file_okay=False), help="The gateway's evidence directory.")
@click.argument("index", type=click.IntRange(min=0))
@click.option("--out", type=click.Path(dir_okay=False), help="Write the proof here (default: standard output).")
def prove_cmd(evidence_dir: str, index: int, out: str | None) -> None:
    """Write the C2SP tlog-proof of trace line INDEX (0-based, its seq) in the latest signed checkpoint:
    one record, provable without the others (verify-proof checks it).

    Exit codes: 0 done, 2 no checkpoint covers INDEX, or unreadable input.
    """
    from drawbridge.evidence.tlog import CheckpointError, make_tlog_proof, open_checkpoint, tree_of_lines

    directory = Path(evidence_dir)
    verifier = load_vkey(str(directory / KEYS_DIR / CHECKPOINT_VKEY))
    note = read_held(str(directory / CHECKPOINT_FILE)).note
    try:
        checkpoint = open_checkpoint(note, verifier)
    except CheckpointError as exc:
        raise InputError(f"{directory / CHECKPOINT_FILE}: {exc}") from None
    lines = [line for line in split_lines(read_bytes(str(directory / "trace.ndjson"))) if line.endswith(b"\n")]
    if index >= checkpoint.size or checkpoint.size > len(lines):
        raise InputError(f"the latest checkpoint signs {checkpoint.size} lines of {len(lines)}: it does not cover line {index}")
    text = make_tlog_proof(tree_of_lines(lines[: checkpoint.size]), index, note, checkpoint.size).text
    if out is None:
        sys.stdout.write(text)
    else:
        write_out(out, text.encode("utf-8"))


@click.command(name="verify-proof")
@click.argument("proof_file", metavar="PROOF")
@click.argument("line_file", metavar="LINE_FILE")
@click.option("--vkey", required=True, metavar="FILE", help="The log's verifier key.")
@format_option
def verify_proof_cmd(proof_file: str, line_file: str, vkey: str, output_format: str) -> None:
    """Check that the trace line in LINE_FILE is the leaf a tlog-proof names, in a checkpoint signed by VKEY.

    Exit codes: 0 verified, 1 the proof does not verify, 2 usage error or unreadable input.
    """
    from drawbridge.evidence.tlog import CheckpointError, parse_tlog_proof, verify_tlog_proof

    verifier = load_vkey(vkey)
    try:
        proof = parse_tlog_proof(read_bytes(proof_file).decode("utf-8"))
    except (CheckpointError, UnicodeDecodeError) as exc:
        raise InputError(f"{_label(proof_file)}: {exc}") from None
    line = read_bytes(line_file)
    if line.count(b"\n") > 1 or (b"\n" in line and not line.endswith(b"\n")):
        raise InputError(f"{_label(line_file)}: holds more than one line")
    report: dict[str, Any] = {"index": proof.index}
    try:
        checkpoint = verify_tlog_proof(proof, line, verifier)
        report.update(ok=True, origin=checkpoint.origin, tree_size=checkpoint.size)
    except CheckpointError as exc:
        report.update(ok=False, problem=str(exc))
    if output_format == "json":
        emit_json(report)
    else:
        pairs = [(key.replace("_", " "), value) for key, value in report.items() if key != "ok"]
        console().print(key_values("tlog-proof", [*pairs, ("result", verdict(report["ok"]))]))
    _finish(report["ok"])


@click.command(name="checkpoint")
@click.argument("trace_file", metavar="TRACE")
@click.option("--out", "out_file", metavar="FILE", help="Write the head here (default: stdout).")
def checkpoint_cmd(trace_file: str, out_file: str | None) -> None:
    """Write the unsigned head of TRACE (drawbridge.trace_checkpoint.v0) that verify-chain --expected-head
    takes: keep it elsewhere, and a later cut or rewrite at or before its seq is found.

    The chain is verified first: no head is written for a chain that does not verify (exit 1).
    """
    lines = split_lines(read_bytes(trace_file))
    report = verify_chain(lines)
    if not report.ok or report.head is None:
        problem = report.first_problem
        why = f"{problem.code} at line {problem.line}" if problem is not None else "the trace is empty"
        click.echo(f"drawbridge: {_label(trace_file)}: no head written: {why}", err=True)
        sys.exit(EXIT_FAILED)
    at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    data = checkpoint_bytes(make_checkpoint(report.head, at))
    if out_file is None:
        sys.stdout.buffer.write(data)
    else:
        write_out(out_file, data)


COMMANDS = (verify_chain_cmd, keys_cmd, prove_cmd, verify_proof_cmd, checkpoint_cmd)

__all__ = ["COMMANDS", "audit_inputs", "checkpoint_cmd", "keys_cmd", "prove_cmd", "read_held", "verify_chain_cmd", "verify_proof_cmd"]
