"""Signed checkpoints of the trace, written by the real writer and checked by ``drawbridge evidence
verify-chain``: a sealed run verifies; a cut tail, a rollback re-signed with the operator's own key, an
unsealed run and lines no signature covers are each reported, never clean."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import PYTHON, scaled

from drawbridge.evidence.chain import split_lines
from drawbridge.evidence.merkle import MerkleTree, verify_consistency
from drawbridge.evidence.runs import RUN_END, run_end_body
from drawbridge.evidence.tlog import Checkpoint, open_checkpoint, sign_checkpoint, trace_leaf
from drawbridge.gateway.recording.checkpoints import Checkpointer, CheckpointSettings
from drawbridge.state.checkpoint_files import (
    CHECKPOINT_FILE,
    CHECKPOINTS_FILE,
    CheckpointFiles,
    checkpoint_line,
)
from drawbridge.state.signing_keys import load_keys, open_keys
from drawbridge.state.trace_log import TraceLog

AT = "2026-12-01T10:00:00.000000Z"
TIMEOUT = scaled(30.0)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "drawbridge", *args], capture_output=True, text=True, timeout=scaled(120))


def verify(evidence: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    done = cli("evidence", "verify-chain", str(evidence / "trace.ndjson"), *extra, "--format", "json")
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def codes(report: dict[str, Any]) -> set[str]:
    return {problem["code"] for problem in report["problems"]}


class Log:
    """A trace with its checkpointer, as the gateway runs them (fsync off: these tests need no disk)."""

    def __init__(self, evidence: Path, settings: CheckpointSettings = CheckpointSettings(1000, 3600.0)) -> None:
        evidence.mkdir(parents=True, exist_ok=True)
        self.evidence = evidence
        self.trace = TraceLog(evidence / "trace.ndjson", "never")
        self.keys = open_keys(evidence / "keys")
        self.checkpointer = Checkpointer(
            self.trace, self.keys, CheckpointFiles(evidence, durable=False), settings, durable=False, clock=lambda: AT
        )

    def calls(self, count: int, start: int = 0) -> None:
        for i in range(start, start + count):
            self.trace.append("tool_decision", AT, {"tool": f"t{i}", "action": "allow"})

    def close(self) -> None:
        self.checkpointer.close()
        self.trace.close()


def sealed_run(evidence: Path, calls: int = 6, run_id: str = "run-test-1") -> Log:
    log = Log(evidence)
    log.checkpointer.begin_run(run_id, {"name": "drawbridge", "version": "test"})
    log.calls(calls)
    log.checkpointer.end_run()
    log.close()
    return log


def test_a_sealed_run_verifies_and_its_checkpoint_signs_every_line(tmp_path: Path) -> None:
    evidence = tmp_path / "ev"
    sealed_run(evidence)
    code, report = verify(evidence)
    assert code == 0 and report["status"] == "verified", report["problems"]
    assert report["checkpoint"]["tree_size"] == report["lines"] == 8
    assert report["runs"] == [{"run_id": "run-test-1", "first_index": 0, "last_index": 7, "run_end": 7, "state": "sealed"}]
    # The checkpoint is the C2SP note of the RFC 6962 root over the lines, by the origin's key.
    lines = split_lines((evidence / "trace.ndjson").read_bytes())
    verifier = load_keys(evidence / "keys").verifier
    signed = open_checkpoint((evidence / CHECKPOINT_FILE).read_text(), verifier)
    assert signed == Checkpoint(verifier.name, 8, MerkleTree([trace_leaf(line) for line in lines]).root())
    assert signed.origin.startswith("drawbridge.local/") and len(signed.origin) == len("drawbridge.local/") + 32
    history = [json.loads(line) for line in (evidence / CHECKPOINTS_FILE).read_text().splitlines()]
    assert history[-1] == {"tree_size": 8, "note": (evidence / CHECKPOINT_FILE).read_text()}
    table = cli("evidence", "verify-chain", str(evidence / "trace.ndjson"))
    assert table.returncode == 0 and "VERIFIED" in table.stdout and "sealed" in table.stdout


def test_checkpoints_come_every_n_lines_and_every_t_seconds(tmp_path: Path) -> None:
    log = Log(tmp_path / "ev", CheckpointSettings(every_lines=3, every_seconds=3600.0))
    signed: list[int] = []
    arrived = threading.Event()

    def published(size: int, note: str) -> None:
        signed.append(size)
        arrived.set()

    log.checkpointer.published.append(published)
    log.calls(2)
    assert not arrived.wait(scaled(0.3))  # two lines wait; three are needed
    log.calls(1, start=2)
    assert arrived.wait(TIMEOUT) and signed[0] >= 3
    log.close()

    timed = Log(tmp_path / "ev2", CheckpointSettings(every_lines=1000, every_seconds=0.2))
    arrived.clear()
    timed.checkpointer.published.append(published)
    timed.calls(1)
    assert arrived.wait(TIMEOUT)  # one line, signed within the time bound
    assert signed[-1] == 1
    timed.close()


def test_an_unsealed_run_is_incomplete_never_clean(tmp_path: Path) -> None:
    log = Log(tmp_path / "ev")
    log.checkpointer.begin_run("run-crashed", {"name": "drawbridge", "version": "test"})
    log.calls(4)
    log.checkpointer.checkpoint_now()
    log.calls(2, start=4)
    log.close()  # no run_end: as a killed process leaves it
    code, report = verify(log.evidence)
    assert code == 1 and report["status"] == "incomplete"
    assert codes(report) == {"incomplete_run", "not_covered"}
    assert report["runs"][0]["state"] == "incomplete"
    uncovered = next(p for p in report["problems"] if p["code"] == "not_covered")
    assert uncovered["first_index"] == 5 and uncovered["lines"] == 2
    table = cli("evidence", "verify-chain", str(log.evidence / "trace.ndjson"))
    assert table.returncode == 1 and "INCOMPLETE" in table.stdout and "no signature covers them" in table.stdout


def test_a_cut_tail_is_caught_by_the_logs_own_checkpoint_and_by_one_held_elsewhere(tmp_path: Path) -> None:
    evidence = tmp_path / "ev"
    sealed_run(evidence)
    held = tmp_path / "held.note"
    held.write_text((evidence / CHECKPOINT_FILE).read_text())
    trace = evidence / "trace.ndjson"
    trace.write_bytes(b"".join(split_lines(trace.read_bytes())[:5]))
    code, report = verify(evidence)
    assert code == 1 and report["status"] == "failed" and "cut_tail" in codes(report)
    code, report = verify(evidence, "--known-checkpoint", str(held))
    assert code == 1 and report["known_checkpoints"][0]["finding"] == "cut_tail"


def _resign(evidence: Path, lines: list[bytes]) -> None:
    """What an operator holding the key can do: rewrite the trace and sign a new history for it."""
    (evidence / "trace.ndjson").write_bytes(b"".join(lines))
    keys = load_keys(evidence / "keys")
    tree = MerkleTree([trace_leaf(line) for line in lines])
    note = sign_checkpoint(Checkpoint(keys.origin, len(lines), tree.root()), keys.checkpoint)
    (evidence / CHECKPOINT_FILE).write_text(note)
    (evidence / CHECKPOINTS_FILE).write_bytes(checkpoint_line(len(lines), note))


def test_a_cut_tail_re_signed_with_the_operators_key_is_caught_only_by_a_checkpoint_held_elsewhere(
    tmp_path: Path,
) -> None:
    evidence = tmp_path / "ev"
    sealed_run(evidence)
    held = tmp_path / "held.note"
    held.write_text((evidence / CHECKPOINT_FILE).read_text())
    # Cut the last calls, forge a new run_end and sign the shorter tree with the operator's key.
    kept = TraceLog(tmp_path / "rebuilt.ndjson", "never")
    for line in split_lines((evidence / "trace.ndjson").read_bytes())[:4]:
        entry = json.loads(line)
        kept.append(entry["kind"], entry["at"], entry["body"])
    kept.append(RUN_END, AT, run_end_body("run-test-1", 0))
    kept.close()
    _resign(evidence, split_lines((tmp_path / "rebuilt.ndjson").read_bytes()))
    code, report = verify(evidence)
    assert code == 0 and report["status"] == "verified"  # the non-claim: alone, the log cannot tell
    code, report = verify(evidence, "--known-checkpoint", str(held))
    assert code == 1 and report["status"] == "failed"
    assert report["known_checkpoints"][0]["finding"] == "cut_tail"
    assert any("cut tail / rollback" in p["message"] for p in report["problems"])


def test_a_rollback_re_signed_with_the_operators_key_fails_the_consistency_proof(tmp_path: Path) -> None:
    evidence = tmp_path / "ev"
    log = Log(evidence)
    log.checkpointer.begin_run("run-test-1", {"name": "drawbridge", "version": "test"})
    log.calls(3)
    log.checkpointer.checkpoint_now()
    held = tmp_path / "held.json"
    held.write_text((evidence / CHECKPOINTS_FILE).read_text().splitlines()[-1])  # a line of checkpoints.ndjson
    log.calls(3, start=3)
    log.checkpointer.end_run()
    log.close()
    assert verify(evidence, "--known-checkpoint", str(held))[0] == 0
    # Rewrite entry 2 (a decision) and every entry after it, then sign the new tree.
    rebuilt = TraceLog(tmp_path / "rebuilt.ndjson", "never")
    for line in split_lines((evidence / "trace.ndjson").read_bytes()):
        entry = json.loads(line)
        body = {**entry["body"], "action": "deny"} if entry["seq"] == 2 else entry["body"]
        rebuilt.append(entry["kind"], entry["at"], body)
    rebuilt.close()
    _resign(evidence, split_lines((tmp_path / "rebuilt.ndjson").read_bytes()))
    code, report = verify(evidence)
    assert code == 0  # the chain and the new signature agree with each other
    code, report = verify(evidence, "--known-checkpoint", str(held))
    assert code == 1 and report["status"] == "failed"
    row = report["known_checkpoints"][0]
    assert row["finding"] == "rollback" and row["tree_size"] == 4
    # The proof in the report is the RFC 6962 proof from the rewritten lines; against the held root it fails.
    import base64

    proof = [base64.b64decode(h) for h in row["consistency_proof"]["hashes"]]
    new = report["checkpoint"]
    assert not verify_consistency(4, new["tree_size"], proof, base64.b64decode(row["root"]), base64.b64decode(new["root"]))


def test_a_checkpoint_held_elsewhere_that_the_log_continues_is_consistent(tmp_path: Path) -> None:
    evidence = tmp_path / "ev"
    log = Log(evidence)
    log.checkpointer.begin_run("run-test-1", {"name": "drawbridge", "version": "test"})
    log.calls(5)
    held = tmp_path / "held.note"
    held.write_text(log.checkpointer.checkpoint_now() or "")
    log.calls(9, start=5)
    log.checkpointer.end_run()
    log.close()
    code, report = verify(evidence, "--known-checkpoint", str(held))
    assert code == 0, report["problems"]
    row = report["known_checkpoints"][0]
    assert row["finding"] == "consistent" and row["consistency_proof"]["from"] == 6
    assert row["consistency_proof"]["to"] == 16 and row["consistency_proof"]["hashes"]


def test_a_checkpoint_by_another_key_or_a_pinned_key_of_another_log_is_refused(tmp_path: Path) -> None:
    sealed_run(tmp_path / "a")
    sealed_run(tmp_path / "b")
    other = tmp_path / "b" / CHECKPOINT_FILE
    code, report = verify(tmp_path / "a", "--known-checkpoint", str(other))
    assert code == 1 and "checkpoint_signature" in codes(report)
    code, report = verify(tmp_path / "a", "--vkey", str(tmp_path / "b" / "keys" / "checkpoint.vkey"))
    assert code == 1 and report["status"] == "failed" and "checkpoint_signature" in codes(report)


def test_a_line_proven_alone_by_a_tlog_proof(tmp_path: Path) -> None:
    evidence = tmp_path / "ev"
    sealed_run(evidence, calls=9)
    proof = tmp_path / "3.tlog-proof"
    done = cli("evidence", "prove", "--evidence-dir", str(evidence), "3", "--out", str(proof))
    assert done.returncode == 0, done.stderr
    line = tmp_path / "line"
    line.write_bytes(split_lines((evidence / "trace.ndjson").read_bytes())[3])
    vkey = str(evidence / "keys" / "checkpoint.vkey")
    assert cli("evidence", "verify-proof", str(proof), str(line), "--vkey", vkey).returncode == 0
    line.write_bytes(split_lines((evidence / "trace.ndjson").read_bytes())[4])
    refused = cli("evidence", "verify-proof", str(proof), str(line), "--vkey", vkey, "--format", "json")
    assert refused.returncode == 1 and json.loads(refused.stdout)["ok"] is False
    assert cli("evidence", "prove", "--evidence-dir", str(evidence), "99").returncode == 2
    unwritable = cli("evidence", "prove", "--evidence-dir", str(evidence), "3", "--out", str(tmp_path / "none" / "x"))
    assert unwritable.returncode == 2 and "Traceback" not in unwritable.stderr, unwritable.stderr
    assert "none/x: cannot write: No such file or directory" in unwritable.stderr


@pytest.mark.parametrize("mode", [0o640, 0o604])
def test_a_private_key_others_may_read_is_refused(tmp_path: Path, mode: int) -> None:
    keys = open_keys(tmp_path / "keys")
    (tmp_path / "keys" / "checkpoint.key").chmod(mode)
    with pytest.raises(Exception, match="chmod 600"):
        load_keys(tmp_path / "keys")
    assert keys.origin  # made once, at first start


def test_keys_are_made_once_0600_and_printed_without_their_private_halves(tmp_path: Path) -> None:
    first = open_keys(tmp_path / "keys", "example.com/gw1")
    assert open_keys(tmp_path / "keys").origin == "example.com/gw1"  # the same log, the same origin
    with pytest.raises(Exception, match="keeps its origin"):
        open_keys(tmp_path / "keys", "example.com/other")
    assert (tmp_path / "keys").stat().st_mode & 0o777 == 0o700
    for name in ("checkpoint.key", "attestation.key"):
        assert (tmp_path / "keys" / name).stat().st_mode & 0o777 == 0o600
    done = cli("evidence", "keys", "--keys-dir", str(tmp_path / "keys"), "--format", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["checkpoint_vkey"] == first.verifier.vkey and report["origin"] == "example.com/gw1"
    assert report["attestation_keyid"] == first.attestation_keyid
    for name in ("checkpoint.key", "attestation.key"):
        private = (tmp_path / "keys" / name).read_text()
        body = "".join(private.splitlines()[1:-1])
        assert body not in done.stdout and "PRIVATE" not in done.stdout
    assert first.checkpoint.key.private_bytes_raw() != first.attestation.private_bytes_raw()
    assert repr(first) == f"EvidenceKeys(directory={tmp_path / 'keys'!r})"


def _history_run(evidence: Path) -> list[str]:
    """A sealed run with a checkpoint after each few calls: a history of several lines."""
    log = Log(evidence)
    log.checkpointer.begin_run("run-test-1", {"name": "drawbridge", "version": "test"})
    for start in (0, 2, 4):
        log.calls(2, start=start)
        log.checkpointer.checkpoint_now()
    log.checkpointer.end_run()
    log.close()
    return (evidence / CHECKPOINTS_FILE).read_text().splitlines(keepends=True)


@pytest.mark.parametrize("edit", ["tree_size", "swap", "repeat", "delete_first_and_swap"])
def test_an_edited_checkpoint_history_fails(tmp_path: Path, edit: str) -> None:
    """A line's tree_size is not signed: it must be the size its note signs; and the log signs in
    increasing sizes, so lines moved or repeated are found (docs: every checkpoint, in order)."""
    evidence = tmp_path / "ev"
    history = _history_run(evidence)
    assert [json.loads(line)["tree_size"] for line in history] == [3, 5, 7, 8]
    assert verify(evidence)[0] == 0
    if edit == "tree_size":
        history[1] = history[1].replace('"tree_size":5', '"tree_size":6')
    elif edit == "swap":
        history[0], history[1] = history[1], history[0]
    elif edit == "repeat":
        history.insert(2, history[1])
    else:
        history = [history[2], history[1], history[3]]
    (evidence / CHECKPOINTS_FILE).write_text("".join(history))
    code, report = verify(evidence)
    assert code == 1 and report["status"] == "failed" and "checkpoint_history" in codes(report), report["problems"]
    message = next(p["message"] for p in report["problems"] if p["code"] == "checkpoint_history")
    assert "checkpoints.ndjson line " in message
    if edit == "tree_size":
        assert "states tree_size 6 but its note signs 5" in message
    else:
        assert "not in the order they were signed" in message


def test_an_edited_checkpoint_history_is_not_exported(tmp_path: Path) -> None:
    evidence = tmp_path / "ev"
    history = _history_run(evidence)
    (evidence / CHECKPOINTS_FILE).write_text("".join([history[0].replace('"tree_size":3', '"tree_size":9'), *history[1:]]))
    done = cli("evidence", "export", "--evidence-dir", str(evidence), "--out", str(tmp_path / "package"))
    assert done.returncode == 1 and "states tree_size 9 but its note signs 3" in done.stderr, done.stderr
    assert not (tmp_path / "package").exists()


def test_a_trace_its_checkpoint_does_not_match_is_reported_as_such(tmp_path: Path) -> None:
    """One byte flipped in a sealed trace: the chain and the checkpoint's root fail; the lines are not also
    said to come after the last checkpoint, nor the run to lack a covering one: a checkpoint exists and
    does not match."""
    evidence = tmp_path / "ev"
    sealed_run(evidence)
    trace = evidence / "trace.ndjson"
    data = bytearray(trace.read_bytes())
    data[data.index(b'"t3"') + 2] ^= 0x01
    trace.write_bytes(bytes(data))
    code, report = verify(evidence)
    assert code == 1 and report["status"] == "failed"
    assert codes(report) == {"chain", "checkpoint_root_mismatch", "incomplete_run"}, report["problems"]
    messages = " ".join(p["message"] for p in report["problems"])
    assert "come after the last signed checkpoint" not in messages
    assert "no signed checkpoint covers its run_end" not in messages
    assert "the signed checkpoint does not match the trace" in messages


def test_a_latest_checkpoint_replaced_by_an_older_one_fails_as_rolled_back(tmp_path: Path) -> None:
    """checkpoint is written before its history line, so a history line larger than checkpoint is an
    older note put back in its place: a rollback, not lines that merely wait for a signature."""
    evidence = tmp_path / "ev"
    history = _history_run(evidence)
    (evidence / CHECKPOINT_FILE).write_text(json.loads(history[1])["note"])  # the checkpoint of size 5
    code, report = verify(evidence)
    assert code == 1 and report["status"] == "failed" and "checkpoint_history" in codes(report), report["problems"]
    messages = " ".join(p["message"] for p in report["problems"])
    assert "signs 5 lines, but the log's history holds a checkpoint of 8" in messages
    assert "replaced by an older one (rolled back)" in messages
    assert "come after the last signed checkpoint" not in messages and "not_covered" not in codes(report)


def test_a_deleted_latest_checkpoint_with_its_history_present_fails_as_deleted(tmp_path: Path) -> None:
    evidence = tmp_path / "ev"
    _history_run(evidence)
    (evidence / CHECKPOINT_FILE).unlink()
    code, report = verify(evidence)
    assert code == 1 and report["status"] == "failed" and "checkpoint_history" in codes(report), report["problems"]
    messages = " ".join(p["message"] for p in report["problems"])
    assert "the latest checkpoint is missing, but the log's history holds 4 checkpoint(s): it was deleted" in messages
    assert "no signed checkpoint: no line is covered" not in messages


def test_checkpoint_is_written_before_its_history_line(tmp_path: Path) -> None:
    """The order trace_audit relies on: a history line is only appended once checkpoint holds its note,
    so a write cut between the two leaves checkpoint ahead of the history, never behind it."""
    evidence = tmp_path / "ev"
    history = _history_run(evidence)
    (evidence / CHECKPOINT_FILE).unlink()
    (evidence / CHECKPOINT_FILE).mkdir()  # checkpoint cannot be replaced: the write stops there
    (evidence / CHECKPOINT_FILE / "x").write_text("x")
    files = CheckpointFiles(evidence, durable=False)
    with pytest.raises(OSError):
        files.write(99, "a note")
    files.close()
    assert (evidence / CHECKPOINTS_FILE).read_text() == "".join(history)


def _rebuilt(evidence: Path, traces: list[Path]) -> None:
    """The lines of ``traces`` one after the other, chained anew, signed with ``evidence``'s own key."""
    rebuilt = TraceLog(evidence.parent / "rebuilt.ndjson", "never")
    for trace in traces:
        for line in split_lines(trace.read_bytes()):
            entry = json.loads(line)
            rebuilt.append(entry["kind"], entry["at"], entry["body"])
    rebuilt.close()
    _resign(evidence, split_lines((evidence.parent / "rebuilt.ndjson").read_bytes()))


