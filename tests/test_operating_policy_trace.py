"""The policy set a decision was made under is in the trace: a run starts with ``mesh.policy_set``
(its digest and each file's), a hand edit picked up by hot reload is ``mesh.policy_reload`` (files
changed, digest before and after), a control-plane edit's ``mesh.policy_edit`` carries the digest
after, and every ``tool_decision`` names the digest of the set that decided it (recomputed here from
the files' bytes); and ``policy set '*'`` edits the draft ``discover --generate-policy`` writes.

A real ``drawbridge serve`` subprocess in front of github_like; the trace is read from its file and
its chain checked with the library verifier (the run is still going).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from conftest import eventually, scaled
from serve_support import GITHUB, http_client, http_gateway, write_config

from drawbridge.evidence.chain import verify_chain

DRAFT = "name: draft\nagent: '*'\nrules:\n  - tools: ['github.list_repos']\n    action: allow\n"


def entries(evidence: Path) -> list[dict[str, Any]]:
    path = evidence / "trace.ndjson"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def wait_for_kind(evidence: Path, kind: str, count: int = 1) -> list[dict[str, Any]]:
    def enough() -> list[dict[str, Any]] | None:
        found = [entry for entry in entries(evidence) if entry["kind"] == kind]
        return found if len(found) >= count else None

    return eventually(enough, scaled(20), f"{count} {kind} entries")


def set_digest(policies: Path) -> str:
    """The policy set's digest as docs/configuration.md defines it, from the files' bytes: SHA-256 of the
    canonical JSON of {file name: sha256 of its text}."""
    files = {p.name: "sha256:" + hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(policies.glob("*.yaml"))}
    text = json.dumps(files, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def call_list_repos(url: str) -> None:
    async def call() -> None:
        async with http_client(url, "legacy") as client:
            await client.call_tool("github.list_repos", {"owner": "acme"})

    anyio.run(call)


def test_the_trace_names_the_policy_set_at_start_on_a_hand_edit_and_on_a_control_plane_edit(tmp_path: Path) -> None:
    evidence = tmp_path / "evidence"
    policies = tmp_path / "policies"
    config = write_config(
        tmp_path, [GITHUB], policies={"draft.yaml": DRAFT}, evidence_dir=str(evidence),
        auth={"anonymous_agent": "anon"},
    )
    with http_gateway(config) as running:
        assert running.url is not None
        start = wait_for_kind(evidence, "mesh.policy_set")[0]["body"]
        assert start["policy_set_digest"].startswith("sha256:") and list(start["files"]) == ["draft.yaml"]
        assert start["policy_set_digest"] == set_digest(policies)
        call_list_repos(running.url)
        decided = wait_for_kind(evidence, "tool_decision")[0]["body"]
        assert decided["policy_set_digest"] == start["policy_set_digest"]

        (tmp_path / "policies" / "extra.yaml").write_text(
            "name: extra\nagent: bob\nrules:\n  - tools: ['*']\n    action: deny\n", encoding="utf-8"
        )
        reload = wait_for_kind(evidence, "mesh.policy_reload")[0]["body"]
        assert reload["files_changed"] == ["extra.yaml"] and reload["loaded"] is True
        assert reload["policy_set_digest_before"] == start["policy_set_digest"]
        assert reload["policy_set_digest_after"] != start["policy_set_digest"]
        assert reload["policy_set_digest_after"] == set_digest(policies)
        call_list_repos(running.url)
        decided = wait_for_kind(evidence, "tool_decision", 2)[1]["body"]
        assert decided["policy_set_digest"] == reload["policy_set_digest_after"]

        edit = httpx.put(
            f"{running.control()}/policies/%2A/tools/github.delete_repo", json={"action": "deny", "by": "marc"},
            headers=running.control_headers(),
        )
        assert edit.status_code == 200, edit.text
        assert edit.json()["action_after"] == "deny" and edit.json()["source_file"] == "draft.yaml"
        edited = wait_for_kind(evidence, "mesh.policy_edit")[0]["body"]
        assert edited["policy_set_digest"] not in ("", reload["policy_set_digest_after"])
        assert "github.delete_repo" in (tmp_path / "policies" / "draft.yaml").read_text(encoding="utf-8")
        assert edited["policy_set_digest"] == set_digest(policies)
        call_list_repos(running.url)
        decided = wait_for_kind(evidence, "tool_decision", 3)[2]["body"]
        assert decided["policy_set_digest"] == edited["policy_set_digest"]
    with (evidence / "trace.ndjson").open("rb") as trace:
        report = verify_chain(trace)
    assert report.ok, report


def _digest_of_one_call(tmp_path: Path, run: str, env: dict[str, str]) -> str:
    evidence = tmp_path / run
    config = write_config(
        tmp_path, [GITHUB], policies={"draft.yaml": DRAFT}, evidence_dir=str(evidence),
        auth={"anonymous_agent": "anon"},
    )
    with http_gateway(config, env=env) as running:
        assert running.url is not None
        call_list_repos(running.url)
        decision = wait_for_kind(evidence, "tool_decision")[0]["body"]
    return str(decision["args_digest"])


def test_a_configured_digest_key_makes_digests_of_two_runs_match(tmp_path: Path) -> None:
    key_file = tmp_path / "digest.key"
    key_file.write_text("team-2026\n" + "ab" * 32 + "\n", encoding="ascii")
    key_file.chmod(0o600)
    configured = {"DRAWBRIDGE_ARGS_DIGEST_KEY_FILE": str(key_file)}
    first = _digest_of_one_call(tmp_path, "run1", configured)
    second = _digest_of_one_call(tmp_path, "run2", configured)
    assert first == second and first.startswith("hmac-sha256:team-2026:")
    ephemeral = _digest_of_one_call(tmp_path, "run3", {})
    assert ephemeral.startswith("hmac-sha256:ephemeral-") and ephemeral != first
    key_file.chmod(0o644)
    with pytest.raises(AssertionError, match="readable by others"):
        _digest_of_one_call(tmp_path, "run4", configured)
