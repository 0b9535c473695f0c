"""The public surface of drawbridge.evidence: every listed name imports and is what the README says.

The README's "Evidence" section lists the names importable from ``drawbridge.evidence`` (and names
``drawbridge.canonical`` for canonical JSON and digests). Each listed name must be exported and be
the very object its home module defines, and calls through the public names must give the values the
formats document, computed here without drawbridge (``hashlib``, ``hmac``, the ``rfc8785`` package,
and the reference values printed in docs/side-effect-subjects.md).
"""

from __future__ import annotations

import hashlib
import hmac
import importlib
import json
import re
from pathlib import Path

import rfc8785

import drawbridge.canonical as canonical
import drawbridge.evidence as evidence

README = Path(__file__).resolve().parent.parent / "README.md"

HOMES = {
    # surface records
    "classify": "drawbridge.evidence.classify", "Classification": "drawbridge.evidence.classify",
    "target_hash": "drawbridge.evidence.classify", "correlation_from_params": "drawbridge.evidence.correlation",
    "build_decision": "drawbridge.evidence.surface", "build_surface": "drawbridge.evidence.surface",
    "Effect": "drawbridge.evidence.surface",
    # side effects
    **dict.fromkeys(["SideEffect", "SideEffectLevel"], "drawbridge.evidence.side_effect"),
    **dict.fromkeys(
        ["subject_from_action", "binding_digest", "check_audit_record", "promote_with_audit_record",
         "promote_with_observed_read"],
        "drawbridge.evidence.audit_binding",
    ),
    "load_audit_records": "drawbridge.evidence.audit_import",
    "verify_side_effects": "drawbridge.evidence.side_effect_verify",
    # truth
    "parse_assay_policy": "drawbridge.evidence.truth.assay_policy",
    "declared_policy_digest": "drawbridge.evidence.truth.declared",
    "matches_tool_pattern": "drawbridge.evidence.truth.patterns", "Evidence": "drawbridge.evidence.truth.evidence",
    "decision_verdict": "drawbridge.evidence.truth.verdict", "run_verdict": "drawbridge.evidence.truth.verdict",
    **dict.fromkeys(
        ["args_digest", "observed_input_digest", "build_carrier", "validate_carrier", "carrier_content_digest",
         "decision_identity_digest"],
        "drawbridge.evidence.truth.carrier",
    ),
    "pack_recipe_row": "drawbridge.evidence.truth.pack", "verify_recipe_row": "drawbridge.evidence.truth.pack",
    "verify_carriers": "drawbridge.evidence.truth.vectors", "verify_tdt_document": "drawbridge.evidence.truth.vectors",
    "project_tool_decision_truth": "drawbridge.evidence.truth.otel",
    # trace chain
    **dict.fromkeys(
        ["make_entry", "verify_chain", "make_checkpoint", "ChainHead", "ChainReport", "ChainProblem", "GENESIS_HASH"],
        "drawbridge.evidence.chain",
    ),
}
"""Where each name the README lists is defined."""


