"""Side-effect ladder, audit-record binding, and the verifier.

Independent values: the binding digest of the reference fixtures' subject is given by
evidence-formats.md §3.3 (sha256:31f2007b...4ec3, mismatch sha256:3546cc0f...4484); other digests are
recomputed inline with hashlib over hand-written JCS text.
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drawbridge.evidence.audit_binding import (
    BindsDifferentCall,
    Bound,
    NotProjectable,
    RecordInconsistent,
    binding_digest,
    check_audit_record,
    promote_with_audit_record,
    promote_with_observed_read,
    subject_from_action,
)
from drawbridge.evidence.side_effect import (
    IrreversibilityClass,
    SideEffect,
    SideEffectFormatError,
    SideEffectLevel,
    VerificationSource,
    producer_block,
)
from drawbridge.evidence.observed_read import MARK
from drawbridge.evidence.audit_import import AuditImportError, distinct_audit_records, load_audit_records
from drawbridge.evidence.side_effect_verify import SurfaceFormatError, verify_side_effects
from drawbridge.evidence.surface import build_decision, build_surface

KEY_TITLE_HASH = "sha256:a65a94d25524f87fbb5ce6d3fde202c02a5b532f27e1ba3b5708076e1ba75ccf"
FIXTURE_PREIMAGE = (
    '{"action_class":"github_deploy_key","target":{"key_title_hash":"' + KEY_TITLE_HASH
    + '","owner":"org","repo":"prod-repo"},"verb":"create"}'
)
FIXTURE_BINDING = "sha256:31f2007b91477601789c8803c3e32912a8a4510851cc55397d49a65bbc5e4ec3"


def sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def hand_jcs(value: Any) -> str:
    """JCS for ASCII keys and plain values: sorted keys, no whitespace."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def gh_action(repo: str = "prod-repo", **extra: Any) -> dict[str, Any]:
    return {"class": "privileged_admin_action", "verb": "create", "resource_type": "github_deploy_key",
            "target": {"provider": "github", "owner": "org", "repo": repo, "key_title_hash": KEY_TITLE_HASH,
                       "read_only": False, **extra},
            "required_scope": "repo:deploy_key:write"}


def record_for(subject: Any, digest: str | None = None, record_id: str = "audit-1") -> dict[str, Any]:
    return {"schema": "assay.provider_audit_record.v0", "provider": "github", "record_id": record_id,
            "subject": copy.deepcopy(subject),
            "binding_digest": digest if digest is not None else sha(hand_jcs(subject)),
            "non_claims": ["imported"]}


SLACK_ARGS = {"workspace_id": "T0123", "channel_id": "C0123", "user": "alice@example.com"}
WS_ARGS = {"workspace_id": "acme", "principal": "bob@example.com", "role": "admin"}


GH_SUBJECT = {"action_class": "github_deploy_key", "verb": "create",
              "target": {"owner": "org", "repo": "prod-repo", "key_title_hash": KEY_TITLE_HASH}}


# --- the binding digest -----------------------------------------------------------

def test_reference_binding_digest() -> None:
    assert sha(FIXTURE_PREIMAGE) == FIXTURE_BINDING  # the page's value, by hashlib alone
    subject = subject_from_action(gh_action())
    assert subject == GH_SUBJECT
    assert binding_digest(subject) == FIXTURE_BINDING


def test_reference_mismatch_digest_matches_the_pages_prefix_and_suffix() -> None:
    other = copy.deepcopy(GH_SUBJECT)
    other["target"]["repo"] = "other-repo"
    digest = binding_digest(other)
    assert digest == sha(hand_jcs(other))
    assert digest.startswith("sha256:3546cc0f") and digest.endswith("4484")


def test_binding_digest_of_uncanonicalizable_value_is_none() -> None:
    assert binding_digest(float("nan")) is None
    assert binding_digest({1: "x"}) is None
    assert binding_digest(object()) is None


# --- subjects ----------------------------------------------------------------------

def test_github_subject_drops_request_side_fields_and_copies_verbatim() -> None:
    assert subject_from_action(gh_action(extra_field="x")) == GH_SUBJECT
    assert subject_from_action({"resource_type": "github_deploy_key", "verb": "create",
                                "target": {"owner": None}}) == {
        "action_class": "github_deploy_key", "verb": "create", "target": {"owner": None}}
    assert subject_from_action({"resource_type": "github_deploy_key", "verb": "create",
                                "target": {"provider": "github", "read_only": True}}) is None


