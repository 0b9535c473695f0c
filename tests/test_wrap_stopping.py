"""How a real ``drawbridge wrap`` ends: on SIGINT, on SIGTERM, and when its agent closes its stdin.

Whichever way it ends, every call in flight gets exactly one record (and the agent, while it still
reads, its one answer), the server's process group is stopped, and the run is sealed (``run_end``
and a final checkpoint) before the process exits 0: ``drawbridge evidence verify-chain`` says so.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import anyio
import pytest
from approval_support import cli, decisions, trace, write_policy
from conftest import CRASHY, EXIT_SECONDS, PYTHON, SERVERS, RawPipe, child_env, eventually, raw_pipe, wrap_argv

pytestmark = pytest.mark.anyio

SDK_CLOSE_SECONDS = 2.0
"""What the Python SDK's stdio client gives a server between closing its stdin and SIGTERM
(``mcp.client.stdio.PROCESS_TERMINATION_TIMEOUT``): a client's constant, not a test timeout."""


def scripted(marker: Path) -> list[str]:
    """The scripted server, with an argument it ignores that names its processes for this test."""
    return [PYTHON, str(SERVERS / "scripted.py"), str(marker)]


def running_with(marker: Path) -> list[int]:
    """Processes whose command line holds ``marker`` (the wrapped server, while it lives)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if str(marker).encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def verified(evidence: Path) -> dict:
    done = cli("evidence", "verify-chain", str(evidence / "trace.ndjson"), "--format", "json")
    report = json.loads(done.stdout)
    assert done.returncode == 0, report
    return report


async def hang_in_flight(pipe: RawPipe) -> None:
    """A call the server received and will never answer (it answers the ping after it: it read it)."""
    await pipe.initialize()
    await pipe.send({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "hang", "arguments": {}}})
    assert "error" in await pipe.request(8, "ping")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
async def test_a_signal_records_and_answers_the_call_in_flight_then_seals_the_run(tmp_path: Path, sig: int) -> None:
    evidence, marker = tmp_path / "evidence", tmp_path / "server-marker"
    argv = wrap_argv(scripted(marker), "--allow-all", "--evidence-dir", str(evidence), "--fsync", "never")
    async with raw_pipe(argv) as pipe:
        await hang_in_flight(pipe)
        pipe.process.send_signal(sig)
        answer = json.loads(await pipe.response_line(7))
        with anyio.fail_after(EXIT_SECONDS):
            code = await pipe.process.wait()
    name = signal.Signals(sig).name
    assert code == 0
    assert answer["error"]["code"] == -32000 and f"the gateway was stopped ({name})" in answer["error"]["message"]
    [record] = decisions(evidence, "hang")
    assert record["outcome"] == "upstream_exited" and f"stopped ({name}) before answering" in record["error"]
    report = verified(evidence)
    assert [run["state"] for run in report["runs"]] == ["sealed"]
    assert not running_with(marker), "the server outlived the gateway"


async def test_a_signal_while_the_relay_waits_for_nothing_still_seals_the_run(tmp_path: Path) -> None:
    evidence, marker = tmp_path / "evidence", tmp_path / "server-marker"
    argv = wrap_argv(scripted(marker), "--allow-all", "--evidence-dir", str(evidence), "--fsync", "never")
    async with raw_pipe(argv) as pipe:
        await pipe.initialize()
        pipe.process.send_signal(signal.SIGTERM)
        with anyio.fail_after(EXIT_SECONDS):
            assert await pipe.process.wait() == 0
    assert [run["state"] for run in verified(evidence)["runs"]] == ["sealed"]
    assert not running_with(marker)


def test_closing_stdin_ends_the_run_sealed_before_the_sdk_would_send_sigterm(tmp_path: Path) -> None:
    """The SDK's close: stdin closed, then SIGTERM 2 s later. A server that ignores the end of its
    input (``hang``) gets wrap's grace and is then stopped by wrap itself, and the run is sealed,
    without any signal sent to wrap. How long that takes is a wall-clock figure (a loaded machine
    stretches it), so the window is checked where it is set: the grace leaves the SDK's 2 s half free
    for the rest of the shutdown, and the close path itself is waited on as an event."""
    from drawbridge.gateway.transports.relay_requests import RelayConfig

    assert RelayConfig().shutdown_grace <= SDK_CLOSE_SECONDS / 2
    evidence, marker = tmp_path / "evidence", tmp_path / "server-marker"
    argv = wrap_argv(scripted(marker), "--allow-all", "--evidence-dir", str(evidence), "--fsync", "never")
    process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=child_env())
    try:
        assert process.stdin is not None and process.stdout is not None
        init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
        for message in (
            {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init},
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "hang", "arguments": {}}},
            {"jsonrpc": "2.0", "id": 8, "method": "ping"},
        ):
            process.stdin.write(json.dumps(message).encode() + b"\n")
        process.stdin.flush()
        assert json.loads(process.stdout.readline())["id"] == 0
        assert json.loads(process.stdout.readline())["id"] == 8  # the server read the call before it
        process.stdin.close()
        try:
            code = process.wait(EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            pytest.fail("wrap did not end on its own after its stdin closed")
        assert code == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    [record] = decisions(evidence, "hang")
    assert record["outcome"] == "cancelled"
    assert [run["state"] for run in verified(evidence)["runs"]] == ["sealed"]
    eventually(lambda: not running_with(marker), what="the server stopped")
    assert os.path.exists(evidence / "checkpoints.ndjson")


ASKING_POLICY = """\
name: asking
agent: "*"
rules:
  - tools: ["echo"]
    action: human_approval
  - tools: ["*"]
    action: allow
