"""observed_confirmed: a write confirmed only by a later, allowed, successful read of the same action
class and target in the same run; the confirming record names both trace entries, the auditor package
carries it and verify-export recomputes it; verify-side-effects does not credit it."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import rfc8785
from conftest import PYTHON, SERVERS, child_env, connect, scaled, wrap_params

from drawbridge.evidence.bundle import Producer, verify_bundle, write_bundle
from drawbridge.evidence.dsse import bundle_statement, export_statement, sign_statement
from drawbridge.evidence.export_verify import verify_export
from drawbridge.evidence.observed_read import read_subject
from drawbridge.evidence.side_effect_verify import verify_side_effects
from drawbridge.state.signing_keys import load_keys

pytestmark = pytest.mark.anyio
DEPLOY_KEYS = [PYTHON, str(SERVERS / "deploy_keys.py")]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def title_hash(title: str) -> str:
    return "sha256:" + sha(f"assay.tool_target.v0:github_key_title:{title.strip().lower()}".encode())


def test_a_read_keeps_the_digest_of_the_target_a_write_of_the_same_key_projects() -> None:
    target = {"key_title_hash": title_hash("ci"), "owner": "acme", "repo": "rocket"}
    expected = "sha256:" + sha(rfc8785.dumps({"action_class": "github_deploy_key", "target": target}))
    args = {"owner": "acme", "repo": "rocket", "title": "ci"}
    assert read_subject("get_deploy_key", args) == {"action_class": "github_deploy_key", "target_digest": expected}
    assert read_subject("gh.get_deploy_key", {**args, "title": " CI "}) == read_subject("get_deploy_key", args)
    assert read_subject("get_deploy_key", {**args, "title": "other"})["target_digest"] != expected  # type: ignore[index]
    assert read_subject("list_deploy_keys", {"owner": "acme", "repo": "rocket"})["target_digest"] != expected  # type: ignore[index]
    assert read_subject("add_deploy_key", args) is None  # a write is no read
    assert read_subject("get_deploy_key", {"owner": "acme"}) is None  # nothing to project


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "drawbridge", *args], capture_output=True, text=True, timeout=scaled(180),
                          env=child_env())


CALLS: list[tuple[str, dict[str, Any], bool]] = [
    ("get_deploy_key", {"owner": "acme", "repo": "zeta", "title": "t1"}, False),  # 1 a read before the write
    ("add_deploy_key", {"owner": "acme", "repo": "zeta", "title": "t1", "key": "ssh-ed25519 A"}, True),  # 2
    ("add_deploy_key", {"owner": "acme", "repo": "rocket", "title": "ci", "key": "ssh-ed25519 B"}, True),  # 3
    ("get_deploy_key", {"owner": "acme", "repo": "rocket", "title": "other"}, False),  # 4 another target
    ("list_deploy_keys", {"owner": "acme", "repo": "rocket"}, True),  # 5 no title: not the key's target
    ("get_deploy_key", {"owner": "acme", "repo": "rocket", "title": "ci"}, True),  # 6 confirms 3
    ("add_deploy_key", {"owner": "acme", "repo": "anvil", "title": "k", "key": "ssh-ed25519 C"}, True),  # 7
    ("get_deploy_key", {"owner": "acme", "repo": "anvil", "title": " K "}, False),  # 8 same target, failed
    ("get_deploy_key", {"owner": "acme", "repo": "old", "title": "seed"}, True),  # 9 succeeds, but before 10
    ("add_deploy_key", {"owner": "acme", "repo": "old", "title": "seed", "key": "ssh-ed25519 D"}, True),  # 10
]


@pytest.fixture
async def package(tmp_path: Path) -> tuple[Path, Path]:
    evidence = tmp_path / "evidence"
    params = wrap_params(DEPLOY_KEYS, "--allow-all", "--evidence-dir", str(evidence), "--fsync", "never")
    async with connect(params) as client:
        for tool, arguments, succeeds in CALLS:
            result = await client.call_tool(tool, arguments)
            assert bool(result.is_error) is not succeeds, (tool, arguments)
    done = cli("evidence", "export", "--evidence-dir", str(evidence), "--out", str(tmp_path / "package"))
    assert done.returncode == 0, done.stdout + done.stderr
    return evidence, tmp_path / "package"


def _files(package: Path) -> dict[str, bytes]:
    return {p.relative_to(package).as_posix(): p.read_bytes() for p in sorted(package.rglob("*")) if p.is_file()}


async def test_only_a_later_allowed_successful_read_of_the_same_target_confirms(package: tuple[Path, Path]) -> None:
    evidence, out = package
    done = cli("evidence", "verify-export", str(out), "--format", "json")
    report = json.loads(done.stdout)
    assert done.returncode == 0, report
    check = next(c for c in report["checks"] if c["id"] == "observed_confirmed")
    assert check["ok"] and check["detail"].startswith("1 write(s) confirmed")
    trace = [json.loads(line) for line in (evidence / "trace.ndjson").read_text().splitlines()]
    decisions = {e["seq"]: e["body"] for e in trace if e["kind"] == "tool_decision"}
    index = {n: seq for n, seq in enumerate(sorted(decisions), start=1)}  # call number -> trace index
    assert decisions[index[6]]["observed_read"]["action_class"] == "github_deploy_key"
    assert "observed_read" not in decisions[index[3]]  # a write keeps no read digest
    events = verify_bundle((out / "bundle.tar.gz").read_bytes()).events
    confirmed = [e["data"]["observed_tool_decisions"][0] for e in events
                 if "drawbridge.observed_read" in e["data"].get("observed_tool_decisions", [{}])[0]]
    assert len(confirmed) == 1
    (decision,) = confirmed
    assert decision["drawbridge.observed_read"] == {"trace_index": index[6], "write_trace_index": index[3]}
    subject = {"action_class": "github_deploy_key", "verb": "create",
               "target": {"owner": "acme", "repo": "rocket", "key_title_hash": title_hash("ci")}}
    assert decision["response"]["side_effect"] == {
        "asserted": True, "level": "observed_confirmed", "verification_source": "observed_read_followup",
        "verification_subject_digest": "sha256:" + sha(rfc8785.dumps(subject)),
        "irreversibility_class": "one_way_consequential",
    }
    assert decision["response"]["side_effect_verified"] is False
    # verify-side-effects recomputes every call from asserted: the confirmation is listed, not credited.
    surfaces = [d for e in events if e["type"] == "assay.tool_decision_surface.v0"
                for d in e["data"]["observed_tool_decisions"]]
    side = verify_side_effects({"schema": "assay.tool_decision_surface.v0", "observed_tool_decisions": surfaces,
                                "non_claims": []}, [])
    assert side["ok"] and side["levels_not_credited"] == 1 and side["levels_not_reproduced"] == 0
    assert {row["level"] for row in side["calls"]} == {"asserted"}


async def test_a_confirmation_is_its_write_and_binds_no_audit_record(package: tuple[Path, Path], tmp_path: Path) -> None:
    """The confirmed key (acme/rocket, title ci) has two provider records: the write takes one, and its
    confirmation, a restatement of that write, is no second call: it takes none, and is no decision."""
    evidence, _out = package
    subject = {"action_class": "github_deploy_key", "verb": "create",
               "target": {"owner": "acme", "repo": "rocket", "key_title_hash": title_hash("ci")}}
    audit = tmp_path / "audit"
    audit.mkdir()
    for record_id in ("gh-1", "gh-2"):
        record = {"schema": "assay.provider_audit_record.v0", "provider": "github", "record_id": record_id,
                  "subject": subject, "binding_digest": "sha256:" + sha(rfc8785.dumps(subject))}
        (audit / f"{record_id}.json").write_text(json.dumps(record))
    done = cli("evidence", "export", "--evidence-dir", str(evidence), "--audit-import", str(audit),
               "--out", str(tmp_path / "with-audit"))
    assert done.returncode == 0, done.stdout + done.stderr
    done = cli("evidence", "verify-export", str(tmp_path / "with-audit"), "--format", "json")
    report = json.loads(done.stdout)
    assert done.returncode == 0, report
    side = next(c for c in report["checks"] if c["id"] == "side_effects")
    assert side["detail"] == (f"{len(CALLS)} decisions (and 1 observed_confirmed restatement(s) of them), "
                              "1 verified through 2 audit record(s)"), side


async def test_a_confirmation_the_trace_does_not_support_fails_even_re_signed(package: tuple[Path, Path]) -> None:
    """The operator holds the keys: add a confirmation of the anvil key (whose read failed) and sign
    everything again. verify-export recomputes the confirmations from the trace: it fails."""
    evidence, out = package
    files = _files(out)
    verified = verify_bundle(files["bundle.tar.gz"])
    events = verified.events
    surfaces = [e for e in events if e["type"] == "assay.tool_decision_surface.v0"]
    genuine = next(e for e in surfaces if "drawbridge.observed_read" in e["data"]["observed_tool_decisions"][0])
    anvil = next(e for e in surfaces if (e["data"]["observed_tool_decisions"][0]["action"]["target"] or {}).get("repo")
                 == "anvil" and e["data"]["observed_tool_decisions"][0]["tool"]["name"] == "add_deploy_key")
    forged_record = json.loads(json.dumps(genuine["data"]))
    forged_record["observed_tool_decisions"][0]["action"] = anvil["data"]["observed_tool_decisions"][0]["action"]
    at = events.index(genuine) + 1
    forged_events = [*events[:at], {**genuine, "data": forged_record}, *events[at:]]
    renumbered = [{**e, "assayseq": seq, "id": f"{e['assayrunid']}:{seq}"} for seq, e in enumerate(forged_events)]
    from drawbridge.evidence.bundle import content_hash

    renumbered = [{**e, "assaycontenthash": content_hash(e["type"], e["data"])} for e in renumbered]
    keys = load_keys(evidence / "keys")
    bundle = write_bundle(renumbered, Producer(**verified.manifest["producer"]))
    forged = {**files, "bundle.tar.gz": bundle.archive,
              "bundle.tar.gz.intoto.json": sign_statement(bundle_statement(bundle.archive), keys.attestation)}
    del forged["export.intoto.json"]
    predicate = json.loads(base64.b64decode(json.loads(files["export.intoto.json"])["payload"]))["predicate"]
    forged["export.intoto.json"] = sign_statement(export_statement(forged, predicate), keys.attestation)
    report = verify_export(forged, vkey=keys.verifier, attestation_key=keys.attestation.public_key(), keys_pinned=True)
    failed = {check["id"] for check in report["checks"] if not check["ok"]}
    assert "observed_confirmed" in failed and "export_attestation" not in failed and "bundle_integrity" not in failed