@pytest.mark.parametrize("action", [
    {"resource_type": None, "verb": "create", "target": {"owner": "o"}},
    {"resource_type": "x", "verb": None, "target": {"owner": "o"}},
    {"resource_type": "x", "verb": "create", "target": {}},
    {"resource_type": "x", "verb": "create", "target": None},
    {"resource_type": "x", "verb": "create"},
    None, [], "action",
])
def test_unprojectable_actions(action: Any) -> None:
    assert subject_from_action(action) is None


def test_other_action_classes_use_assays_narrowing() -> None:
    action = {"resource_type": "x", "verb": "v", "target": {"repo": 1, "principal_hash": "h"}}
    assert subject_from_action(action) == {"action_class": "x", "verb": "v", "target": {"repo": 1}}


def _decision(tool: str, arguments: Any, **kw: Any) -> dict[str, Any]:
    return build_decision(server_id="s", tool_name=tool, arguments=arguments, params=kw.pop("params", {}),
                          effect=kw.pop("effect", "allow"), status=kw.pop("status", "success"), **kw)


def test_slack_subject() -> None:
    d = _decision("slack.add_member", SLACK_ARGS)
    t = d["action"]["target"]
    subject = subject_from_action(d["action"])
    assert subject == {"action_class": "workspace_member", "verb": "add",
                       "target": {"workspace_id_hash": t["workspace_id_hash"],
                                  "channel_id_hash": t["channel_id_hash"],
                                  "principal_hash": t["principal_hash"]}}
    assert binding_digest(subject) == sha(hand_jcs(subject))
    # The worked example of docs/side-effect-subjects.md.
    example = "sha256:583bd86cf75a286094c5f06ad409532424de3d77ad5dc27f1d337a265f2a85c5"
    assert binding_digest(subject) == example


def test_slack_subject_omits_null_scope_and_needs_principal_and_a_scope() -> None:
    d = _decision("slack.add_member", {"workspace_id": "T0123", "user_id": "U999"})
    assert set(subject_from_action(d["action"])["target"]) == {"workspace_id_hash", "principal_hash"}
    base = {"resource_type": "workspace_member", "verb": "add"}
    assert subject_from_action({**base, "target": {"principal_hash": "h"}}) is None
    no_principal = {"workspace_id_hash": "w", "channel_id_hash": None}
    assert subject_from_action({**base, "target": no_principal}) is None
    assert subject_from_action({**base, "target": {"channel_id_hash": "c", "principal_hash": 7}}) is None
    incomplete = _decision("slack.add_member", {"workspace_id": "T"})
    assert subject_from_action(incomplete["action"]) is None


def test_workspace_subject() -> None:
    d = _decision("workspace.grant_admin", WS_ARGS)
    subject = subject_from_action(d["action"])
    assert subject == {"action_class": "workspace_role", "verb": "grant", "target": {
        "workspace_id_hash": "sha256:2443f42f97a4e38e039eaab087b51040b31f61dfac89d7cf75d397cd2033675b",
        "principal_hash": "sha256:879a6f5abcca30d0334b3238baac9ea116a195b66d3d56eebf447552f8e1aede",
        "role": "admin"}}
    assert binding_digest(subject) == sha(hand_jcs(subject))
    no_role = _decision("workspace.change_role", {"org": "acme", "user": "bob@example.com"})
    assert set(subject_from_action(no_role["action"])["target"]) == {"workspace_id_hash", "principal_hash"}
    assert subject_from_action({"resource_type": "workspace_role", "verb": "grant",
                                "target": {"principal_hash": "p", "role": "admin"}}) is None


def test_incomplete_and_unknown_decisions_never_project() -> None:
    for d in (_decision("github.add_deploy_key", {"repo": "r"}), _decision("misc.do", {}),
              _decision("workspace.grant_admin", {"role": "admin"}),
              _decision("slack.invite", {"user": "u"})):
        assert subject_from_action(d["action"]) is None


def test_incomplete_github_call_with_owner_projects_as_in_assay() -> None:
    d = _decision("github.add_deploy_key", {"owner": "o"})
    assert subject_from_action(d["action"]) == {"action_class": "github_deploy_key", "verb": "create",
                                                "target": {"owner": "o"}}


# --- the side-effect block ------------------------------------------------------------

