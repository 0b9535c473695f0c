"""The trace audited against its signed checkpoints and against checkpoints held elsewhere.

Invariant: the verdict is ``verified`` only when the chain verifies, the log's latest signed
checkpoint verifies under the pinned key, its root is the root of the trace's lines, it covers every
line, every run in the trace is sealed (``runs``), every line of the log's history
(``checkpoints.ndjson``) states the size its note signs and comes after the line before it (sizes
increase), and every checkpoint held elsewhere is a prefix of the signed log by an RFC 6962
consistency proof. Anything that shows tampering is ``failed`` (``cut_tail``, ``rollback``, a
signature or root that does not match, a history line that disagrees with its note or is out of
order, a history line larger than the latest checkpoint or a history without it (the latest was
replaced by an older one, or deleted: the writer puts ``checkpoint`` in place before the history line
that records it), a run whose ``run_start`` names another origin than the checkpoint's signer
(``origin_mismatch``: a gateway refuses keys of another origin, so only a re-signed trace holds one),
a run ended by another run's ``run_end`` (``spliced_run``), a broken chain); lines no signature
covers or a run without its end and final checkpoint are ``incomplete``. Neither is clean. When the
latest checkpoint does not match the trace, that is the finding: its lines and runs are not reported
again as merely uncovered.

Theory of operation. ``audit_trace`` takes the trace's bytes split into lines, the pinned verifier
key, the log's own checkpoints (the latest, and its history from ``checkpoints.ndjson``) and those an
auditor holds, and returns a plain report (``to_dict``). It builds the RFC 6962 tree over the lines
once; each checkpoint is opened (signature, origin = key name), its size compared with the number of
lines (a trace shorter than a signed tree had its tail cut), and its root with the tree's root at that
size. For a checkpoint held elsewhere of size ``m`` and the log's latest of size ``n >= m``, the
consistency proof ``m -> n`` is made from the lines and checked (RFC 9162) against the two signed
roots; the proof is in the report, for any other tool to check again.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from drawbridge.evidence.chain import ChainHead, verify_chain
from drawbridge.evidence.merkle import MerkleTree, verify_consistency
from drawbridge.evidence.runs import Run, runs_of
from drawbridge.evidence.signed_note import NoteVerifier
from drawbridge.evidence.tlog import Checkpoint, CheckpointError, open_checkpoint, trace_leaf

REPORT_SCHEMA: Final = "drawbridge.trace_audit.report.v0"
FAILING: Final = frozenset(
    {"chain", "checkpoint_signature", "checkpoint_root_mismatch", "checkpoint_history", "cut_tail", "rollback",
     "origin_mismatch", "spliced_run"}
)
"""Problem codes that show tampering (``failed``); the others leave the trace ``incomplete``."""
CLAIMS_NOT_MADE: Final = (
    "completeness_after_last_external_checkpoint",
    "key_not_compromised",
    "entries_truthful",
)


def b64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


@dataclass(frozen=True)
class HeldCheckpoint:
    """A signed checkpoint to check, and where it came from (a file name, ``checkpoints.ndjson line 3``);
    ``tree_size`` is the size a line of ``checkpoints.ndjson`` states beside its note (unsigned: checked)."""

    source: str
    note: str
    tree_size: int | None = None


@dataclass
class TraceAudit:
    lines: int
    chain: dict[str, Any]
    checkpoint: dict[str, Any] | None = None
    runs: list[dict[str, Any]] = field(default_factory=list)
    known: list[dict[str, Any]] = field(default_factory=list)
    problems: list[dict[str, Any]] = field(default_factory=list)

    def problem(self, code: str, message: str, **extra: Any) -> None:
        self.problems.append({"code": code, "message": message, **extra})

    @property
    def status(self) -> str:
        codes = {problem["code"] for problem in self.problems}
        if codes & FAILING:
            return "failed"
        return "incomplete" if codes else "verified"

    @property
    def ok(self) -> bool:
        return self.status == "verified"

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": REPORT_SCHEMA,
            "ok": self.ok,
            "status": self.status,
            "lines": self.lines,
            "chain_ok": self.chain["ok"],
            "entries": self.chain["entries"],
            "head": self.chain["head"],
            "first_problem": self.chain["first_problem"],
            "checkpoint": self.checkpoint,
            "runs": self.runs,
            "known_checkpoints": self.known,
            "problems": self.problems,
            "claims_not_made": list(CLAIMS_NOT_MADE),
        }


def _open(held: HeldCheckpoint, verifier: NoteVerifier, audit: TraceAudit) -> Checkpoint | None:
    try:
        return open_checkpoint(held.note, verifier)
    except CheckpointError as exc:
        audit.problem("checkpoint_signature", f"{held.source}: {exc}", source=held.source)
        return None


def _against_lines(checkpoint: Checkpoint, source: str, tree: MerkleTree, audit: TraceAudit) -> bool:
    """Whether the trace holds the signed tree: enough lines, and the same root at that size."""
    if checkpoint.size > tree.size:
        audit.problem(
            "cut_tail",
            f"cut tail: {source} signs {checkpoint.size} lines but the trace holds {tree.size}",
            source=source,
        )
        return False
    if tree.root(checkpoint.size) != checkpoint.root:
        audit.problem(
            "checkpoint_root_mismatch",
            f"{source}: the trace's first {checkpoint.size} lines do not have the signed root: they were "
            "changed after it was signed",
            source=source,
        )
        return False
    return True


def _known(
    held: HeldCheckpoint, verifier: NoteVerifier, latest: Checkpoint | None, tree: MerkleTree, audit: TraceAudit
) -> None:
    row: dict[str, Any] = {"source": held.source, "ok": False}
    audit.known.append(row)
    checkpoint = _open(held, verifier, audit)
    if checkpoint is None:
        row["finding"] = "unverified"
        return
    row.update(tree_size=checkpoint.size, root=b64(checkpoint.root))
    if checkpoint.size > tree.size:
        row["finding"] = "cut_tail"
        audit.problem(
            "cut_tail",
            f"cut tail / rollback: {held.source} (held elsewhere) signs {checkpoint.size} lines but the trace "
            f"holds {tree.size}",
            source=held.source,
        )
        return
    if checkpoint.size == 0:
        consistent = True  # the empty tree is a prefix of every tree (its root is checked below)
    elif latest is not None and latest.size >= checkpoint.size:
        proof = tree.consistency_proof(checkpoint.size, latest.size)
        row["consistency_proof"] = {"from": checkpoint.size, "to": latest.size, "hashes": [b64(h) for h in proof]}
        consistent = verify_consistency(checkpoint.size, latest.size, proof, checkpoint.root, latest.root)
    elif latest is not None:
        consistent = False
        audit.problem(
            "cut_tail",
            f"cut tail / rollback: the log's latest checkpoint signs {latest.size} lines, fewer than "
            f"{held.source} (held elsewhere, {checkpoint.size})",
            source=held.source,
        )
        row["finding"] = "cut_tail"
        return
    else:
        consistent = tree.root(checkpoint.size) == checkpoint.root
    if not consistent or tree.root(checkpoint.size) != checkpoint.root:
        row["finding"] = "rollback"
        audit.problem(
            "rollback",
            f"cut tail / rollback: the trace is not consistent with {held.source} (held elsewhere): "
            f"its first {checkpoint.size} lines were rewritten",
            source=held.source,
        )
        return
    row.update(finding="consistent", ok=True)


def _history(
    history: Sequence[HeldCheckpoint], verifier: NoteVerifier, tree: MerkleTree, audit: TraceAudit
) -> Checkpoint | None:
    """Each checkpoint of the log's history against the lines, its line's stated size against the size
    its note signs, and the order: the log signs in increasing sizes, so a line whose size does not
    exceed the one before was moved, repeated or edited. Returns the largest that opens."""
    previous: Checkpoint | None = None
    largest: Checkpoint | None = None
    for held in history:
        checkpoint = _open(held, verifier, audit)
        if checkpoint is None:
            continue
        _against_lines(checkpoint, held.source, tree, audit)
        if held.tree_size is not None and held.tree_size != checkpoint.size:
            audit.problem(
                "checkpoint_history",
                f"{held.source} states tree_size {held.tree_size} but its note signs {checkpoint.size}: the line "
                "was edited",
                source=held.source,
            )
        if previous is not None and checkpoint.size <= previous.size:
            audit.problem(
                "checkpoint_history",
                f"{held.source} (size {checkpoint.size}) comes after a checkpoint of size {previous.size}: the "
                "checkpoints are not in the order they were signed (lines moved or repeated)",
                source=held.source,
            )
        previous = checkpoint
        if largest is None or checkpoint.size > largest.size:
            largest = checkpoint
    return largest


def _latest_against_history(
    latest: HeldCheckpoint | None,
    checkpoint: Checkpoint | None,
    largest: Checkpoint | None,
    history_lines: int,
    audit: TraceAudit,
) -> bool:
    """The latest checkpoint is the last the log signed: the writer replaces ``checkpoint`` before it
    appends the history line, so a history line larger than it, or a history without it, is a latest
    checkpoint replaced by an older one or deleted."""
    if latest is None and history_lines:
        audit.problem(
            "checkpoint_history",
            f"the latest checkpoint is missing, but the log's history holds {history_lines} checkpoint(s): "
            "it was deleted",
        )
    elif latest is not None and checkpoint is not None and largest is not None and largest.size > checkpoint.size:
        # checkpoint is written before its history line: a larger history line is a later checkpoint
        audit.problem(
            "checkpoint_history",
            f"{latest.source} signs {checkpoint.size} lines, but the log's history holds a checkpoint of "
            f"{largest.size}: the latest checkpoint was replaced by an older one (rolled back)",
            source=latest.source,
        )
        return True
    return False


def _origins(runs: Sequence[Run], checkpoint: Checkpoint, source: str, audit: TraceAudit) -> None:
    """Every run was written under the origin that signs the log: a gateway refuses keys of another."""
    for run in runs:
        if run.origin != checkpoint.origin:
            audit.problem(
                "origin_mismatch",
                f"run {run.run_id} (line {run.start_index}) names origin {run.origin!r}, but {source} is signed "
                f"as origin {checkpoint.origin!r}: a log keeps its origin, so the trace was re-signed under "
                "another log's key",
                run_id=run.run_id,
            )


def audit_trace(
    lines: Sequence[bytes],
    verifier: NoteVerifier | None,
    latest: HeldCheckpoint | None = None,
    history: Sequence[HeldCheckpoint] = (),
    known: Sequence[HeldCheckpoint] = (),
    expected_head: ChainHead | None = None,
) -> TraceAudit:
    """Audit a trace given as its lines, each with its ``\\n`` (module docstring)."""
    report = verify_chain(lines, expected_head=expected_head)
    complete = [line for line in lines if line.endswith(b"\n")]
    audit = TraceAudit(lines=len(complete), chain=report.to_dict())
    if not report.ok:
        problem = report.first_problem
        assert problem is not None
        audit.problem("chain", f"{problem.code} at line {problem.line}: {problem.message}", line=problem.line)
    tree = MerkleTree([trace_leaf(line) for line in complete])
    signed_size = 0
    mismatched = False  # the latest checkpoint verifies but the trace does not hold what it signs
    rolled_back = False  # the latest checkpoint is older than one of the log's history: that is the finding
    latest_checkpoint: Checkpoint | None = None
    if (latest is not None or history or known) and verifier is None:
        audit.problem("checkpoint_signature", "no verifier key: the checkpoints cannot be checked")
    elif verifier is not None:
        if latest is not None:
            latest_checkpoint = _open(latest, verifier, audit)
        if latest_checkpoint is not None:
            audit.checkpoint = {
                "source": latest.source if latest else None,
                "origin": latest_checkpoint.origin,
                "tree_size": latest_checkpoint.size,
                "root": b64(latest_checkpoint.root),
                "key": verifier.vkey,
            }
            if _against_lines(latest_checkpoint, latest.source if latest else "checkpoint", tree, audit):
                signed_size = latest_checkpoint.size
            else:
                mismatched = True
        largest = _history(history, verifier, tree, audit)
        rolled_back = _latest_against_history(latest, latest_checkpoint, largest, len(history), audit)
        for held in known:
            _known(held, verifier, latest_checkpoint, tree, audit)
    if latest_checkpoint is None and not any(p["code"] == "checkpoint_signature" for p in audit.problems):
        if latest is None and verifier is not None and not history:
            audit.problem("not_covered", "no signed checkpoint: no line is covered by a signature")
    if signed_size < tree.size and latest_checkpoint is not None and not mismatched and not rolled_back:
        audit.problem(
            "not_covered",
            f"lines {signed_size}..{tree.size - 1} come after the last signed checkpoint: no signature covers them",
            first_index=signed_size,
            lines=tree.size - signed_size,
        )
    runs = runs_of(complete)
    if latest_checkpoint is not None:
        _origins(runs, latest_checkpoint, latest.source if latest else "the checkpoint", audit)
    for run in runs:
        sealed = run.sealed(signed_size)
        audit.runs.append(
            {"run_id": run.run_id, "first_index": run.start_index, "last_index": run.last_index,
             "run_end": run.end_index,
             "state": "sealed" if sealed else "spliced" if run.spliced is not None else "incomplete"}
        )
        if run.spliced is not None:
            where = f"lines {run.start_index}..{run.last_index}"
            audit.problem("spliced_run", f"run {run.run_id} ({where}) is spliced: {run.spliced}", run_id=run.run_id)
        elif not sealed:
            why = ("it has no run_end entry" if run.end_index is None
                   else "the signed checkpoint does not match the trace" if mismatched
                   else "no signed checkpoint covers its run_end")
            audit.problem(
                "incomplete_run",
                f"run {run.run_id} (lines {run.start_index}..{run.last_index}) is incomplete, crashed or cut: {why}",
                run_id=run.run_id,
            )
    return audit


__all__ = ["CLAIMS_NOT_MADE", "FAILING", "REPORT_SCHEMA", "HeldCheckpoint", "TraceAudit", "audit_trace", "b64"]