def _readme_evidence_names() -> dict[str, list[str]]:
    """Area -> names, from the table under "The same functions are importable from ..."."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Evidence, verified offline") :]
    table = section[section.index("The same functions are importable from `drawbridge.evidence`") :]
    table = table[: table.index("\n\n", table.index("| area |"))]
    areas: dict[str, list[str]] = {}
    rows = [row for row in table.splitlines() if row.startswith("|")]
    assert rows[0].replace(" ", "") == "|area|names|" and set(rows[1]) <= set("|- ")
    for row in rows[2:]:
        _, area, names, _ = row.split("|")
        areas[area.strip()] = re.findall(r"`([A-Za-z_]+)`", names)
    return areas


def test_every_public_name_resolves() -> None:
    areas = _readme_evidence_names()
    assert list(areas) == ["surface records", "side effects", "truth", "trace chain"]
    listed = [name for names in areas.values() for name in names]
    assert len(listed) == len(set(listed)) == 40
    # The README lists exactly what the package exports, and each name is its home's own object.
    assert sorted(listed) == sorted(evidence.__all__)
    assert set(listed) == set(HOMES)
    for name in listed:
        home = importlib.import_module(HOMES[name])
        assert getattr(evidence, name) is getattr(home, name), name
        if callable(getattr(home, name)):
            assert getattr(home, name).__module__ == HOMES[name], name
    assert evidence.GENESIS_HASH == "sha256:" + "0" * 64


def test_the_canonical_names_the_readme_gives_are_the_canonical_packages_own() -> None:
    text = README.read_text(encoding="utf-8")
    line = next(line for line in text.splitlines() if line.startswith("Canonical JSON and digests live in"))
    named = re.findall(r"`([A-Za-z_]+)`", line.split("(", 1)[1])
    assert named == ["canonical_bytes", "jcs_digest"]
    jcs = importlib.import_module("drawbridge.canonical.jcs")
    digests = importlib.import_module("drawbridge.canonical.digests")
    assert canonical.canonical_bytes is jcs.canonical_bytes
    assert canonical.jcs_digest is digests.jcs_digest
    assert set(named) <= set(canonical.__all__)
    for name in canonical.__all__:
        value = getattr(canonical, name)
        if callable(value):
            assert value.__module__.startswith("drawbridge.canonical."), name


def test_canonical_json_and_digests_through_the_public_names() -> None:
    value = {"b": [1.0, 2**64, -0.0, 1e21, 1e-7], "a": "\u2028\x1f\"\\", "\U0001f600": 1, "\uff41": 2, "é": None}
    # JCS by hand: keys in UTF-16 order (U+1F600 is D83D DE00, before U+FF41), numbers in ECMAScript
    # form (2^64 as the nearest double), only '"', '\' and controls escaped.
    expected = (
        '{"a":"\u2028\\u001f\\"\\\\","b":[1,18446744073709552000,0,1e+21,1e-7],"\u00e9":null,'
        '"\U0001f600":1,"\uff41":2}'
    ).encode()
    assert canonical.canonical_bytes(value) == expected
    assert rfc8785.dumps({**value, "b": [1.0, float(2**64), -0.0, 1e21, 1e-7]}) == expected
    assert canonical.jcs_digest(value) == "sha256:" + hashlib.sha256(expected).hexdigest()


def test_digests_of_the_truth_format_through_the_public_names() -> None:
    key, key_id = b"k" * 32, "kid-1"
    args = {"repo": "api", "token": "ghp_dropped", "n": 2**53 + 1}
    preimage = b'assay.tool_args.v0:kid-1:{"n":9007199254740992,"repo":"api"}'  # the secret key dropped
    digest = f"hmac-sha256:{key_id}:" + hmac.new(key, preimage, "sha256").hexdigest()
    assert evidence.args_digest(args, key, key_id) == digest
    observed = "sha256:" + hashlib.sha256(
        rfc8785.dumps({"tool_name": "deploy", "args_digest": digest, "order": 7})
    ).hexdigest()
    assert evidence.observed_input_digest("deploy", digest, 7) == observed
    declared = "sha256:" + hashlib.sha256(
        b'{"enforcement":{"unconstrained_tools":"warn"},"schemas":{},"tools":{"allow":["deploy"]},"version":"2.0"}'
    ).hexdigest()
    assert evidence.declared_policy_digest({"version": "2.0", "tools": {"allow": ["deploy"]}}) == declared
    pair = {"observed_input_digest": observed, "declared_policy_digest": declared}
    assert evidence.decision_identity_digest(observed, declared) == (
        "sha256:" + hashlib.sha256(rfc8785.dumps(pair)).hexdigest()
    )
    carrier = evidence.build_carrier(
        tool_name="deploy", args=args, order=7, declared_policy_digest=declared, key=key, key_id=key_id,
        source_class="authoritative_boundary", call_id="c-1", result_status="ok", identity_state="present",
    )
    assert carrier == {
        "schema": "assay.tool_decision_truth.v0", "tool_name": "deploy", "args_digest": digest, "order": 7,
        "source_class": "authoritative_boundary", "call_id": "c-1", "result_status": "ok",
        "identity_state": "present", "key_id": key_id, "declared_ref": None, "decision_verdict": None,
        "observed_input_digest": observed, "declared_policy_digest": declared, "decision_identity": pair,
    }
    assert list(carrier) == list(carrier.keys()) and list(carrier)[:3] == ["schema", "tool_name", "args_digest"]
    assert evidence.validate_carrier(carrier) == []
    assert evidence.carrier_content_digest(carrier) == "sha256:" + hashlib.sha256(rfc8785.dumps(carrier)).hexdigest()


def test_the_trace_chain_through_the_public_names() -> None:
    at = "2026-01-01T00:00:00Z"
    first = evidence.make_entry(None, "tool_decision", at, {"tool": "echo", "n": 1.0})
    assert list(first) == ["schema", "seq", "prev_hash", "kind", "at", "body", "entry_hash"]
    unhashed = {key: value for key, value in first.items() if key != "entry_hash"}
    assert unhashed == {"schema": "drawbridge.trace_entry.v0", "seq": 0, "prev_hash": "sha256:" + "0" * 64,
                        "kind": "tool_decision", "at": at, "body": {"tool": "echo", "n": 1}}
    assert first["entry_hash"] == "sha256:" + hashlib.sha256(rfc8785.dumps(unhashed)).hexdigest()
    head = evidence.ChainHead(seq=0, entry_hash=first["entry_hash"])
    second = evidence.make_entry(head, "policy_edit", at, {})
    assert (second["seq"], second["prev_hash"]) == (1, first["entry_hash"])
    lines = [(json.dumps(entry, separators=(",", ":"), ensure_ascii=False) + "\n").encode() for entry in (first, second)]
    report = evidence.verify_chain(lines)
    assert report == evidence.ChainReport(
        ok=True, entries=2, head=evidence.ChainHead(1, second["entry_hash"]), first_problem=None
    )
    tampered = [lines[0].replace(b'"tool":"echo"', b'"tool":"ech0"'), lines[1]]
    broken = evidence.verify_chain(tampered)
    assert (broken.ok, broken.entries, broken.first_problem.code, broken.first_problem.line) == (
        False, 0, "hash_mismatch", 1
    )
    assert evidence.make_checkpoint(head, at) == {
        "schema": "drawbridge.trace_checkpoint.v0", "seq": 0, "entry_hash": first["entry_hash"], "at": at,
    }


def test_public_functions_work_together() -> None:
    # docs/side-effect-subjects.md's example (Assay's reference fixtures): its title hash and subject digest.
    assert evidence.target_hash("github_key_title", "  CI-Key\u2003") == (
        "sha256:" + hashlib.sha256(b"assay.tool_target.v0:github_key_title:ci-key").hexdigest()
    )
    title_hash = "sha256:a65a94d25524f87fbb5ce6d3fde202c02a5b532f27e1ba3b5708076e1ba75ccf"
    assert evidence.target_hash("github_key_title", "ci-key") == title_hash
    decision = evidence.build_decision(
        server_id="github", tool_name="add_deploy_key",
        arguments={"owner": "org", "repo": "prod-repo", "title": "ci-key", "key": "ssh-ed25519 AAAA"},
        params={}, effect="allow", status="success",
    )
    assert decision["tool"] == {"name": "add_deploy_key", "category": "github_deploy_key"}
    assert decision["classification"] == "classified"
    assert decision["action"] == {
        "class": "privileged_admin_action", "verb": "create", "resource_type": "github_deploy_key",
        "target": {"provider": "github", "owner": "org", "repo": "prod-repo", "key_title_hash": title_hash},
        "required_scope": "repo:deploy_key:write",
    }
    assert decision["decision"]["effect"] == "allow"
    assert decision["response"]["side_effect"]["level"] == "asserted"
    subject = evidence.subject_from_action(decision["action"])
    assert subject == {"action_class": "github_deploy_key", "verb": "create",
                       "target": {"owner": "org", "repo": "prod-repo", "key_title_hash": title_hash}}
    assert evidence.binding_digest(subject) == "sha256:31f2007b91477601789c8803c3e32912a8a4510851cc55397d49a65bbc5e4ec3"
    doc = evidence.build_surface([decision])
    assert doc["schema"] == "assay.tool_decision_surface.v0"
    assert doc["observed_tool_decisions"] == [decision]
    report = evidence.verify_side_effects(doc, [])
    assert report["ok"] is True
    assert (report["audit_records_imported"], report["promoted"]) == (0, 0)
    assert [(call["tool"], call["level_before"], call["level"]) for call in report["calls"]] == [
        ("add_deploy_key", "asserted", "asserted")
    ]
    assert "ssh-ed25519" not in json.dumps(doc) and "AAAA" not in json.dumps(doc)