def test_producer_block_and_consequence() -> None:
    assert producer_block(True, "github_deploy_key").to_json() == {
        "asserted": True, "level": "asserted", "irreversibility_class": "one_way_consequential"}
    assert producer_block(True, None).to_json() == {"asserted": True, "level": "asserted"}
    for category in ("github_deploy_key", "slack_add_member", "workspace_admin"):
        assert producer_block(True, category).unevidenced_and_consequential()
        assert not producer_block(False, category).unevidenced_and_consequential()  # nothing was claimed
        assert not producer_block(False, category).verified_flag
    assert not producer_block(True, None).unevidenced_and_consequential()
    assert producer_block(True, "not_a_category").irreversibility_class is None


def test_irreversibility_scale() -> None:
    assert [c.rank for c in IrreversibilityClass] == [0, 1, 2, 3]
    assert [c.demands_evidence() for c in IrreversibilityClass] == [False, False, True, True]
    cheap = SideEffect(True, irreversibility_class=IrreversibilityClass.TWO_WAY)
    terminal = SideEffect(True, irreversibility_class=IrreversibilityClass.ONE_WAY_TERMINAL)
    assert not cheap.unevidenced_and_consequential()
    assert terminal.unevidenced_and_consequential()
    verified = SideEffect(True, SideEffectLevel.VERIFIED, VerificationSource.PROVIDER_AUDIT_IMPORT,
                          FIXTURE_BINDING, IrreversibilityClass.ONE_WAY_TERMINAL)
    assert not verified.unevidenced_and_consequential()
    assert verified.to_json() == {"asserted": True, "level": "verified",
                                  "verification_source": "provider_audit_import",
                                  "verification_subject_digest": FIXTURE_BINDING,
                                  "irreversibility_class": "one_way_terminal"}


READ = VerificationSource.OBSERVED_READ_FOLLOWUP
AUDIT = VerificationSource.PROVIDER_AUDIT_IMPORT


@pytest.mark.parametrize("kwargs", [
    {"asserted": True, "level": SideEffectLevel.VERIFIED},
    {"asserted": True, "level": SideEffectLevel.VERIFIED, "verification_source": READ,
     "verification_subject_digest": FIXTURE_BINDING},
    {"asserted": True, "level": SideEffectLevel.VERIFIED, "verification_source": AUDIT,
     "verification_subject_digest": "sha256:dead"},
    {"asserted": False, "level": SideEffectLevel.OBSERVED_CONFIRMED, "verification_source": READ,
     "verification_subject_digest": FIXTURE_BINDING},
    {"asserted": True, "verification_subject_digest": FIXTURE_BINDING},
    {"asserted": 1},
    {"asserted": True, "level": "verified"},
])
def test_a_level_cannot_exist_without_its_evidence(kwargs: dict[str, Any]) -> None:
    with pytest.raises(SideEffectFormatError):
        SideEffect(**kwargs)


def test_block_reads_explicit_nulls_and_rejects_unknown_values() -> None:
    block = SideEffect.from_json({"asserted": True, "level": "asserted", "verification_source": None,
                                  "verification_subject_digest": None})
    assert block == SideEffect(True)
    for bad in ({"asserted": True, "level": "proven"}, {"asserted": "yes", "level": "asserted"},
                {"asserted": True}, [],
                {"asserted": True, "level": "asserted", "irreversibility_class": "cheap"},
                {"asserted": True, "level": "verified", "verification_source": "provider_audit_import",
                 "verification_subject_digest": 5}):
        with pytest.raises(SideEffectFormatError):
            SideEffect.from_json(bad)


# --- checking and promoting ---------------------------------------------------------------

def test_matching_record_binds_and_promotes() -> None:
    rec = record_for(GH_SUBJECT)
    assert rec["binding_digest"] == FIXTURE_BINDING
    assert check_audit_record(rec, gh_action()) == Bound(FIXTURE_BINDING)
    block, binding = promote_with_audit_record(producer_block(True, "github_deploy_key"), rec, gh_action())
    assert binding == Bound(FIXTURE_BINDING)
    assert block.to_json() == {"asserted": True, "level": "verified",
                               "verification_source": "provider_audit_import",
                               "verification_subject_digest": FIXTURE_BINDING,
                               "irreversibility_class": "one_way_consequential"}
    assert block.verified_flag and not block.unevidenced_and_consequential()


