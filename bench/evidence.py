"""Cost of the evidence built for one typical tools/call, in microseconds.

Builds, for a privileged call (add_deploy_key with a traceparent and a planted
secret): a tool-decision surface record, a keyed truth carrier (with its
verdict against a small declared policy), and a hash-chained trace entry.
Prints the median and p99 of each over many repetitions; then what the gateway's evidence
recorder spends per call (records built and written) with and without truth carriers; then the
same with the trace's signed checkpoints and with live telemetry to an OTLP/HTTP sink.

    python bench/evidence.py [--n 20000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from drawbridge.evidence.chain import ChainHead, make_entry
from drawbridge.evidence.surface import build_decision
from drawbridge.evidence.truth.carrier import build_carrier
from drawbridge.evidence.truth.declared import declared_policy_digest
from drawbridge.evidence.truth.evidence import Evidence
from drawbridge.evidence.truth.verdict import decision_verdict

ARGS = {
    "owner": "acme",
    "repo": "prod-api",
    "title": "ci deploy key",
    "key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl",
    "read_only": True,
    "token": "ghp_plantedsecret0000000000000000000000",
}
PARAMS = {
    "name": "add_deploy_key",
    "arguments": ARGS,
    "_meta": {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
}
POLICY = {
    "version": "2.0",
    "tools": {"allow": ["list_repos", "add_deploy_key"], "approval_required": ["add_deploy_key"]},
    "schemas": {"add_deploy_key": {"type": "object", "required": ["owner", "repo"]}},
}
KEY, KEY_ID = b"bench-key-0123456789abcdef", "bench-kid-v0"
DPD = declared_policy_digest(POLICY)


def surface() -> object:
    return build_decision(
        server_id="github", tool_name="add_deploy_key", arguments=ARGS, params=PARAMS,
        effect="allow", status="success", rule_id="demo#2",
    )


def carrier() -> object:
    verdict = decision_verdict(POLICY, "add_deploy_key", ARGS, "present", Evidence())
    return build_carrier(
        tool_name="add_deploy_key", args=ARGS, order=7, declared_policy_digest=DPD, key=KEY, key_id=KEY_ID,
        source_class="authoritative_boundary", call_id="req_7", result_status="ok", identity_state="present",
        decision_verdict=verdict,
    )


HEAD = ChainHead(seq=41, entry_hash="sha256:" + "ab" * 32)
BODY = {"agent": "demo-agent", "tool": "github.add_deploy_key", "action": "allow", "policy": "demo",
        "rule_index": 2, "args_digest": "hmac-sha256:bench-kid-v0:" + "cd" * 32, "outcome": "success",
        "latency_ms": 1.25}


def chain_entry() -> object:
    return make_entry(HEAD, "tool_decision", "2026-11-30T12:00:00.000000Z", BODY)


def measure(fn: Callable[[], object], n: int) -> tuple[float, float]:
    for _ in range(min(1000, n)):
        fn()
    samples = []
    clock = time.perf_counter_ns
    for _ in range(n):
        start = clock()
        fn()
        samples.append((clock() - start) / 1000)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20000)
    n = parser.parse_args().n
    rows = [("surface record", surface), ("truth carrier + verdict", carrier), ("chain entry", chain_entry)]
    total = 0.0
    print(f"{'evidence for one call':<26}{'p50 us':>10}{'p99 us':>10}")
    for name, fn in rows:
        p50, p99 = measure(fn, n)
        total += p50
        print(f"{name:<26}{p50:>10.1f}{p99:>10.1f}")
    print(f"{'all three (sum of p50)':<26}{total:>10.1f}")
    print()
    print(f"{'the gateway recorder':<26}{'us/call':>10}")
    for label, carriers in (("trace + surface", False), ("+ truth carriers", True)):
        print(f"{label:<26}{recorder_per_call(n, carriers):>10.1f}")
    print()
    print(f"{'signed and observed':<36}{'call path':>10}{'+ sent':>10}{'worker*':>10}")
    with otlp_sink() as endpoint:
        for label, telemetry in (("+ checkpoints (tree, signing)", None), ("+ telemetry (OTLP/HTTP, live sink)", endpoint)):
            path, sent, worker = gateway_per_call(n, telemetry)
            print(f"{label:<36}{path:>10.1f}{sent:>10.1f}{worker:>10.1f}")
    print("* CPU of the telemetry worker process per call, its start (importing the SDK) included")


SINK = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


class otlp_sink:
    """An OTLP/HTTP collector stand-in in a process of its own (it takes no CPU from the one measured)."""

    def __enter__(self) -> str:
        import subprocess
        import sys

        self.process = subprocess.Popen([sys.executable, "-c", SINK], stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        return f"http://127.0.0.1:{self.process.stdout.readline().strip()}"

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait()


def gateway_per_call(n: int, endpoint: str | None) -> tuple[float, float, float]:
    """What the gateway spends per allowed echo call with truth carriers, the trace's tree and its
    signed checkpoints (every 1,000 lines, in their thread) and, with ``endpoint``, live telemetry
    (summaries sent by a thread of this process to the telemetry worker, which makes and exports the
    spans in a process of its own): the time on the calls' path, four calls per write through the
    evidence guard; the same until every summary has been handed to the worker; and the CPU the
    worker process spent per call (on another core; the SDK drops spans it cannot take in time)."""
    import os
    import resource
    import tempfile
    from pathlib import Path

    from drawbridge.gateway.pipeline.guard import EvidenceGuard
    from drawbridge.gateway.recording.checkpoints import CheckpointSettings, Checkpointer
    from drawbridge.gateway.recording.recorder import EvidenceRecorder, TruthKey, utc_now
    from drawbridge.gateway.recording.telemetry import Telemetry, TelemetrySettings
    from drawbridge.state.checkpoint_files import CheckpointFiles
    from drawbridge.state.signing_keys import open_keys

    contract = {"version": "2.0", "tools": {"allow": ["echo"]}, "schemas": {}}
    with tempfile.TemporaryDirectory() as tmp:
        evidence = Path(tmp) / "evidence"
        recorder = EvidenceRecorder(
            evidence, route=lambda tool: "everything", fsync="never", truth_out=Path(tmp) / "carriers.ndjson",
            truth_key=TruthKey(KEY, KEY_ID), declared=lambda agent: contract,
        )
        assert recorder.trace is not None
        keys = open_keys(evidence / "keys")
        checkpointer = Checkpointer(recorder.trace, keys, CheckpointFiles(evidence, durable=False),
                                    CheckpointSettings(), durable=False, clock=utc_now)
        guard = EvidenceGuard(recorder)
        telemetry = None
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        if endpoint is not None:
            telemetry = Telemetry(TelemetrySettings(endpoint), os.environ, network_transport="pipe", origin=keys.origin)
            trace = recorder.trace
            guard.batch_observers.append(lambda events: telemetry.observe(events, trace.head.seq if trace.head else None))
            time.sleep(3.0)  # the worker imports the SDK meanwhile (at a gateway's start, not in its calls)
        records = [_record(i) for i in range(n)]
        start = time.perf_counter()
        for i in range(0, n, 4):
            guard.record_now(records[i : i + 4])
        path = time.perf_counter() - start
        if telemetry is not None:
            while telemetry._pending:  # until the sender has handed every summary to the worker
                time.sleep(0.001)
        drained = time.perf_counter() - start
        checkpointer.close()
        if telemetry is not None:
            telemetry.shutdown()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        worker = (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
        recorder.close()
    return path / n * 1e6, drained / n * 1e6, worker / n * 1e6


def _record(i: int) -> object:
    from drawbridge.gateway.pipeline.outcomes import Outcome
    from drawbridge.gateway.pipeline.records import CallRecord
    from drawbridge.gateway.pipeline.tool_call import ToolCall
    from drawbridge.gateway.pipeline.verdicts import Action, Provenance

    arguments = {"message": f"hello {i}"}
    return CallRecord(
        agent="bench", request_id=i, tool="echo", action=Action.ALLOW, reason="allowed",
        provenance=Provenance("bench", "bench.yaml", 0), outcome=Outcome.OK, error=None,
        error_code=None, decision_ms=0.01, latency_ms=0.2, protocol_version="2025-11-25",
        call=ToolCall("bench", "echo", arguments, None, i), tool_listed=True, forwarded=True,
    )


def recorder_per_call(n: int, carriers: bool) -> float:
    """What the gateway's recorder spends per allowed echo call, records built and written (to the
    page cache: fsync never), four calls per write as the relay hands them over under load."""
    import tempfile
    from pathlib import Path

    from drawbridge.gateway.recording.recorder import EvidenceRecorder, TruthKey

    contract = {"version": "2.0", "tools": {"allow": ["echo"]}, "schemas": {}}
    with tempfile.TemporaryDirectory() as tmp:
        recorder = EvidenceRecorder(
            Path(tmp) / "evidence", route=lambda tool: "everything", fsync="never",
            truth_out=Path(tmp) / "carriers.ndjson" if carriers else None,
            truth_key=TruthKey(KEY, KEY_ID) if carriers else None,
            declared=(lambda agent: contract) if carriers else None,
        )
        records = [_record(i) for i in range(n)]
        start = time.perf_counter()
        for i in range(0, n, 4):
            recorder.record_now(records[i : i + 4])
        elapsed = time.perf_counter() - start
        recorder.close()
    return elapsed / n * 1e6


if __name__ == "__main__":
    main()
