"""Conformance vectors for the tool-decision surface and the side-effect receipt.

Each file under tests/vectors/surface/ and tests/vectors/side_effect/ holds one case: its inputs
and the expected output. The normal run recomputes every expectation from the committed inputs
and fails on any drift (including key order); ``DRAWBRIDGE_UPDATE_VECTORS=1`` rewrites the files
from the case definitions below, on purpose.

The expectations are not only our own output: every ``*_hash`` in an expected surface target is
recomputed here from the raw input with hashlib (evidence-formats.md §1.5), every binding digest
from hand-written JCS text (3.3), and the github subject's digest is the page's value.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from drawbridge.evidence import vocabulary as v
from drawbridge.evidence.audit_binding import (
    binding_digest,
    check_audit_record,
    promote_with_audit_record,
    promote_with_observed_read,
    subject_from_action,
)
from drawbridge.evidence.side_effect import SideEffect, producer_block
from drawbridge.evidence.side_effect_verify import verify_side_effects
from drawbridge.evidence.surface import build_decision, build_surface
from drawbridge.evidence.vocabulary import PROVIDER_AUDIT_RECORD_SCHEMA

VECTORS = Path(__file__).parent / "vectors"
SURFACE_DIR = VECTORS / "surface"
SIDE_EFFECT_DIR = VECTORS / "side_effect"
UPDATE = os.environ.get("DRAWBRIDGE_UPDATE_VECTORS") == "1"

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
FIXTURE_BINDING = "sha256:31f2007b91477601789c8803c3e32912a8a4510851cc55397d49a65bbc5e4ec3"
SECRETS = {
    "public_key": "ssh-ed25519 AAAAC3NzaPLANTEDKEY",
    "private_key": "-----BEGIN PLANTED-----",
    "token": "ghp_PLANTEDTOKEN",
    "access_token": "PLANTED-access",
    "authorization": "Bearer PLANTED-bearer",
    "secret": "PLANTED-secret",
    "credential": "PLANTED-cred",
    "password": "PLANTED-pw",
    "api_key": "sk-PLANTED-api",
    "client_secret": "PLANTED-client",
    "refresh_token": "PLANTED-refresh",
    "apiKey": "PLANTED-apikey",
    "secretAccessKey": "PLANTED-aws",
}


def call(tool: str, arguments: Any, *, params: Any = None, effect: str = "allow",
         status: str = "success", rule_id: str | None = "rule.1", server_id: str = "srv") -> dict[str, Any]:
    return {"server_id": server_id, "tool_name": tool, "arguments": arguments,
            "params": {} if params is None else params, "effect": effect, "status": status,
            "rule_id": rule_id}


GH = {"owner": "org", "repo": "prod-repo", "title": "ci-key", "read_only": False}
SLACK = {"workspace_id": "T0123", "channel_id": "C0123", "user": "alice@example.com"}
WS = {"workspace_id": "acme", "principal": "bob@example.com", "role": "admin"}
HOSTILE = call(
    "gh\x1b[31m.add_deploy_key", {"owner": "o\x00rg", "repo": "r\x07", "title": "t\x1b"},
    server_id="srv\x9b", status="success\x7f", rule_id="r\x1b]8;;",
)
PLANTED = call(
    "github.add_deploy_key",
    {**GH, **SECRETS, "nested": {"config": {**SECRETS}, "list": [SECRETS, [SECRETS]]}},
    params={"_meta": {"traceparent": TP, "tracestate": "PLANTED-state", **SECRETS}},
)

#: name -> (description, builder inputs)
SURFACE_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "github_classified_allow": (
        "classified github deploy key, allowed, valid traceparent",
        call("github.add_deploy_key", GH, params={"name": "x", "_meta": {"traceparent": TP}})),
    "github_classified_deny": (
        "denied: asserts nothing, keeps its consequence class",
        call("github.add_deploy_key", {"owner": "org", "repo": "prod-repo", "read_only": False},
             effect="deny", status="blocked", rule_id="tool.github.deploy_key.deny")),
    "github_create_key_title_fallback": (
        "create_deploy_key; non-string title falls back to key_title",
        call("gh.create_deploy_key",
             {"owner": "Org", "repo": "R", "title": 1, "key_title": "  Deploy KEY\u3000"})),
    "github_incomplete_missing_repo": ("owner only", call("github.add_deploy_key", {"owner": "org"})),
    "github_incomplete_missing_owner": (
        "repo only: target is provider only", call("add_deploy_key", {"repo": "prod-repo", "owner": None})),
    "slack_classified_channel": ("workspace, channel and user all hashed", call("slack.add_member", SLACK)),
    "slack_workspace_level": (
        "no channel: channel_id_hash is null",
        call("slack.add_member", {"workspace_id": "T0123", "user_id": "U999"})),
    "slack_invite_channel_only": (
        "invite leaf; channel without workspace; user_id wins over user",
        call("slack.invite", {"channel_id": "C9", "user_id": "U1", "user": "other"})),
    "slack_incomplete_missing_principal": (
        "scope without principal", call("slack.add_member", {"workspace_id": "T0123", "user_id": 5})),
    "slack_incomplete_missing_scope": ("principal without scope", call("slack.invite", {"user": "U1"})),
    "workspace_grant_admin": ("grant_admin with role", call("workspace.grant_admin", WS)),
    "workspace_change_role": (
        "workspace and user fallbacks",
        call("w.change_role", {"workspace": "Acme", "user": "Bob", "role": "member"})),
    "workspace_invite_external": (
        "org fallback, no role",
        call("w.invite_external", {"org": "acme", "principal": "ext@partner.example"})),
    "workspace_modify_org_policy": (
        "modify verb", call("w.modify_org_policy", {"workspace_id": "a", "principal": "p"})),
    "workspace_create_token": (
        "create verb; the token value is dropped",
        call("w.create_workspace_token",
             {"workspace_id": "a", "principal": "p", "token": "PLANTED-ws-token"})),
    "workspace_incomplete_missing_id": (
        "principal without workspace", call("workspace.grant_admin", {"principal": "p", "role": "admin"})),
    "workspace_incomplete_missing_principal": (
        "workspace without principal", call("workspace.change_role", {"org": "acme"})),
    "unknown_tool": ("unknown leaf: never clean", call("misc.do_thing", {"owner": "org", "repo": "r"})),
    "unknown_tool_list_arguments_error": (
        "no dot, list arguments, error effect",
        call("do_thing", ["a", {"b": 1}], effect="error", status="-32603", rule_id=None)),
    "null_arguments_classified_leaf": ("null arguments on a known leaf", call("slack.add_member", None)),
    "correlation_malformed_string": (
        "uppercase hex is malformed", call("t", {}, params={"_meta": {"traceparent": TP.upper()}})),
    "correlation_malformed_non_string": (
        "non-string carrier is malformed", call("t", {}, params={"_meta": {"traceparent": 42}})),
    "correlation_malformed_null": (
        "null carrier is malformed", call("t", {}, params={"_meta": {"traceparent": None}})),
    "correlation_none_meta_not_object": ("_meta not an object: none", call("t", {}, params={"_meta": 7})),
    "correlation_none_in_arguments_only": (
        "a carrier in arguments is not a carrier",
        call("t", {"_meta": {"traceparent": TP}}, params={"name": "t"})),
    "sanitized_control_characters": (
        "Cc characters (C0, DEL, C1) replaced in every free string; hashes use the raw value", HOSTILE),
    "secrets_planted": ("secret-like keys at every depth, and in _meta, are dropped", PLANTED),
}

SURFACE_PLANTED = [*SECRETS.values(), "PLANTED-ws-token", "PLANTED-state"]

#: Which raw argument feeds each hashed target field, and under which domain.
HASH_SOURCES = {
    "key_title_hash": ("github_key_title", ("title", "key_title")),
    "principal_hash": (None, ("user_id", "user", "principal")),
    "workspace_id_hash": (None, ("workspace_id", "workspace", "org")),
    "channel_id_hash": ("slack_channel", ("channel_id",)),
}
RUST_WS = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
          "\u2028\u2029\u202f\u205f\u3000"


def _independent_hash(domain: str, raw: str) -> str:
    preimage = "assay.tool_target.v0:" + domain + ":" + raw.strip(RUST_WS).lower()
    return "sha256:" + hashlib.sha256(preimage.encode("utf-8")).hexdigest()


def _check_hashes_independently(inp: dict[str, Any], record: dict[str, Any]) -> None:
    target = record["action"]["target"]
    if not isinstance(target, dict):
        return
    provider = target["provider"]
    args = inp["arguments"]
    for field, (domain, sources) in HASH_SOURCES.items():
        if target.get(field) is None:
            continue
        if domain is None:
            domain = {("slack", "principal_hash"): "slack_principal", ("workspace", "principal_hash"):
                      "workspace_principal", ("slack", "workspace_id_hash"): "slack_workspace",
                      ("workspace", "workspace_id_hash"): "workspace"}[(provider, field)]
        raw = next(args[k] for k in sources if isinstance(args.get(k), str))
        assert target[field] == _independent_hash(domain, raw), field


def _dump(obj: Any) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"


def _surface_vector(name: str) -> dict[str, Any]:
    description, inp = SURFACE_CASES[name]
    return {"name": name, "description": description, "input": inp, "expected": build_decision(**inp)}


# --- side-effect cases -----------------------------------------------------------------------

KEY_TITLE_HASH = "sha256:a65a94d25524f87fbb5ce6d3fde202c02a5b532f27e1ba3b5708076e1ba75ccf"


def _action(tool: str, arguments: Any) -> dict[str, Any]:
    return build_decision(server_id="s", tool_name=tool, arguments=arguments, params={}, effect="allow",
                          status="success")["action"]


def _record(subject: Any, *, digest: str | None = None, record_id: str = "audit-1",
            provider: str = "github") -> dict[str, Any]:
    return {"schema": PROVIDER_AUDIT_RECORD_SCHEMA, "provider": provider, "record_id": record_id,
            "subject": subject, "binding_digest": digest if digest is not None else binding_digest(subject),
            "non_claims": ["imported from a provider audit export; drawbridge did not query the provider"]}


GH_ACTION = _action("github.add_deploy_key", GH)
GH_SUBJECT = {"action_class": "github_deploy_key", "verb": "create",
              "target": {"owner": "org", "repo": "prod-repo", "key_title_hash": KEY_TITLE_HASH}}
GH_OTHER = {**GH_SUBJECT, "target": {**GH_SUBJECT["target"], "repo": "other-repo"}}
SLACK_ACTION = _action("slack.add_member", SLACK)
SLACK_WS_ACTION = _action("slack.add_member", {"workspace_id": "T0123", "user_id": "U999"})
WS_ACTION = _action("workspace.grant_admin", WS)
WS_NO_ROLE_ACTION = _action("workspace.change_role", {"org": "acme", "user": "bob@example.com"})
ASSERTED = {"asserted": True, "level": "asserted", "irreversibility_class": "one_way_consequential"}


def _surface_doc() -> dict[str, Any]:
    def dec(tool: str, args: Any, effect: str = "allow", status: str = "success") -> dict[str, Any]:
        return build_decision(server_id="s", tool_name=tool, arguments=args, params={}, effect=effect,
                              status=status, rule_id=None)

    return build_surface([
        dec("github.add_deploy_key", GH),
        dec("github.add_deploy_key", GH),
        dec("github.add_deploy_key", GH, effect="deny", status="blocked"),
        dec("slack.add_member", SLACK),
        dec("workspace.grant_admin", WS),
        dec("misc.do_thing", {}),
    ])


GH_READ = {"resource_type": "github_deploy_key", "verb": "list", "target": GH_ACTION["target"]}
GH_READ_OTHER = {**GH_ACTION, "target": {**GH_ACTION["target"], "repo": "x"}}
TAMPERED = _record(GH_SUBJECT, digest=binding_digest(GH_OTHER), record_id="bad")
NOT_ASSERTED = {"asserted": False, "level": "asserted"}

#: name -> (description, operation, inputs)
SIDE_EFFECT_CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "rung_asserted": (
        "the producer's block for a classified call", "producer_block",
        {"asserted": True, "category": "github_deploy_key"}),
    "rung_asserted_unclassified": (
        "unknown tool: no consequence class, no finding", "producer_block",
        {"asserted": True, "category": None}),
    "rung_asserted_not_asserted": (
        "a denied call asserts nothing", "producer_block",
        {"asserted": False, "category": "workspace_admin"}),
    "rung_observed_confirmed": (
        "a later list of the same target confirms the write", "promote_with_observed_read",
        {"side_effect": ASSERTED, "write_action": GH_ACTION, "read_action": GH_READ}),
    "rung_observed_other_target": (
        "a read of another repo does not confirm", "promote_with_observed_read",
        {"side_effect": ASSERTED, "write_action": GH_ACTION, "read_action": GH_READ_OTHER}),
    "rung_verified": (
        "a matching audit record binds: verified", "promote_with_audit_record",
        {"side_effect": ASSERTED, "record": _record(GH_SUBJECT), "action": GH_ACTION}),
    "audit_mismatch": (
        "a record for another repo binds a different call", "promote_with_audit_record",
        {"side_effect": ASSERTED, "record": _record(GH_OTHER, record_id="audit-0"), "action": GH_ACTION}),
    "audit_inconsistent": (
        "the record's digest does not recompute from its subject", "promote_with_audit_record",
        {"side_effect": ASSERTED, "record": TAMPERED, "action": GH_ACTION}),
    "audit_no_subject": (
        "not projectable: no subject", "check_audit_record",
        {"record": {"schema": PROVIDER_AUDIT_RECORD_SCHEMA, "binding_digest": FIXTURE_BINDING},
         "action": GH_ACTION}),
    "audit_no_binding_digest": (
        "not projectable: no binding_digest", "check_audit_record",
        {"record": {"subject": GH_SUBJECT, "binding_digest": None}, "action": GH_ACTION}),
    "audit_unclassified_call": (
        "not projectable: the call is unclassified", "check_audit_record",
        {"record": _record(GH_SUBJECT), "action": _action("misc.do_thing", {})}),
    "audit_not_asserted": (
        "an unasserted side effect cannot be verified", "promote_with_audit_record",
        {"side_effect": NOT_ASSERTED, "record": _record(GH_SUBJECT), "action": GH_ACTION}),
    "subject_github": ("Assay-compatible github subject", "subject_from_action", {"action": GH_ACTION}),
    "subject_slack_channel": (
        "slack membership in a channel", "subject_from_action", {"action": SLACK_ACTION}),
    "subject_slack_workspace_level": (
        "null channel hash is omitted", "subject_from_action", {"action": SLACK_WS_ACTION}),
    "subject_workspace_role": (
        "workspace admin grant with role", "subject_from_action", {"action": WS_ACTION}),
    "subject_workspace_no_role": (
        "workspace role change without role", "subject_from_action", {"action": WS_NO_ROLE_ACTION}),
    "verified_slack": (
        "a slack audit record binds: verified", "promote_with_audit_record",
        {"side_effect": ASSERTED, "action": SLACK_ACTION,
         "record": _record(subject_from_action(SLACK_ACTION), provider="slack")}),
    "verified_workspace": (
        "a workspace audit record binds: verified", "promote_with_audit_record",
        {"side_effect": ASSERTED, "action": WS_ACTION,
         "record": _record(subject_from_action(WS_ACTION), provider="workspace")}),
    "verifier_run": (
        "whole document: one-to-one allocation, label order, every rejection reported", "verify_side_effects",
        {"surface": _surface_doc(), "audit_records": [
            ["c-github.json", _record(GH_SUBJECT, record_id="gh-1")],
            ["b-mismatch.json", _record(GH_OTHER, record_id="gh-0")],
            ["a-tampered.json", TAMPERED],
            ["d-slack.json", _record(subject_from_action(SLACK_ACTION), record_id="sl-1")],
            ["e-workspace.json", _record(subject_from_action(WS_ACTION), record_id="ws-1")],
        ]}),
}


def _block(obj: dict[str, Any]) -> SideEffect:
    return SideEffect.from_json(obj)


def run_side_effect(operation: str, inp: dict[str, Any]) -> Any:
    """The operation a vector names, applied to its committed inputs."""
    if operation == "producer_block":
        block = producer_block(inp["asserted"], inp["category"])
        return {"side_effect": block.to_json(), "verified_flag": block.verified_flag,
                "unevidenced_and_consequential": block.unevidenced_and_consequential()}
    if operation == "promote_with_observed_read":
        start = _block(inp["side_effect"])
        block = promote_with_observed_read(start, inp["write_action"], inp["read_action"])
        return {"side_effect": block.to_json(), "verified_flag": block.verified_flag}
    if operation == "promote_with_audit_record":
        block, binding = promote_with_audit_record(_block(inp["side_effect"]), inp["record"], inp["action"])
        return {"side_effect": block.to_json(), "binding": binding.to_json(),
                "verified_flag": block.verified_flag}
    if operation == "check_audit_record":
        return {"binding": check_audit_record(inp["record"], inp["action"]).to_json()}
    if operation == "subject_from_action":
        subject = subject_from_action(inp["action"])
        return {"subject": subject, "binding_digest": None if subject is None else binding_digest(subject)}
    if operation == "verify_side_effects":
        return verify_side_effects(inp["surface"], [(label, rec) for label, rec in inp["audit_records"]])
    raise AssertionError(operation)


def _side_effect_vector(name: str) -> dict[str, Any]:
    description, operation, inp = SIDE_EFFECT_CASES[name]
    inp = copy.deepcopy(inp)
    return {"name": name, "description": description, "operation": operation, "input": inp,
            "expected": run_side_effect(operation, inp)}


def _hand_jcs_digest(subject: Any) -> str:
    text = json.dumps(subject, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def _check_digests_independently(vector: dict[str, Any]) -> None:
    """Every binding digest in a vector, recomputed from hand-written JCS."""
    def walk(obj: Any) -> None:
        if isinstance(obj, dict):
            if isinstance(obj.get("subject"), dict) and "binding_digest" in obj and "schema" not in obj:
                assert obj["binding_digest"] == _hand_jcs_digest(obj["subject"])
            for item in obj.values():
                walk(item)
        elif isinstance(obj, list):
            for item in obj:
                walk(item)
    walk(vector["expected"])
    inp, exp = vector["input"], vector["expected"]
    record = inp.get("record")
    if isinstance(record, dict) and isinstance(record.get("subject"), dict):
        consistent = _hand_jcs_digest(record["subject"]) == record["binding_digest"]
        binding = exp["binding"]
        if binding["outcome"] == "bound":
            assert consistent and binding["subject_digest"] == record["binding_digest"]
            assert exp["side_effect"]["verification_subject_digest"] == binding["subject_digest"]
        if binding["outcome"] == "record_inconsistent":
            assert not consistent and binding["recomputed"] == _hand_jcs_digest(record["subject"])
    if vector["name"] in ("rung_verified", "rung_observed_confirmed", "subject_github"):
        digest = exp.get("binding_digest") or exp["side_effect"]["verification_subject_digest"]
        assert digest == FIXTURE_BINDING  # the page's value


# --- generation and checking -------------------------------------------------------------------

def _write_all() -> None:
    for directory, cases, make in ((SURFACE_DIR, SURFACE_CASES, _surface_vector),
                                   (SIDE_EFFECT_DIR, SIDE_EFFECT_CASES, _side_effect_vector)):
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.glob("*.json"):
            if stale.stem not in cases:
                stale.unlink()
        for name in cases:
            (directory / f"{name}.json").write_text(_dump(make(name)), encoding="utf-8")


if UPDATE:
    _write_all()


def _load(directory: Path, name: str) -> dict[str, Any]:
    return json.loads((directory / f"{name}.json").read_text(encoding="utf-8"))


def test_vector_sets_match_the_case_definitions() -> None:
    assert sorted(p.stem for p in SURFACE_DIR.glob("*.json")) == sorted(SURFACE_CASES)
    assert sorted(p.stem for p in SIDE_EFFECT_DIR.glob("*.json")) == sorted(SIDE_EFFECT_CASES)


@pytest.mark.parametrize("name", sorted(SURFACE_CASES))
def test_surface_vector(name: str) -> None:
    vector = _load(SURFACE_DIR, name)
    assert vector["input"] == SURFACE_CASES[name][1], "case definition changed: regenerate on purpose"
    produced = build_decision(**vector["input"])
    assert _dump(produced) == _dump(vector["expected"])  # values and key order
    _check_hashes_independently(vector["input"], vector["expected"])
    text = json.dumps(vector["expected"], ensure_ascii=False)
    for planted in SURFACE_PLANTED:
        assert planted not in text


def test_surface_vectors_cover_the_vocabularies() -> None:
    records = [_load(SURFACE_DIR, n)["expected"] for n in SURFACE_CASES]
    assert {r["classification"] for r in records} == set(v.EMITTED_CLASSIFICATION_STATES)
    assert {r["reason_code"] for r in records} == set(v.EMITTED_REASON_CODES)
    assert {r["detail"] for r in records if "detail" in r} == set(v.DETAIL_VALUES)
    assert {r["correlation"]["basis"] for r in records} == set(v.CORRELATION_BASES)
    assert {r["decision"]["effect"] for r in records} == set(v.EFFECTS)
    assert {r["tool"]["category"] for r in records} == {*v.CATEGORIES, None}
    assert {r["action"]["verb"] for r in records if r["tool"]["category"] == "workspace_admin"} == {
        "grant", "change_role", "invite", "modify", "create"}


@pytest.mark.parametrize("name", sorted(SIDE_EFFECT_CASES))
def test_side_effect_vector(name: str) -> None:
    vector = _load(SIDE_EFFECT_DIR, name)
    description, operation, inp = SIDE_EFFECT_CASES[name]
    assert (vector["operation"], vector["input"]) == (operation, json.loads(json.dumps(inp))), \
        "case definition changed: regenerate on purpose"
    produced = run_side_effect(vector["operation"], vector["input"])
    assert _dump(produced) == _dump(vector["expected"])
    _check_digests_independently(vector)


def test_side_effect_vectors_cover_the_ladder_and_outcomes() -> None:
    vectors = [_load(SIDE_EFFECT_DIR, n) for n in SIDE_EFFECT_CASES]
    levels = {vec["expected"]["side_effect"]["level"] for vec in vectors if "side_effect" in vec["expected"]}
    assert levels == set(v.SIDE_EFFECT_LEVELS)
    outcomes = {vec["expected"]["binding"]["outcome"] for vec in vectors if "binding" in vec["expected"]}
    assert outcomes == set(v.AUDIT_OUTCOMES)
    classes = {vec["expected"]["subject"]["action_class"] for vec in vectors
               if vec["operation"] == "subject_from_action"}
    assert classes == set(v.RESOURCE_TYPE.values())
    run_vector = _load(SIDE_EFFECT_DIR, "verifier_run")
    run = run_vector["expected"]
    records = dict((label, rec) for label, rec in run_vector["input"]["audit_records"])
    for row in run["audit_records"]:
        if row["matched_call"] is not None:
            digest = _hand_jcs_digest(records[row["source"]]["subject"])
            assert run["calls"][row["matched_call"]]["subject_digest"] == digest
    assert run["calls"][0]["subject_digest"] == FIXTURE_BINDING
    assert [c["level"] for c in run["calls"]] == ["verified", "asserted", "asserted", "verified", "verified",
                                                  "asserted"]
    assert run["promoted"] == 3 and run["audit_records_unmatched"] == 2 and run["ok"] is False