def test_mismatch_inconsistent_and_unprojectable_records_do_not_promote() -> None:
    other = copy.deepcopy(GH_SUBJECT)
    other["target"]["repo"] = "other-repo"
    tampered = record_for(GH_SUBJECT)
    tampered["subject"]["target"]["repo"] = "attacker-repo"
    cases = [
        (record_for(other), BindsDifferentCall(sha(hand_jcs(other)), FIXTURE_BINDING)),
        (record_for(GH_SUBJECT, "sha256:deadbeef"), RecordInconsistent(FIXTURE_BINDING, "sha256:deadbeef")),
        (tampered, RecordInconsistent(sha(hand_jcs(tampered["subject"])), FIXTURE_BINDING)),
        ({"binding_digest": FIXTURE_BINDING}, NotProjectable("audit record has no subject")),
        ({"subject": GH_SUBJECT, "binding_digest": 1}, NotProjectable("audit record has no binding_digest")),
        ({"subject": GH_SUBJECT}, NotProjectable("audit record has no binding_digest")),
        ({"subject": float("inf"), "binding_digest": "x"},
         NotProjectable("audit record subject is not canonicalizable")),
        ([GH_SUBJECT], NotProjectable("audit record has no subject")),
    ]
    for record, expected in cases:
        assert check_audit_record(record, gh_action()) == expected
        block, binding = promote_with_audit_record(SideEffect(True), record, gh_action())
        assert binding == expected and block == SideEffect(True)


def test_null_subject_is_present_and_hashed() -> None:
    assert check_audit_record({"subject": None, "binding_digest": "x"}, gh_action()) == RecordInconsistent(
        sha("null"), "x")


def test_consistent_record_against_unclassified_call() -> None:
    expected = NotProjectable("observed action is unclassified")
    assert check_audit_record(record_for(GH_SUBJECT), None) == expected


def test_binding_json_forms() -> None:
    assert Bound("d").to_json() == {"outcome": "bound", "subject_digest": "d"}
    assert RecordInconsistent("a", "b").to_json() == {"outcome": "record_inconsistent", "recomputed": "a",
                                                      "declared": "b"}
    assert BindsDifferentCall("a", "b").to_json() == {"outcome": "binds_different_call", "record_digest": "a",
                                                      "call_digest": "b"}
    assert NotProjectable("r").to_json() == {"outcome": "not_projectable", "reason": "r"}


def test_asserted_never_promotes_by_itself_and_unasserted_cannot_be_verified() -> None:
    assert SideEffect(True).level is SideEffectLevel.ASSERTED
    block, binding = promote_with_audit_record(SideEffect(False), record_for(GH_SUBJECT), gh_action())
    assert block == SideEffect(False)
    assert binding == NotProjectable("side effect was not asserted")


def test_observed_read_confirms_same_target_only() -> None:
    read = {"resource_type": "github_deploy_key", "verb": "list", "target": gh_action()["target"]}
    block = promote_with_observed_read(SideEffect(True), gh_action(), read)
    assert block.to_json() == {"asserted": True, "level": "observed_confirmed",
                               "verification_source": "observed_read_followup",
                               "verification_subject_digest": FIXTURE_BINDING}
    assert not block.verified_flag
    assert promote_with_observed_read(SideEffect(True), gh_action(), gh_action(repo="x")) == SideEffect(True)
    assert promote_with_observed_read(SideEffect(False), gh_action(), read) == SideEffect(False)
    assert promote_with_observed_read(SideEffect(True), gh_action(), None) == SideEffect(True)
    other_class = {**read, "resource_type": "other"}
    assert promote_with_observed_read(SideEffect(True), gh_action(), other_class) == SideEffect(True)


def test_observed_read_never_overwrites_verified() -> None:
    verified, _ = promote_with_audit_record(SideEffect(True), record_for(GH_SUBJECT), gh_action())
    assert promote_with_observed_read(verified, gh_action(), gh_action()) == verified
    confirmed = promote_with_observed_read(SideEffect(True), gh_action(), gh_action())
    assert promote_with_observed_read(confirmed, gh_action(), gh_action()) == confirmed
    upgraded, _ = promote_with_audit_record(confirmed, record_for(GH_SUBJECT), gh_action())
    assert upgraded.level is SideEffectLevel.VERIFIED


# --- loading --------------------------------------------------------------------------------

def test_load_audit_records_keeps_only_the_schema_and_reports_the_rest() -> None:
    rec = record_for(GH_SUBJECT)
    kept, skipped = load_audit_records([("a.json", rec), ("b.json", [1]), ("c.json", {"x": 1}),
                                        ("d\x1b.json", {"schema": "assay.other.v0"}), ("e.json", None)])
    assert kept == [("a.json", rec)]
    assert skipped == [
        {"source": "b.json", "reason": "not a JSON object"},
        {"source": "c.json", "reason": "no schema field"},
        {"source": "d\ufffd.json", "reason": "schema is not assay.provider_audit_record.v0"},
        {"source": "e.json", "reason": "not a JSON object"},
    ]


