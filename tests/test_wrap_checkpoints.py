"""A real ``drawbridge wrap`` signs its trace: a run opened at start and sealed at a clean end, a checkpoint
every N lines, one served at ``GET /evidence/checkpoint`` for an auditor to keep, and that copy later
proves the trace was neither cut nor rewritten."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest
from approval_support import ControlPlane, cli, wrap_flags, write_policy
from conftest import GITHUB_LIKE, PYTHON, SERVERS, child_env, connect, eventually_async, scaled, wrap_params
from serve_support import free_port

from drawbridge.evidence.chain import split_lines
from drawbridge.evidence.tlog import open_checkpoint
from drawbridge.state.checkpoint_files import parse_checkpoint_lines
from drawbridge.state.signing_keys import read_vkey

pytestmark = pytest.mark.anyio


async def test_a_wrapped_run_is_signed_served_and_sealed(tmp_path: Path) -> None:
    evidence, port = tmp_path / "evidence", free_port()
    flags = wrap_flags(write_policy(tmp_path), evidence, "--control-port", str(port), "--checkpoint-every-lines", "2")
    control = ControlPlane(port, evidence)
    held = tmp_path / "held-by-the-auditor.note"
    async with connect(wrap_params(GITHUB_LIKE, *flags)) as client:
        for owner in ("acme", "zeta", "acme"):
            await client.call_tool("list_repos", {"owner": owner})
        async def checkpoint() -> httpx.Response:
            async with httpx.AsyncClient(trust_env=False, timeout=scaled(10)) as http:
                return await http.get(control.url + "/evidence/checkpoint", headers=control.headers())

        # not listening yet, or its token file not made yet
        response = await eventually_async(checkpoint, scaled(30), "the checkpoint served", ignoring=(httpx.HTTPError, OSError))
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
        held.write_text(response.text)
        await client.call_tool("list_repos", {"owner": "omega"})

    verifier = read_vkey(evidence / "keys" / "checkpoint.vkey")
    served = open_checkpoint(held.read_text(), verifier)
    # run_start, the policy set it starts with, and three calls: every line written when it was asked
    assert served.size == 5
    lines = split_lines((evidence / "trace.ndjson").read_bytes())
    kinds = [json.loads(line)["kind"] for line in lines]
    assert kinds[0] == "run_start" and kinds[1] == "mesh.policy_set" and kinds[-1] == "run_end"
    history = parse_checkpoint_lines((evidence / "checkpoints.ndjson").read_bytes(), "checkpoints.ndjson")
    assert len(history) >= 3 and history[-1].tree_size == len(lines)  # every 2 lines, and the seal
    assert [h.tree_size for h in history] == sorted({h.tree_size for h in history})
    done = cli("evidence", "verify-chain", str(evidence / "trace.ndjson"), "--known-checkpoint", str(held),
               "--format", "json")
    report = json.loads(done.stdout)
    assert done.returncode == 0, report["problems"]
    assert report["runs"][0]["state"] == "sealed" and report["known_checkpoints"][0]["finding"] == "consistent"

    # The private keys are in their own files only: no record, checkpoint or served answer holds them.
    from drawbridge.state.signing_keys import load_keys

    keys = load_keys(evidence / "keys")
    secrets = [keys.checkpoint.key.private_bytes_raw(), keys.attestation.private_bytes_raw()]
    import base64

    forms = [form for raw in secrets for form in (raw, raw.hex().encode(), base64.b64encode(raw)[:40])]
    for path in evidence.rglob("*"):
        if path.is_file() and path.suffix != ".key":
            assert not [form for form in forms if form in path.read_bytes()], path
    assert not [form for form in forms if form in held.read_bytes()]

    # The auditor's copy catches what the evidence directory alone cannot: the tail cut by its owner.
    (evidence / "trace.ndjson").write_bytes(b"".join(lines[:3]))
    done = cli("evidence", "verify-chain", str(evidence / "trace.ndjson"), "--known-checkpoint", str(held))
    assert done.returncode == 1 and "cut tail" in done.stdout


async def test_every_run_of_a_directory_is_signed_by_its_one_origin(tmp_path: Path) -> None:
    evidence = tmp_path / "evidence"
    argv = [PYTHON, "-m", "drawbridge", "wrap", "--allow-all", "--evidence-dir", str(evidence), "--fsync", "never",
            "--", PYTHON, str(SERVERS / "notebook.py")]
    for _ in range(2):
        done = subprocess.run(argv, input="", capture_output=True, text=True, env=child_env(), timeout=scaled(60))
        assert done.returncode == 0, done.stderr
    report = json.loads(cli("evidence", "verify-chain", str(evidence / "trace.ndjson"), "--format", "json").stdout)
    assert report["ok"] and [run["state"] for run in report["runs"]] == ["sealed", "sealed"]
    assert report["runs"][0]["run_id"] != report["runs"][1]["run_id"]
    origins = {json.loads(line)["body"]["origin"] for line in split_lines((evidence / "trace.ndjson").read_bytes())
               if b'"kind":"run_start"' in line}
    assert origins == {report["checkpoint"]["origin"]}
    printed = cli("evidence", "keys", "--evidence-dir", str(evidence))
    assert printed.returncode == 0 and report["checkpoint"]["key"] in printed.stdout


@pytest.mark.parametrize("command", ["wrap", "serve"])
def test_a_key_file_others_may_read_is_a_one_line_startup_error(tmp_path: Path, command: str) -> None:
    evidence = tmp_path / "evidence"
    notebook = [PYTHON, str(SERVERS / "notebook.py")]
    wrap = [PYTHON, "-m", "drawbridge", "wrap", "--allow-all", "--evidence-dir", str(evidence), "--", *notebook]
    assert subprocess.run(wrap, input="", capture_output=True, text=True, env=child_env(), timeout=scaled(60)).returncode == 0
    (evidence / "keys" / "attestation.key").chmod(0o644)
    if command == "wrap":
        argv = wrap
    else:
        (tmp_path / "policies").mkdir()
        config = tmp_path / "drawbridge.yaml"
        config.write_text(json.dumps({
            "upstreams": [{"name": "nb", "transport": "stdio", "command": notebook[0], "args": notebook[1:]}],
            "policy_dir": "./policies", "evidence_dir": str(evidence), "state_path": str(tmp_path / "state.db"),
        }))
        argv = [PYTHON, "-m", "drawbridge", "serve", "--config", str(config), "--stdio"]
    before = (evidence / "trace.ndjson").read_bytes()
    done = subprocess.run(argv, input="", capture_output=True, text=True, env=child_env(), timeout=scaled(60))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "attestation.key" in lines[0] and "chmod 600" in lines[0]
    assert (evidence / "trace.ndjson").read_bytes() == before  # no run opened, nothing written


def _gateway_argv(tmp_path: Path, command: str, evidence: Path, keys_dir: Path | None) -> list[str]:
    notebook = [PYTHON, str(SERVERS / "notebook.py")]
    if command == "wrap":
        keys = ["--keys-dir", str(keys_dir)] if keys_dir is not None else []
        return [PYTHON, "-m", "drawbridge", "wrap", "--allow-all", "--evidence-dir", str(evidence), *keys, "--", *notebook]
    (tmp_path / "policies").mkdir(exist_ok=True)
    config = tmp_path / "drawbridge.yaml"
    settings: dict[str, object] = {
        "upstreams": [{"name": "nb", "transport": "stdio", "command": notebook[0], "args": notebook[1:]}],
        "policy_dir": "./policies", "evidence_dir": str(evidence), "state_path": str(tmp_path / "state.db"),
    }
    if keys_dir is not None:
        settings["checkpoints"] = {"keys_dir": str(keys_dir)}
    config.write_text(json.dumps(settings))
    return [PYTHON, "-m", "drawbridge", "serve", "--config", str(config), "--stdio"]


def _refused(argv: list[str], evidence: Path) -> str:
    before = (evidence / "trace.ndjson").read_bytes()
    done = subprocess.run(argv, input="", capture_output=True, text=True, env=child_env(), timeout=scaled(60))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert (evidence / "trace.ndjson").read_bytes() == before  # no run opened under the other keys
    return lines[0]


def _first_run(evidence: Path) -> str:
    wrap = [PYTHON, "-m", "drawbridge", "wrap", "--allow-all", "--evidence-dir", str(evidence), "--",
            PYTHON, str(SERVERS / "notebook.py")]
    assert subprocess.run(wrap, input="", capture_output=True, text=True, env=child_env(), timeout=scaled(60)).returncode == 0
    return read_vkey(evidence / "keys" / "checkpoint.vkey").name


@pytest.mark.parametrize("command", ["wrap", "serve"])
def test_keys_of_another_origin_on_an_existing_trace_are_a_one_line_startup_error(tmp_path: Path, command: str) -> None:
    """A log keeps its origin: keys made elsewhere (another origin) would sign the same trace as a second
    log, which no key verifies whole. The gateway refuses to start, naming both origins."""
    evidence = tmp_path / "evidence"
    origin = _first_run(evidence)
    other = tmp_path / "other"
    assert cli("evidence", "keys", "--init", "--keys-dir", str(other)).returncode == 0
    other_origin = read_vkey(other / "checkpoint.vkey").name
    line = _refused(_gateway_argv(tmp_path, command, evidence, other), evidence)
    assert repr(origin) in line and repr(other_origin) in line and "keeps its origin" in line, line
    assert "PRIVATE" not in line
    # An empty keys directory would get keys of a new origin: refused before any key is made.
    line = _refused(_gateway_argv(tmp_path, command, evidence, tmp_path / "empty"), evidence)
    assert repr(origin) in line and "holds no keys" in line and not (tmp_path / "empty" / "checkpoint.key").exists()
    # The trace's own keys still start it, and the whole log verifies under them.
    argv = _gateway_argv(tmp_path, command, evidence, evidence / "keys")
    assert subprocess.run(argv, input="", capture_output=True, text=True, env=child_env(), timeout=scaled(60)).returncode == 0
    report = json.loads(cli("evidence", "verify-chain", str(evidence / "trace.ndjson"), "--format", "json").stdout)
    assert report["ok"] and len(report["runs"]) == 2


@pytest.mark.parametrize("command", ["wrap", "serve"])
def test_another_key_pair_of_the_same_origin_is_a_one_line_startup_error(tmp_path: Path, command: str) -> None:
    """A log keeps its keys: a second key pair made with the log's own origin would sign checkpoints no
    pinned key verifies, and the log would never verify whole again. Told by the key hash of the latest
    checkpoint's signature: refused before a run is opened, naming both key hashes."""
    evidence = tmp_path / "evidence"
    origin = _first_run(evidence)
    own_hash = read_vkey(evidence / "keys" / "checkpoint.vkey").key_hash
    other = tmp_path / "other"
    assert cli("evidence", "keys", "--init", "--keys-dir", str(other), "--origin", origin).returncode == 0
    other_key = read_vkey(other / "checkpoint.vkey")
    assert other_key.name == origin and other_key.key_hash != own_hash
    line = _refused(_gateway_argv(tmp_path, command, evidence, other), evidence)
    assert f"{own_hash:08x}" in line and f"{other_key.key_hash:08x}" in line and "keeps its keys" in line, line
    assert "PRIVATE" not in line
    # The log's own keys still start it, and the whole log verifies under them.
    argv = _gateway_argv(tmp_path, command, evidence, evidence / "keys")
    assert subprocess.run(argv, input="", capture_output=True, text=True, env=child_env(), timeout=scaled(60)).returncode == 0
    report = json.loads(cli("evidence", "verify-chain", str(evidence / "trace.ndjson"), "--format", "json").stdout)
    assert report["ok"] and len(report["runs"]) == 2


@pytest.mark.parametrize("command", ["wrap", "serve", "export"])
def test_an_attestation_key_that_is_not_its_public_files_is_refused(tmp_path: Path, command: str) -> None:
    """attestation.pub.pem is what auditors pin: an attestation.key swapped beside it would sign exports no
    pinned key verifies. Checked at load, as checkpoint.key is against checkpoint.vkey."""
    evidence = tmp_path / "evidence"
    _first_run(evidence)
    other = tmp_path / "other"
    assert cli("evidence", "keys", "--init", "--keys-dir", str(other)).returncode == 0
    (evidence / "keys" / "attestation.key").write_bytes((other / "attestation.key").read_bytes())
    if command == "export":
        done = cli("evidence", "export", "--evidence-dir", str(evidence), "--out", str(tmp_path / "package"))
        assert done.returncode == 2 and not (tmp_path / "package").exists(), done.stderr
        line = done.stderr.strip()
    else:
        line = _refused(_gateway_argv(tmp_path, command, evidence, None), evidence)
    assert "attestation.pub.pem is not the public key of" in line and "attestation.key" in line, line
