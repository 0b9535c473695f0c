"""Live evidence from CallRecords: one trace entry, one surface record, one carrier per call; no secrets."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from drawbridge.evidence.chain import verify_chain
from drawbridge.evidence.side_effect_verify import verify_side_effects
from drawbridge.evidence.truth.vectors import verify_carriers
from drawbridge.gateway.pipeline.outcomes import Outcome
from drawbridge.gateway.pipeline.records import CallRecord, RelayIncident
from drawbridge.gateway.pipeline.tool_call import ToolCall
from drawbridge.gateway.pipeline.verdicts import Action, Provenance
from drawbridge.gateway.recording.recorder import EvidenceRecorder, TruthKey, effect_status, truth_call_id

SECRET = "ghp_SECRET_VALUE_never_written_0123456789"
CONTRACT = {"version": "2.0", "tools": {"allow": ["list_repos", "add_deploy_key"]}, "schemas": {}}


def _record(tool: str, args: dict, action: Action, outcome: Outcome, request_id: object = 1) -> CallRecord:
    call = ToolCall("agent-1", tool, args, {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
                    request_id)
    return CallRecord(
        agent="agent-1", request_id=request_id, tool=tool, action=action, reason=f"{action} by rule 0",
        provenance=Provenance("demo", "/p/demo.yaml", 0), outcome=outcome, error=None, error_code=None,
        decision_ms=0.01, latency_ms=1.5, protocol_version="2025-11-25", call=call, tool_listed=tool == "list_repos",
    )


@pytest.mark.parametrize("fsync", ["never", "always"])
def test_each_call_leaves_one_entry_per_sink(tmp_path: Path, fsync: str) -> None:
    recorder = EvidenceRecorder(
        tmp_path / "ev", route=lambda tool: "github", truth_out=tmp_path / "carriers.ndjson",
        truth_key=TruthKey(b"k" * 32, "kid-1"), declared=lambda agent: CONTRACT,
        fsync=fsync,  # type: ignore[arg-type]
    )
    args = {"owner": "acme", "repo": "api", "title": "ci", "key": "ssh-ed25519 AAAA", "token": SECRET}

    async def run() -> None:
        await recorder(_record("list_repos", {"owner": "acme"}, Action.ALLOW, Outcome.OK))
        await recorder(_record("add_deploy_key", args, Action.ALLOW, Outcome.OK, "r-2"))
        await recorder(_record("delete_repo", {"password": SECRET}, Action.DENY, Outcome.REFUSED, 3))
        await recorder(RelayIncident("parse_error", "client", "line 4 is not JSON", -32700))

    anyio.run(run)
    recorder.close()

    trace = (tmp_path / "ev" / "trace.ndjson").read_bytes()
    report = verify_chain(trace.splitlines(keepends=True))
    assert report.ok and report.entries == 4
    kinds = [json.loads(line)["kind"] for line in trace.splitlines()]
    assert kinds == ["tool_decision"] * 3 + ["relay_incident"]
    bodies = [json.loads(line)["body"] for line in trace.splitlines()]
    assert bodies[1]["args_digest"].startswith("hmac-sha256:kid-1:")
    assert bodies[2]["action"] == "deny" and bodies[2]["rule_index"] == 0

    surface_lines = (tmp_path / "ev" / "tool-decisions.ndjson").read_text().splitlines()
    assert len(surface_lines) == 3
    decisions = [json.loads(line)["observed_tool_decisions"][0] for line in surface_lines]
    assert [d["classification"] for d in decisions] == ["observed_unknown_tool", "classified", "observed_unknown_tool"]
    assert decisions[1]["response"]["side_effect"]["level"] == "asserted"
    assert decisions[1]["response"]["side_effect_asserted"] is True
    assert decisions[2]["decision"]["effect"] == "deny" and decisions[2]["response"]["status"] == "blocked"
    assert decisions[1]["correlation"]["basis"] == "propagated_trace_context"
    merged = {"schema": "assay.tool_decision_surface.v0", "observed_tool_decisions": decisions, "non_claims": []}
    assert verify_side_effects(merged, [])["calls"][1]["level"] == "asserted"

    carriers = [json.loads(line) for line in (tmp_path / "carriers.ndjson").read_text().splitlines()]
    assert [c["order"] for c in carriers] == [0, 1, 2]
    assert [c["identity_state"] for c in carriers] == ["present", "absent", "absent"]
    assert [c["call_id"] for c in carriers] == ["req_1", "req_r-2", "req_3"]
    assert verify_carriers(carriers)["ok"] is True

    everything = trace + (tmp_path / "ev" / "tool-decisions.ndjson").read_bytes() + (
        tmp_path / "carriers.ndjson").read_bytes()
    for planted in (SECRET, "ssh-ed25519", "kkkkkkkk"):
        assert planted.encode() not in everything


def test_reopening_continues_the_chain(tmp_path: Path) -> None:
    for _ in range(2):
        recorder = EvidenceRecorder(tmp_path, route=lambda tool: "up", fsync="never")
        anyio.run(recorder, _record("list_repos", {}, Action.ALLOW, Outcome.OK))
        anyio.run(recorder.record_event, "policy_edit", {"agent": "a", "tool": "t", "before": "deny", "after": "allow"})
        recorder.close()
    report = verify_chain((tmp_path / "trace.ndjson").read_bytes().splitlines(keepends=True))
    assert report.ok and report.entries == 4


def test_truth_producer_needs_key_and_contract(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs a key"):
        EvidenceRecorder(tmp_path, route=lambda tool: "up", truth_out=tmp_path / "c.ndjson")


def test_outcome_table_is_total_and_only_success_asserts() -> None:
    for outcome in Outcome:
        effect, status = effect_status(outcome)
        assert effect in {"allow", "deny", "error"}
        assert (effect == "allow" and status == "success") == (outcome is Outcome.OK)


def test_call_id_rules() -> None:
    record = _record("t", {"_meta": {"tool_call_id": "tc-9"}}, Action.ALLOW, Outcome.OK)
    assert truth_call_id(record) == "tc-9"
    assert truth_call_id(_record("t", {}, Action.ALLOW, Outcome.OK, 7)) == "req_7"
    assert truth_call_id(_record("t", {}, Action.ALLOW, Outcome.OK, None)).startswith("gen_")


def test_key_never_in_repr() -> None:
    assert "secretkey" not in repr(TruthKey(b"secretkey", "kid"))