# --- the verifier ---------------------------------------------------------------------------

def gh_call(repo: str = "prod-repo", **kw: Any) -> dict[str, Any]:
    return _decision("github.add_deploy_key", {"owner": "org", "repo": repo, "title": "ci-key"}, **kw)


def test_verifier_promotes_one_to_one_and_reports_everything() -> None:
    other = copy.deepcopy(GH_SUBJECT)
    other["target"]["repo"] = "other-repo"
    denied = gh_call(effect="deny", status="blocked")
    doc = build_surface([gh_call(), gh_call(), denied, _decision("misc.x", {})])
    records = [("z-good.json", record_for(GH_SUBJECT, record_id="good")),
               ("m-mismatch.json", record_for(other, record_id="mm")),
               ("a-bad.json", record_for(GH_SUBJECT, "sha256:deadbeef", record_id="bad"))]
    report = verify_side_effects(doc, records, bundle="run.json")
    assert list(report)[:8] == ["schema", "bundle", "audit_records_imported", "audit_records_unmatched",
                                "calls", "promoted", "weakest_occurrence_ceiling", "claims_not_made"]
    assert report["schema"] == "assay.side_effect_verification.v0"
    assert report["bundle"] == "run.json"
    assert report["audit_records_imported"] == 3
    assert report["promoted"] == 1
    assert report["audit_records_unmatched"] == 2
    first, second, denied, unknown = report["calls"]
    # Records are tried in label order: a-bad, m-mismatch, z-good.
    assert first["level"] == "verified" and first["subject_digest"] == FIXTURE_BINDING
    assert first["binding"] == {"outcome": "bound", "subject_digest": FIXTURE_BINDING}
    assert first["occurrence_claim"] == "allowed" and first["occurrence_ceiling"] == "independently_confirmed"
    # The only binding record is taken: the identical second call keeps its first rejection.
    assert second["level"] == "asserted" and "subject_digest" not in second
    assert second["binding"] == {"outcome": "record_inconsistent", "recomputed": FIXTURE_BINDING,
                                 "declared": "sha256:deadbeef"}
    assert second["occurrence_claim"] == "degraded" and second["occurrence_ceiling"] == "asserted"
    assert second["unevidenced_and_consequential"] is True
    assert denied == {"tool": "github.add_deploy_key", "asserted": False, "level_before": "asserted",
                      "level": "asserted", "occurrence_claim": "degraded",
                      "bounded_negative_claim": "blocked", "irreversibility_class": "one_way_consequential",
                      "unevidenced_and_consequential": False}
    assert unknown["binding"]["outcome"] == "record_inconsistent"  # the first rejection is the one kept
    assert unknown["occurrence_ceiling"] == "asserted" and "irreversibility_class" not in unknown
    assert unknown["unevidenced_and_consequential"] is False
    assert all(c["bounded_negative_claim"] == "blocked" for c in report["calls"])
    assert report["weakest_occurrence_ceiling"] == {"state": "rung", "ceiling": "asserted"}
    assert report["claims_not_made"] == ["provider_query",
                                         "audit_record_authenticity_beyond_its_own_signature",
                                         "effect_persistence_after_the_observed_call"]
    bad, mismatch, good = report["audit_records"]
    assert [r["source"] for r in report["audit_records"]] == ["a-bad.json", "m-mismatch.json", "z-good.json"]
    assert bad["status"] == "rejected" and bad["check"]["outcome"] == "record_inconsistent"
    assert [r["call"] for r in bad["rejections"]] == [0, 1, 3]
    assert mismatch["status"] == "unmatched" and mismatch["check"]["outcome"] == "consistent"
    assert [(r["call"], r["binding"]["outcome"]) for r in mismatch["rejections"]] == [
        (0, "binds_different_call"), (1, "binds_different_call"), (3, "not_projectable")]
    assert mismatch["rejections"][2]["binding"]["reason"] == "observed action is unclassified"
    assert good == {"source": "z-good.json", "record_id": "good",
                    "check": {"outcome": "consistent", "subject_digest": FIXTURE_BINDING},
                    "status": "matched", "matched_call": 0, "rejections": []}
    assert report["levels_not_reproduced"] == 0
    assert report["audit_records_rejected"] == 1
    assert report["ok"] is False  # a tampered import is not ok, even though a call was verified


