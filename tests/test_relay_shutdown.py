"""An agent that sends calls and closes its end at once still gets every call decided and forwarded.

A server that reads its whole input before exiting answers every request it received; the gateway
in front of it must do the same: calls still being decided when the agent's input ends are decided
and forwarded before the upstream hears the end of input.
"""

from __future__ import annotations

import json
import subprocess

from conftest import PYTHON, SERVERS, child_env, scaled

SCRIPTED = [PYTHON, str(SERVERS / "scripted.py")]


def test_calls_in_decision_when_input_ends_are_still_forwarded(harness) -> None:
    relay = harness(SCRIPTED, slow_decision=["echo_slow"])
    messages = [
        {"jsonrpc": "2.0", "id": 0, "method": "initialize",
         "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo_slow", "arguments": {"n": 1}}},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "echo_fast", "arguments": {"n": 2}}},
    ]
    argv = relay.argv()
    argv[2:2] = ["--slow-seconds", "0.5"]  # well within the relay's shutdown grace
    result = subprocess.run(
        argv, input="".join(json.dumps(m) + "\n" for m in messages), capture_output=True, text=True,
        timeout=scaled(60), env=child_env(),
    )
    answers = {json.loads(line)["id"]: json.loads(line) for line in result.stdout.splitlines()}
    assert set(answers) == {0, 1, 2}, result.stdout + result.stderr
    assert "result" in answers[1] and "result" in answers[2], answers
    assert [c["outcome"] for c in sorted(relay.calls(), key=lambda c: str(c["request_id"]))] == ["ok", "ok"]


def test_an_upstream_cannot_answer_a_call_it_was_not_sent(harness) -> None:
    """While call 10 is still being decided, the upstream answers id 10 unasked: the forged answer is
    dropped, and call 10 gets the answer to the request the gateway actually forwarded."""
    relay = harness(SCRIPTED, slow_decision=["slow_echo"])
    argv = relay.argv()
    argv[2:2] = ["--slow-seconds", "0.5"]  # within the relay's shutdown grace, as above
    messages = [
        {"jsonrpc": "2.0", "id": 0, "method": "initialize",
         "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
        {"jsonrpc": "2.0", "id": 10, "method": "tools/call", "params": {"name": "slow_echo", "arguments": {"n": 10}}},
        {"jsonrpc": "2.0", "id": 11, "method": "tools/call", "params": {"name": "forge", "arguments": {"id": 10}}},
    ]
    result = subprocess.run(
        argv, input="".join(json.dumps(m) + "\n" for m in messages), capture_output=True, text=True,
        timeout=scaled(60), env=child_env(),
    )
    answers = {json.loads(line)["id"]: json.loads(line) for line in result.stdout.splitlines()}
    assert answers[10]["result"]["content"][0]["text"] == '{"n": 10}', answers
    assert answers[11]["result"]["content"][0]["text"] == "forged"
    assert "FORGED" not in result.stdout
    assert [i["kind"] for i in relay.incidents()] == ["unknown_response"]