"""


async def asked_in_band(pipe: RawPipe) -> None:
    """``echo`` waits for a person: the agent (which can be asked in-band) is asked."""
    init = {"protocolVersion": "2025-11-25", "capabilities": {"elicitation": {"form": {}}},
            "clientInfo": {"name": "t", "version": "0"}}
    await pipe.request(0, "initialize", init)
    await pipe.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    await pipe.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "x"}}})
    while (await pipe.recv()).get("method") != "elicitation/create":
        pass


def assert_not_sent_and_withdrawn(evidence: Path, cause: str) -> None:
    """The call waiting for a person keeps its decision (human_approval, its rule), is recorded as not
    sent, and its question is closed (``approval_resolved``), in a run that verifies sealed."""
    found = decisions(evidence, "echo")
    assert len(found) == 1, [(e["kind"], e["body"].get("tool"), e["body"].get("outcome")) for e in trace(evidence)]
    [record] = found
    assert record["action"] == "human_approval" and record["policy"] == "asking" and record["rule_index"] == 0
    assert record["outcome"] == "upstream_exited" and record["error"] == f"{cause}; the call was not sent"
    [resolved] = trace(evidence, "approval_resolved")
    assert resolved["body"]["status"] == "expired" and resolved["body"]["resolved_by"] == "system:unanswerable"
    assert cause in resolved["body"]["reason"]
    assert [run["state"] for run in verified(evidence)["runs"]] == ["sealed"]


async def test_a_call_waiting_for_a_person_when_the_upstream_exits_is_recorded_as_not_sent(tmp_path: Path) -> None:
    evidence = tmp_path / "evidence"
    argv = wrap_argv(CRASHY, "--policy", str(write_policy(tmp_path, ASKING_POLICY)), "--evidence-dir", str(evidence),
                     "--fsync", "never")
    async with raw_pipe(argv) as pipe:
        await asked_in_band(pipe)
        await pipe.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "crash", "arguments": {}}})
        answer = json.loads(await pipe.response_line(1))
        assert answer["error"]["message"].endswith("; the call was not sent"), answer
    cause = answer["error"]["message"].removesuffix("; the call was not sent")
    assert cause.startswith("the upstream exited")
    assert_not_sent_and_withdrawn(evidence, cause)


async def test_a_call_waiting_for_a_person_when_the_gateway_is_stopped_is_recorded_as_not_sent(tmp_path: Path) -> None:
    evidence = tmp_path / "evidence"
    argv = wrap_argv(CRASHY, "--policy", str(write_policy(tmp_path, ASKING_POLICY)), "--evidence-dir", str(evidence),
                     "--fsync", "never")
    async with raw_pipe(argv) as pipe:
        await asked_in_band(pipe)
        pipe.process.send_signal(signal.SIGTERM)
        answer = json.loads(await pipe.response_line(1))
        with anyio.fail_after(EXIT_SECONDS):
            assert await pipe.process.wait() == 0
    assert answer["error"]["message"] == "the gateway was stopped (SIGTERM); the call was not sent"
    assert_not_sent_and_withdrawn(evidence, "the gateway was stopped (SIGTERM)")


def test_the_documented_check_of_a_chain_verifies_a_run(tmp_path: Path) -> None:
    """docs/deployment.md "Checking it": its verify-chain line, run as written on a real evidence
    directory (its path swapped for this one's), verifies the run wrap just sealed."""
    evidence = tmp_path / "evidence"
    argv = wrap_argv(scripted(tmp_path / "marker"), "--allow-all", "--evidence-dir", str(evidence), "--fsync", "never")
    subprocess.run(argv, input=b"", env=child_env(), timeout=EXIT_SECONDS, check=True, capture_output=True)
    doc = (Path(__file__).resolve().parent.parent / "docs" / "deployment.md").read_text(encoding="utf-8")
    [line] = [line for line in doc.splitlines() if line.startswith("drawbridge evidence verify-chain ")]
    words = line.split("#")[0].split()
    documented = "/var/lib/drawbridge/gw-a/evidence"
    args = [word.replace(documented, str(evidence)) for word in words[1:]]
    done = cli(*args)
    assert done.returncode == 0, done.stdout + done.stderr