def test_verifier_without_records_and_without_asserting_calls() -> None:
    report = verify_side_effects(build_surface([gh_call()]), [])
    assert report["promoted"] == 0 and report["ok"] is True
    assert report["weakest_occurrence_ceiling"] == {"state": "rung", "ceiling": "asserted"}
    report = verify_side_effects(build_surface([gh_call(effect="deny", status="blocked")]), [])
    assert report["weakest_occurrence_ceiling"] == {"state": "nothing_claimed"}
    report = verify_side_effects(build_surface([]), [("a", record_for(GH_SUBJECT))])
    assert report["calls"] == [] and report["audit_records_unmatched"] == 1 and report["ok"] is True


def test_verifier_flags_a_level_the_evidence_does_not_reproduce() -> None:
    call = gh_call()
    call["response"]["side_effect"] = {"asserted": True, "level": "verified",
                                       "verification_source": "provider_audit_import",
                                       "verification_subject_digest": FIXTURE_BINDING}
    call["response"]["side_effect_verified"] = True
    report = verify_side_effects(build_surface([call]), [])
    assert report["calls"][0]["level_before"] == "verified" and report["calls"][0]["level"] == "asserted"
    assert report["levels_not_reproduced"] == 1 and report["ok"] is False
    assert verify_side_effects(build_surface([call]), [("r", record_for(GH_SUBJECT))])["ok"] is True
    legacy = gh_call()
    del legacy["response"]["side_effect"]
    legacy["response"]["side_effect_verified"] = True
    report = verify_side_effects(build_surface([legacy]), [])
    assert report["calls"][0]["level_before"] == "verified" and report["ok"] is False


def test_a_record_imported_twice_counts_once() -> None:
    """One record never vouches for two calls, whatever it is imported as: under two names (same
    provider and record_id, same content), or without a record_id and with the same content."""
    doc = build_surface([gh_call(), gh_call()])
    report = verify_side_effects(doc, [("b.json", record_for(GH_SUBJECT)), ("a.json", record_for(GH_SUBJECT))])
    assert report["promoted"] == 1 and report["audit_records_imported"] == 1
    assert report["audit_records_unmatched"] == 0 and report["ok"] is True
    assert [c["level"] for c in report["calls"]] == ["verified", "asserted"]
    assert [(r["source"], r["status"], r["matched_call"]) for r in report["audit_records"]] == [
        ("a.json", "matched", 0), ("b.json", "duplicate", None)]
    assert report["audit_records"][1]["duplicate_of"] == "a.json"
    anonymous = {key: value for key, value in record_for(GH_SUBJECT).items() if key != "record_id"}
    report = verify_side_effects(doc, [("a", anonymous), ("b", copy.deepcopy(anonymous))])
    assert report["promoted"] == 1 and [r["status"] for r in report["audit_records"]] == ["matched", "duplicate"]
    # Two records of the same subject are two provider entries: each may vouch for one call.
    report = verify_side_effects(doc, [("a", record_for(GH_SUBJECT, record_id="gh-1")),
                                       ("b", record_for(GH_SUBJECT, record_id="gh-2"))])
    assert report["promoted"] == 2
    # The same record_id of another provider is another record.
    slack = {**record_for(GH_SUBJECT), "provider": "slack"}
    assert verify_side_effects(doc, [("a", record_for(GH_SUBJECT)), ("b", slack)])["promoted"] == 2


def test_two_records_under_one_record_id_are_refused() -> None:
    other = {**GH_SUBJECT, "target": {**GH_SUBJECT["target"], "repo": "other-repo"}}
    records = [("b.json", record_for(other, record_id="gh-1")), ("a.json", record_for(GH_SUBJECT, record_id="gh-1"))]
    with pytest.raises(AuditImportError, match="^a.json and b.json both hold record_id 'gh-1' of provider 'github'"
                                               " with different content"):
        verify_side_effects(build_surface([gh_call()]), records)
    with pytest.raises(AuditImportError, match="record_id 'x\ufffd' of provider '[(]none[)]'"):
        distinct_audit_records([("a", {"record_id": "x\x1b", "n": 1}), ("b", {"record_id": "x\x1b", "n": 2})])


def _restated(decision: dict[str, Any], read_index: int, write_index: int) -> dict[str, Any]:
    """The confirmation ``observed_read.confirmations`` makes of a write: its decision restated."""
    restated = copy.deepcopy(decision)
    side = SideEffect.from_json(decision["response"]["side_effect"])
    restated["response"]["side_effect"] = promote_with_observed_read(side, decision["action"],
                                                                     decision["action"]).to_json()
    restated["response"]["side_effect_verified"] = False
    restated[MARK] = {"trace_index": read_index, "write_trace_index": write_index}
    return restated