def test_a_trace_re_signed_with_the_key_of_another_origin_fails(tmp_path: Path) -> None:
    """A gateway refuses keys of another origin than the trace's run_start entries name; a trace whose
    runs name another origin than the key that signs it was re-signed under another log's key."""
    sealed_run(tmp_path / "a")
    sealed_run(tmp_path / "b", run_id="run-test-b")
    _rebuilt(tmp_path / "a", [tmp_path / "b" / "trace.ndjson"])  # b's run, signed by a's key
    code, report = verify(tmp_path / "a")
    assert code == 1 and report["status"] == "failed" and codes(report) == {"origin_mismatch"}, report["problems"]
    origin_a, origin_b = load_keys(tmp_path / "a" / "keys").origin, load_keys(tmp_path / "b" / "keys").origin
    message = report["problems"][0]["message"]
    assert f"run run-test-b (line 0) names origin {origin_b!r}" in message and repr(origin_a) in message


def test_a_run_ended_by_another_runs_run_end_is_reported_spliced(tmp_path: Path) -> None:
    """One run of a trace, then another trace's run (the same keys), chained anew and re-signed: the
    second run's run_end names start_index 0, its own run_start is line 8. That is the finding, not a
    missing run_end."""
    sealed_run(tmp_path / "a")
    (tmp_path / "b").mkdir()
    shutil.copytree(tmp_path / "a" / "keys", tmp_path / "b" / "keys")
    sealed_run(tmp_path / "b", run_id="run-test-b")
    _rebuilt(tmp_path / "a", [tmp_path / "a" / "trace.ndjson", tmp_path / "b" / "trace.ndjson"])
    code, report = verify(tmp_path / "a")
    assert code == 1 and report["status"] == "failed" and codes(report) == {"spliced_run"}, report["problems"]
    message = report["problems"][0]["message"]
    assert "run run-test-b (lines 8..15) is spliced: the run_end at line 15 names start_index 0" in message
    assert "this run started at line 8" in message and "no run_end" not in message
    assert [run["state"] for run in report["runs"]] == ["sealed", "spliced"]
