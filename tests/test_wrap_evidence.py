"""`drawbridge wrap` writes live evidence that verifies offline, and keeps its key from the server."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import GITHUB_LIKE, PYTHON, child_env, connect, scaled, wrap_params

POLICIES = Path(__file__).resolve().parent.parent / "src" / "drawbridge" / "examples" / "policies"
SECRET = "ghp_wrap_evidence_" + "9" * 30
KEY = "wrap-evidence-test-key-0123456789"
KEY_ENV = {"DRAWBRIDGE_TDT_HMAC_KEY": KEY, "DRAWBRIDGE_TDT_HMAC_KEY_ID": "wrap-kid-1"}

pytestmark = pytest.mark.anyio


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "drawbridge", *args], capture_output=True, text=True, timeout=scaled(60))


async def test_live_evidence_verifies_and_holds_no_secret(tmp_path: Path) -> None:
    evidence, carriers = tmp_path / "evidence", tmp_path / "carriers.ndjson"
    params = wrap_params(
        GITHUB_LIKE, "--policy", str(POLICIES), "--agent", "demo-agent", "--evidence-dir", str(evidence),
        "--tool-decision-truth-out", str(carriers), "--server-id", "github", "--fsync", "batch", env=KEY_ENV,
    )
    async with connect(params) as client:
        await client.list_tools()
        listed = await client.call_tool("list_repos", {"owner": "acme", "token": SECRET})
        assert not listed.is_error
        refused = await client.call_tool("delete_repo", {"owner": "acme", "name": "rocket", "password": SECRET})
        assert refused.is_error
        held = await client.call_tool(
            "add_deploy_key", {"owner": "acme", "repo": "rocket", "title": "ci", "key": "ssh-ed25519 AAAA", "api_key": SECRET}
        )
        assert held.is_error and "approval unavailable" in held.content[0].text
        assert SECRET not in refused.content[0].text + held.content[0].text

    trace = evidence / "trace.ndjson"
    everything = [json.loads(line) for line in trace.read_text().splitlines()]
    # The process's run: opened before the first call, sealed at its clean end.
    assert [everything[0]["kind"], everything[-1]["kind"]] == ["run_start", "run_end"]
    assert everything[-1]["body"]["run_id"] == everything[0]["body"]["run_id"]
    entries = [e for e in everything if e["kind"] == "tool_decision"]
    assert [e["body"]["tool"] for e in entries] == ["list_repos", "delete_repo", "add_deploy_key"]
    assert [e["body"]["action"] for e in entries] == ["allow", "deny", "human_approval"]
    assert entries[1]["body"]["policy"] == "demo" and entries[1]["body"]["rule_index"] == 3
    assert all(e["body"]["args_digest"].startswith("hmac-sha256:wrap-kid-1:") for e in entries)

    surface = [json.loads(line)["observed_tool_decisions"][0] for line in (evidence / "tool-decisions.ndjson").read_text().splitlines()]
    assert [d["server"]["id"] for d in surface] == ["github"] * 3
    assert surface[0]["response"]["side_effect_asserted"] is True
    assert surface[1]["decision"]["effect"] == "deny"
    assert surface[2]["classification"] == "classified" and surface[2]["action"]["target"]["repo"] == "rocket"

    lines = carriers.read_text().splitlines()
    assert len(lines) == 3
    assert [json.loads(line)["identity_state"] for line in lines] == ["present"] * 3
    # Field order on disk is the documented insertion order (digests use JCS regardless).
    assert list(json.loads(lines[0]))[:3] == ["schema", "tool_name", "args_digest"]

    for path in (trace, evidence / "tool-decisions.ndjson", carriers):
        data = path.read_bytes()
        assert SECRET.encode() not in data and KEY.encode() not in data

    assert _cli("evidence", "verify-chain", str(trace)).returncode == 0
    assert _cli("evidence", "verify-tdt", str(carriers)).returncode == 0
    assert _cli("evidence", "verify-side-effects", str(evidence / "tool-decisions.ndjson")).returncode == 0
    tampered = bytearray(trace.read_bytes())
    tampered[len(tampered) // 2] ^= 0x01
    trace.write_bytes(bytes(tampered))
    assert _cli("evidence", "verify-chain", str(trace)).returncode == 1


def _env_dump_server(out: Path) -> list[str]:
    code = f"import os, json; json.dump(sorted(os.environ), open({str(out)!r}, 'w'))"
    return [PYTHON, "-c", code]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "DRAWBRIDGE_TDT_HMAC_KEY is missing"),
        ({"DRAWBRIDGE_TDT_HMAC_KEY": ""}, "DRAWBRIDGE_TDT_HMAC_KEY is empty"),
        ({"DRAWBRIDGE_TDT_HMAC_KEY": KEY}, "DRAWBRIDGE_TDT_HMAC_KEY_ID is missing"),
        ({"DRAWBRIDGE_TDT_HMAC_KEY": KEY, "DRAWBRIDGE_TDT_HMAC_KEY_ID": "bad id!"}, "malformed"),
        ({"ASSAY_TDT_HMAC_KEY": KEY}, "ASSAY_TDT_HMAC_KEY_ID is missing"),
    ],
)
def test_truth_producer_fails_closed_before_spawning(tmp_path: Path, env: dict[str, str], message: str) -> None:
    marker = tmp_path / "spawned.json"
    base = {k: v for k, v in child_env().items() if "TDT_HMAC" not in k}
    result = subprocess.run(
        [PYTHON, "-m", "drawbridge", "wrap", "--allow-all", "--tool-decision-truth-out", str(tmp_path / "c.ndjson"),
         "--", *_env_dump_server(marker)],
        capture_output=True, text=True, timeout=scaled(60), env={**base, **env}, stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 2
    assert message in result.stderr
    assert KEY not in result.stderr
    assert not marker.exists(), "the server was spawned although the producer is misconfigured"


def test_unwritable_sink_fails_closed(tmp_path: Path) -> None:
    marker = tmp_path / "spawned.json"
    result = subprocess.run(
        [PYTHON, "-m", "drawbridge", "wrap", "--allow-all", "--tool-decision-truth-out", str(tmp_path),
         "--", *_env_dump_server(marker)],
        capture_output=True, text=True, timeout=scaled(60), env=child_env(KEY_ENV), stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 2 and "sink" in result.stderr
    assert not marker.exists()


@pytest.mark.parametrize("family", ["DRAWBRIDGE", "ASSAY"])
def test_key_never_reaches_the_server(tmp_path: Path, family: str) -> None:
    seen = tmp_path / "env.json"
    env = {f"{family}_TDT_HMAC_KEY": KEY, f"{family}_TDT_HMAC_KEY_ID": "kid-2"}
    result = subprocess.run(
        [PYTHON, "-m", "drawbridge", "wrap", "--allow-all", "--tool-decision-truth-out", str(tmp_path / "c.ndjson"),
         "--", *_env_dump_server(seen)],
        capture_output=True, text=True, timeout=scaled(60), env=child_env(env), stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr
    names = json.loads(seen.read_text())
    assert not [name for name in names if "TDT_HMAC" in name]
    assert "PATH" in names


def test_a_demo_dir_that_cannot_be_made_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    result = subprocess.run(
        [PYTHON, "-m", "drawbridge", "demo", "--dir", str(tmp_path / "afile" / "d")], capture_output=True, text=True,
        timeout=scaled(60), env=child_env(),
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "cannot create" in result.stderr and "Not a directory" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_demo_command_passes(tmp_path: Path) -> None:
    result = subprocess.run(
        [PYTHON, "-m", "drawbridge", "demo", "--dir", str(tmp_path)], capture_output=True, text=True, timeout=scaled(120),
        env=child_env(),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "demo passed" in result.stdout
    assert result.stdout.count("VERIFIED") == 5
    evidence = next(tmp_path.glob("run-*/evidence"))
    # wrap's default state file lives inside its evidence directory (approvals, grants, memory), with
    # the folder of the running gateways' instance locks beside it, empty once the demo's wrap ended
    assert {p.name for p in evidence.iterdir()} == {
        "trace.ndjson", "tool-decisions.ndjson", "carriers.ndjson", "drawbridge.db", "keys", "checkpoint",
        "checkpoints.ndjson", "drawbridge.db.instances",
    }
    assert not any((evidence / "drawbridge.db.instances").iterdir())


async def test_lone_surrogates_from_the_agent_neither_break_the_evidence_nor_reach_it(tmp_path: Path) -> None:
    """JSON lets a string hold half a UTF-16 pair (``"\\ud800"``), which is no Unicode text and has no
    canonical form: a call that carries one is refused as invalid, its record holds U+FFFD instead,
    and the calls after it are served and recorded as usual."""
    from conftest import raw_pipe

    evidence, carriers = tmp_path / "evidence", tmp_path / "carriers.ndjson"
    argv = [
        PYTHON, "-m", "drawbridge", "wrap", "--policy", str(POLICIES), "--agent", "demo-agent",
        "--evidence-dir", str(evidence), "--tool-decision-truth-out", str(carriers), "--", *GITHUB_LIKE,
    ]
    call = b'{"jsonrpc":"2.0","id":%s,"method":"tools/call","params":{"name":"list_repos","arguments":%s}}\n'
    async with raw_pipe(argv, env=KEY_ENV) as pipe:
        await pipe.initialize()
        for request_id, arguments in (
            (b'"r\\ud800"', b'{"owner":"acme"}'),  # in the id the agent chose
            (b"2", b'{"owner":"ac\\udc00me"}'),  # in an argument
            (b"3", b'{"\\ud83d":"x","owner":"acme"}'),  # in an argument's name
        ):
            await pipe.send(call % (request_id, arguments))
            answer = await pipe.recv()
            assert answer["error"]["code"] == -32602, answer
            assert "lone surrogate" in answer["error"]["message"]
        await pipe.send(call % (b'"r\\ud83d\\ude00"', b'{"owner":"acme \\ud83d\\ude00"}'))  # a whole pair is fine
        answer = await pipe.recv()
        while "id" not in answer:  # the server's log notification comes first
            answer = await pipe.recv()
        assert answer["id"] == "r\U0001F600" and not answer["result"].get("isError"), answer
    entries = [json.loads(line) for line in (evidence / "trace.ndjson").read_text().splitlines()]
    entries = [entry["body"] for entry in entries if entry["kind"] == "tool_decision"]
    assert [e["outcome"] for e in entries] == ["invalid", "invalid", "invalid", "ok"]
    assert entries[0]["request_id"] == "r\ufffd" and entries[3]["request_id"] == "r\U0001F600"
    assert len(carriers.read_text().splitlines()) == 1  # the one call that was decided
    assert _cli("evidence", "verify-chain", str(evidence / "trace.ndjson")).returncode == 0
    assert _cli("evidence", "verify-tdt", str(carriers)).returncode == 0
    assert _cli("evidence", "verify-side-effects", str(evidence / "tool-decisions.ndjson")).returncode == 0