def test_a_restatement_is_its_write_and_takes_no_record() -> None:
    """Two writes of one key, the first confirmed by a later read (its restatement is in the document),
    and two provider records of that key: each write takes one; the restatement takes none."""
    first, second = gh_call(), gh_call()
    doc = build_surface([first, second, _restated(first, 5, 2)])
    records = [("a", record_for(GH_SUBJECT, record_id="gh-1")), ("b", record_for(GH_SUBJECT, record_id="gh-2")),
               ("c", record_for(GH_SUBJECT, record_id="gh-3"))]
    report = verify_side_effects(doc, records)
    assert report["promoted"] == 2 and report["audit_records_unmatched"] == 1 and report["ok"] is True
    write, _second, restatement = report["calls"]
    assert restatement["restates"] == 0 and restatement["level_before"] == "observed_confirmed"
    assert restatement["level"] == write["level"] == "verified" and "binding" not in restatement
    assert [r["matched_call"] for r in report["audit_records"]] == [0, 1, None]
    assert [r["call"] for r in report["audit_records"][2]["rejections"]] == []  # never tried on the restatement
    # Without records the restatement is listed, not credited, and the run's ceiling is its writes'.
    report = verify_side_effects(doc, [])
    assert report["levels_not_credited"] == 1 and report["calls"][2]["level"] == "asserted"
    report = verify_side_effects(build_surface([first, _restated(first, 5, 2)]), [records[0]])
    assert report["weakest_occurrence_ceiling"] == {"state": "rung", "ceiling": "independently_confirmed"}
    # A marked decision with no write to pair with never takes a record, and weighs as asserted.
    report = verify_side_effects(build_surface([gh_call(repo="other"), _restated(first, 5, 2)]), [records[0]])
    assert report["promoted"] == 0 and "restates" not in report["calls"][1]
    assert report["weakest_occurrence_ceiling"] == {"state": "rung", "ceiling": "asserted"}


def test_a_recorded_subject_digest_that_is_not_the_calls_is_not_reproduced() -> None:
    """evidence-formats.md §3.3: ``verification_subject_digest`` is the recomputed binding. A record
    edited to ``verified`` with another digest is not reproduced, even when a real record binds."""
    zero = "sha256:" + "0" * 64
    call = gh_call()
    call["response"]["side_effect"] = {"asserted": True, "level": "verified",
                                       "verification_source": "provider_audit_import",
                                       "verification_subject_digest": zero}
    call["response"]["side_effect_verified"] = True
    report = verify_side_effects(build_surface([call]), [("r", record_for(GH_SUBJECT))])
    assert report["calls"][0]["level"] == "verified" and report["calls"][0]["recorded_subject_digest"] == zero
    assert report["levels_not_reproduced"] == 1 and report["ok"] is False
    call["response"]["side_effect"]["verification_subject_digest"] = FIXTURE_BINDING
    report = verify_side_effects(build_surface([call]), [("r", record_for(GH_SUBJECT))])
    assert report["ok"] is True and "recorded_subject_digest" not in report["calls"][0]
    restated = _restated(gh_call(), 5, 2)
    restated["response"]["side_effect"]["verification_subject_digest"] = zero
    report = verify_side_effects(build_surface([gh_call(), restated]), [])
    assert report["levels_not_reproduced"] == 1 and report["levels_not_credited"] == 0


def test_verifier_new_categories_reach_verified() -> None:
    slack = _decision("slack.add_member", SLACK_ARGS)
    ws = _decision("workspace.grant_admin", WS_ARGS)
    records = [(f"{i}", record_for(subject_from_action(d["action"]), record_id=f"audit-{i}"))
               for i, d in enumerate([ws, slack])]
    report = verify_side_effects(build_surface([slack, ws]), records)
    assert [c["level"] for c in report["calls"]] == ["verified", "verified"]
    assert [r["matched_call"] for r in report["audit_records"]] == [1, 0]


SURFACE = "assay.tool_decision_surface.v0"


