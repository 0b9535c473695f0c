"""Planted secrets never reach a record, a log line or an error message.

Secrets are planted where a careless gateway would copy them: argument values under
secret-like keys and under ordinary keys, a value that violates a schema (so the refusal
talks about it), the truth producer's HMAC key in the environment. Then every output of a
real `drawbridge wrap` run is scanned: the evidence directory, the carriers, everything the
agent received, and the gateway's stderr with verbose logging.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import GITHUB_LIKE, PYTHON, child_env, scaled

POLICIES = Path(__file__).resolve().parent.parent / "src" / "drawbridge" / "examples" / "policies"
HMAC_KEY = "tdt-key-PLANTED-1f2e3d4c5b6a-0123456789"
ARG_SECRETS = {
    "token": "ghp_PLANTED_token_0000000000000000000000",
    "password": "PLANTED-password-hunter2",
    "api_key": "sk-PLANTED-apikey-1234567890",
    "authorization": "Bearer PLANTED.jwt.value",
}
TITLE_SECRET = "PLANTED-title-" + "x" * 120  # violates the schema's maxLength: the refusal must not quote it
KEY_MATERIAL = "ssh-ed25519 AAAAC3PLANTEDKEYMATERIAL"


def _requests() -> list[dict]:
    calls = [
        ("list_repos", {"owner": "acme", **ARG_SECRETS}),
        ("delete_repo", {"owner": "acme", "name": "rocket", **ARG_SECRETS}),
        ("add_deploy_key", {"owner": "acme", "repo": "rocket", "title": "ci", "key": KEY_MATERIAL, **ARG_SECRETS}),
        ("add_deploy_key", {"owner": "acme", "repo": "rocket", "title": TITLE_SECRET, "key": KEY_MATERIAL}),
        ("add_deploy_key", {"owner": "acme", "repo": "rocket", "title": "ci", "key": KEY_MATERIAL, "read_only": False}),
        ("no_such_tool", {"password": ARG_SECRETS["password"]}),
    ]
    messages: list[dict] = [
        {"jsonrpc": "2.0", "id": 0, "method": "initialize",
         "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
    ]
    for index, (name, arguments) in enumerate(calls, start=2):
        messages.append({"jsonrpc": "2.0", "id": index, "method": "tools/call",
                         "params": {"name": name, "arguments": arguments}})
    return messages


def test_planted_secrets_appear_in_no_output(tmp_path: Path) -> None:
    evidence, carriers = tmp_path / "evidence", tmp_path / "carriers.ndjson"
    stdin = "".join(json.dumps(m) + "\n" for m in _requests())
    env = child_env({"DRAWBRIDGE_TDT_HMAC_KEY": HMAC_KEY, "DRAWBRIDGE_TDT_HMAC_KEY_ID": "planted-kid"})
    process = subprocess.Popen(
        [PYTHON, "-m", "drawbridge", "wrap", "--verbose", "--policy", str(POLICIES), "--agent", "demo-agent",
         "--evidence-dir", str(evidence), "--tool-decision-truth-out", str(carriers), "--", *GITHUB_LIKE],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(stdin)
    process.stdin.flush()
    lines = []
    while len([line for line in lines if '"id"' in line and '"method"' not in line]) < 8:
        line = process.stdout.readline()
        assert line, "the gateway stopped before answering every request"
        lines.append(line)
    process.stdin.close()
    stderr = process.stderr.read() if process.stderr else ""
    assert process.wait(timeout=scaled(30)) == 0, stderr
    result = subprocess.CompletedProcess(process.args, 0, "".join(lines), stderr)
    answers = [json.loads(line) for line in result.stdout.splitlines()]
    by_id = {a.get("id"): a for a in answers if "id" in a}
    assert set(by_id) >= set(range(8)), "every request was answered"
    assert not by_id[2]["result"].get("isError")  # the read ran
    assert all(by_id[i]["result"]["isError"] for i in (3, 4, 5, 6))  # refusals
    assert by_id[7]["error"]["code"] == -32602 and "unknown tool" in by_id[7]["error"]["message"]

    gateway_outputs = {
        "stderr": result.stderr.encode(),
        # The agent sees the upstream's own answer to the allowed read; only the gateway's answers are scanned.
        "refusals": json.dumps([by_id[i] for i in (3, 4, 5, 6, 7)]).encode(),
        "carriers": carriers.read_bytes(),
    }
    for path in evidence.rglob("*"):
        if path.is_file():
            gateway_outputs[str(path.relative_to(evidence))] = path.read_bytes()
    assert {"trace.ndjson", "tool-decisions.ndjson"} <= set(gateway_outputs)
    planted = [HMAC_KEY, TITLE_SECRET, KEY_MATERIAL, "PLANTED", *ARG_SECRETS.values()]
    for name, data in gateway_outputs.items():
        for secret in planted:
            assert secret.encode() not in data, f"{secret[:12]}... leaked into {name}"
    # The schema refusal says where and which keyword, not the value.
    refusal = by_id[5]["result"]["content"][0]["text"]
    assert "title" in refusal and "maxLength" in refusal