@pytest.mark.parametrize(("doc", "message"), [
    ([], "not a JSON object"),
    ({"schema": "assay.other.v0", "observed_tool_decisions": []}, "schema is not"),
    ({"schema": "assay.tool_decision_surface.v0"}, "missing observed_tool_decisions"),
    ({"schema": "assay.tool_decision_surface.v0", "observed_tool_decisions": {}}, "not an array"),
    ({"schema": SURFACE, "observed_tool_decisions": [1]}, r"\[0\] is not a JSON object"),
    ({"schema": "assay.tool_decision_surface.v0", "observed_tool_decisions": [{"tool": {"name": "t\x1b"}}]},
     "'t\ufffd'.* missing response.side_effect_asserted"),
    ({"schema": "assay.tool_decision_surface.v0",
      "observed_tool_decisions": [{"response": {"side_effect_asserted": "true"}}]}, "not a boolean"),
    ({"schema": "assay.tool_decision_surface.v0",
      "observed_tool_decisions": [{"response": {"side_effect_asserted": True, "side_effect_verified": 0}}]},
     "side_effect_verified that is not a boolean"),
    ({"schema": "assay.tool_decision_surface.v0",
      "observed_tool_decisions": [{"response": {"side_effect_asserted": False,
                                                "side_effect": {"asserted": True, "level": "asserted"}}}]},
     "disagrees with side_effect_asserted"),
    ({"schema": "assay.tool_decision_surface.v0",
      "observed_tool_decisions": [{"response": {"side_effect_asserted": True, "side_effect_verified": True,
                                                "side_effect": {"asserted": True, "level": "asserted"}}}]},
     "disagrees with side_effect.level"),
    ({"schema": "assay.tool_decision_surface.v0",
      "observed_tool_decisions": [{"response": {"side_effect_asserted": True,
                                                "side_effect": {"asserted": True, "level": "super"}}}]},
     "side_effect.level"),
    ({"schema": SURFACE, "observed_tool_decisions": [
        {"response": {"side_effect_asserted": False, "side_effect_verified": True}}]},
     "asserted nothing"),
])
def test_malformed_surface_documents_fail_closed(doc: Any, message: str) -> None:
    with pytest.raises(SurfaceFormatError, match=message):
        verify_side_effects(doc, [])
    assert issubclass(SurfaceFormatError, ValueError)


def test_verifier_rejects_non_pairs() -> None:
    with pytest.raises(TypeError):
        verify_side_effects(build_surface([]), [record_for(GH_SUBJECT)])  # type: ignore[list-item]


# --- properties ---------------------------------------------------------------------------------

any_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["subject", "binding_digest", "action_class", "verb", "target", "owner", "repo",
                         "key_title_hash", "resource_type"]) | st.text(max_size=4), inner, max_size=4),
    max_leaves=15,
)


@settings(max_examples=300, deadline=None)
@given(record=any_json, action=any_json, asserted=st.booleans())
def test_promotion_only_on_both_checks(record: Any, action: Any, asserted: bool) -> None:
    block, binding = promote_with_audit_record(SideEffect(asserted), record, action)
    assert isinstance(binding, (Bound, BindsDifferentCall, RecordInconsistent, NotProjectable))
    if block.level is SideEffectLevel.VERIFIED:
        digest = sha_jcs(record["subject"])
        assert asserted and digest == record["binding_digest"] == sha_jcs(subject_from_action(action))
        assert block.verification_subject_digest == digest
    else:
        assert block == SideEffect(asserted) and not isinstance(binding, Bound)


def sha_jcs(value: Any) -> str:
    from drawbridge.canonical import canonical_bytes
    return "sha256:" + hashlib.sha256(canonical_bytes(value)).hexdigest()


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_calls=st.integers(0, 4),
       repos=st.lists(st.sampled_from(["a", "b", "c"]), max_size=5))
def test_verifier_is_independent_of_record_order(seed: int, n_calls: int, repos: list[str]) -> None:
    calls = [gh_call(repo=["a", "b", "c"][i % 3]) for i in range(n_calls)]
    records = []
    for i, repo in enumerate(repos):
        subject = {**GH_SUBJECT, "target": {**GH_SUBJECT["target"], "repo": repo}}
        records.append((f"r{i:02d}.json", record_for(subject, record_id=str(i))))
    doc = build_surface(calls)
    shuffled = records[:]
    random.Random(seed).shuffle(shuffled)
    a = verify_side_effects(doc, records)
    b = verify_side_effects(doc, shuffled)
    assert a == b
    verified = [c for c in a["calls"] if c["level"] == "verified"]
    assert a["promoted"] == len(verified) == sum(r["status"] == "matched" for r in a["audit_records"])
    matched = [r["matched_call"] for r in a["audit_records"] if r["matched_call"] is not None]
    assert len(matched) == len(set(matched))  # one-to-one
