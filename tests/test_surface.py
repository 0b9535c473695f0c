"""Tool-decision surface: classifiers, target hashing, correlation, the entry builder and envelope.

Expected hashes are either values from the format's reference fixtures or recomputed inline
with hashlib from the algorithm in evidence-formats.md §1.5.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drawbridge.canonical import canonical_bytes
from drawbridge.evidence import vocabulary as v
from drawbridge.evidence.classify import classify, record_text, target_hash, tool_leaf
from drawbridge.evidence.correlation import correlation, is_valid_traceparent, traceparent_from_params
from drawbridge.evidence.surface import Effect, build_decision, build_surface

VALID_TP = "00-11111111111111111111111111111111-aaaaaaaaaaaaaaa1-01"


def spec_hash(domain: str, value: str) -> str:
    """evidence-formats.md §1.5, re-done inline (value already trimmed/lowercased by the caller)."""
    return "sha256:" + hashlib.sha256(f"assay.tool_target.v0:{domain}:{value}".encode()).hexdigest()


def decide(tool: str, arguments: Any = None, *, params: Any = None, effect: str = "allow",
           status: str = "success", rule_id: str | None = "r1", server_id: str = "github") -> dict[str, Any]:
    return build_decision(server_id=server_id, tool_name=tool, arguments=arguments, params=params,
                          effect=effect, status=status, rule_id=rule_id)


# --- target hashing ---------------------------------------------------------------

# (domain, raw value, hash committed in the format's reference fixtures)
REFERENCE_HASHES = [
    ("github_key_title", "ci-key", "sha256:a65a94d25524f87fbb5ce6d3fde202c02a5b532f27e1ba3b5708076e1ba75ccf"),
    ("slack_workspace", "T0123", "sha256:e4cfe2c3698fd59b58fd5a075e378f38d857421174faffe3317d3f86473f0190"),
    ("slack_channel", "C0123", "sha256:d7f40313c37246eca3ae64aaa3c65db4fc52d02e73f1d3e01cd9c8650ee42e1a"),
    ("slack_principal", "alice@example.com",
     "sha256:fccfe5ed09f484c1f7523fd8f9fea1bb2e85ddb0845ad61225e604f2c013620d"),
    ("workspace", "acme", "sha256:2443f42f97a4e38e039eaab087b51040b31f61dfac89d7cf75d397cd2033675b"),
    ("workspace_principal", "bob@example.com",
     "sha256:879a6f5abcca30d0334b3238baac9ea116a195b66d3d56eebf447552f8e1aede"),
]


@pytest.mark.parametrize(("domain", "value", "expected"), REFERENCE_HASHES)
def test_target_hash_reproduces_reference_fixture_values(domain: str, value: str, expected: str) -> None:
    assert target_hash(domain, value) == expected


def test_target_hash_trims_rust_whitespace_and_lowercases() -> None:
    expected = spec_hash("github_key_title", "ci-key")
    assert target_hash("github_key_title", " \t\u3000CI-Key\u2029\x85") == expected
    # U+001F is not White_Space: Python's strip() would remove it, Rust's trim() does not.
    assert target_hash("github_key_title", "\x1fci-key") == spec_hash("github_key_title", "\x1fci-key")
    assert target_hash("github_key_title", "\x1fci-key") != expected
    # Full Unicode lowercase, including final sigma.
    assert target_hash("workspace", "ΟΔΟΣ") == spec_hash("workspace", "οδος")


def test_target_hash_is_domain_separated() -> None:
    assert target_hash("slack_principal", "a@b") != target_hash("workspace_principal", "a@b")


def test_target_hash_hashes_raw_value_not_sanitized() -> None:
    assert target_hash("workspace", "a\x1bb") == spec_hash("workspace", "a\x1bb")


def test_target_hash_survives_lone_surrogates() -> None:
    assert target_hash("workspace", "a\ud800") == spec_hash("workspace", "a\ufffd")


# --- sanitizing -------------------------------------------------------------------

def test_record_text_replaces_cc_but_keeps_tab_lf_cr_and_cf() -> None:
    assert record_text("a\x00b\x1b[31m\x7f\x85\x9f") == "a\ufffdb\ufffd[31m\ufffd\ufffd\ufffd"
    assert record_text("t\tn\nr\r") == "t\tn\nr\r"
    assert record_text("rtl\u202eok") == "rtl\u202eok"  # Cf is not replaced
    assert record_text("x\udc80") == "x\ufffd"


# --- leaf and classifiers ---------------------------------------------------------

def test_leaf_is_after_last_dot() -> None:
    assert tool_leaf("a.b.add_member") == "add_member"
    assert tool_leaf("add_member") == "add_member"
    assert tool_leaf("x.add_member.") == ""
    assert classify("Slack.ADD_MEMBER", {}).state == v.OBSERVED_UNKNOWN_TOOL  # case-sensitive


def test_github_classified_projects_only_allowlisted_fields() -> None:
    args = {"owner": "org", "repo": "prod-repo", "title": "ci-key", "read_only": True,
            "public_key": "ssh-ed25519 AAAAKEY", "token": "ghp_secret", "junk": "ignore-me"}
    d = decide("github.add_deploy_key", args)
    assert d["classification"] == "classified"
    assert d["reason_code"] == "classified_github_deploy_key"
    assert d["action"] == {
        "class": "privileged_admin_action", "verb": "create", "resource_type": "github_deploy_key",
        "target": {"provider": "github", "owner": "org", "repo": "prod-repo",
                   "key_title_hash": spec_hash("github_key_title", "ci-key"), "read_only": True},
        "required_scope": "repo:deploy_key:write",
    }
    text = json.dumps(d)
    for raw in ("ssh-ed25519", "AAAAKEY", "ghp_secret", "ci-key", "ignore-me"):
        assert raw not in text


def test_github_title_falls_back_to_key_title_and_read_only_needs_a_bool() -> None:
    args = {"owner": "o", "repo": "r", "title": 5, "key_title": "K", "read_only": "true"}
    d = decide("gh.create_deploy_key", args)
    assert d["action"]["target"] == {"provider": "github", "owner": "o", "repo": "r",
                                     "key_title_hash": spec_hash("github_key_title", "k")}


@pytest.mark.parametrize(("args", "target"), [
    ({"owner": "org"}, {"provider": "github", "owner": "org"}),
    ({"repo": "r"}, {"provider": "github"}),
    ({"owner": 1, "repo": "r"}, {"provider": "github"}),
    (None, {"provider": "github"}),
    (["owner", "repo"], {"provider": "github"}),
])
def test_github_incomplete(args: Any, target: dict[str, Any]) -> None:
    d = decide("github.add_deploy_key", args)
    assert d["classification"] == "classified_incomplete"
    assert d["reason_code"] == "missing_required_target_field"
    assert d["detail"] == "missing_github_owner_or_repo"
    assert d["action"]["target"] == target
    assert d["action"]["verb"] == "create"
    assert list(d)[-1] == "detail"


def test_slack_classified_hashes_every_id_in_insertion_order() -> None:
    d = decide("slack.invite", {"workspace_id": "T0123", "channel_id": "C0123", "user": "alice@example.com"})
    assert d["classification"] == "classified"
    assert d["action"]["resource_type"] == "workspace_member"
    target = d["action"]["target"]
    assert list(target) == ["provider", "workspace_id_hash", "channel_id_hash", "principal_hash"]
    assert target["principal_hash"] == spec_hash("slack_principal", "alice@example.com")
    assert "alice" not in json.dumps(d)


def test_slack_user_id_wins_over_user_and_null_scopes_are_kept() -> None:
    d = decide("slack.add_member", {"channel_id": "C1", "user_id": "U1", "user": "ignored"})
    assert d["action"]["target"] == {"provider": "slack", "workspace_id_hash": None,
                                     "channel_id_hash": spec_hash("slack_channel", "c1"),
                                     "principal_hash": spec_hash("slack_principal", "u1")}


@pytest.mark.parametrize(("args", "detail"), [
    ({"workspace_id": "T"}, "missing_slack_principal"),
    ({}, "missing_slack_principal"),
    ({"user": "U"}, "missing_slack_scope"),
])
def test_slack_incomplete(args: dict[str, Any], detail: str) -> None:
    d = decide("slack.add_member", args)
    assert (d["classification"], d["detail"]) == ("classified_incomplete", detail)
    assert d["action"]["target"] == {"provider": "slack"}


@pytest.mark.parametrize(("leaf", "verb"), [
    ("grant_admin", "grant"), ("change_role", "change_role"), ("invite_external", "invite"),
    ("modify_org_policy", "modify"), ("create_workspace_token", "create"),
])
def test_workspace_admin_verbs(leaf: str, verb: str) -> None:
    d = decide(f"ws.{leaf}", {"org": "Acme", "user": "Bob", "role": "admin\x1b"})
    assert d["action"]["verb"] == verb
    assert d["action"]["target"] == {"provider": "workspace",
                                     "workspace_id_hash": spec_hash("workspace", "acme"),
                                     "principal_hash": spec_hash("workspace_principal", "bob"),
                                     "role": "admin\ufffd"}


@pytest.mark.parametrize(("args", "detail"), [
    ({"principal": "p"}, "missing_workspace_id"),
    ({}, "missing_workspace_id"),
    ({"workspace": "w"}, "missing_workspace_principal"),
])
def test_workspace_incomplete(args: dict[str, Any], detail: str) -> None:
    d = decide("workspace.change_role", args)
    got = (d["classification"], d["detail"], d["action"]["verb"])
    assert got == ("classified_incomplete", detail, "change_role")
    assert d["action"]["target"] == {"provider": "workspace"}


def test_unknown_tool_is_never_clean() -> None:
    d = decide("workspace.do_random_thing", {"workspace_id": "acme", "principal": "x"})
    assert d["classification"] == "observed_unknown_tool"
    assert d["reason_code"] == "unknown_tool_name"
    assert d["tool"]["category"] is None
    assert d["action"] == {"class": "unclassified", "verb": None, "resource_type": None, "target": None,
                           "required_scope": None}
    assert "irreversibility_class" not in d["response"]["side_effect"]
    assert "detail" not in d


# --- correlation -------------------------------------------------------------------

def test_traceparent_extraction_distinguishes_absent_non_string_and_null() -> None:
    assert traceparent_from_params({"_meta": {"traceparent": VALID_TP}}) == VALID_TP
    assert traceparent_from_params({"_meta": {"traceparent": 42}}) == ""
    assert traceparent_from_params({"_meta": {"traceparent": None}}) == ""
    assert traceparent_from_params({"name": "t"}) is None
    assert traceparent_from_params({"_meta": 7}) is None
    assert traceparent_from_params({"_meta": ["traceparent"]}) is None
    assert traceparent_from_params([{"_meta": {"traceparent": VALID_TP}}]) is None
    assert traceparent_from_params(None) is None


@pytest.mark.parametrize("bad", [
    "not-a-traceparent",
    "00-11111111111111111111111111111111-aaaaaaaaaaaaaaa1",
    "00-zzzz1111111111111111111111111111-aaaaaaaaaaaaaaa1-01",
    "00-00000000000000000000000000000000-aaaaaaaaaaaaaaa1-01",
    "00-11111111111111111111111111111111-0000000000000000-01",
    "00-1111\x1b]8;;evil\x07-aaaaaaaaaaaaaaa1-01",
    "ff-11111111111111111111111111111111-aaaaaaaaaaaaaaa1-01",
    "00-11111111111111111111111111111111-AAAAAAAAAAAAAAA1-01",
    "00-11111111111111111111111111111111-aaaaaaaaaaaaaaa1-01-",
    "00-11111111111111111111111111111111-aaaaaaaaaaaaaaa1-01\n",
    "00-١١١١١١١١١١١١١١١١١١١١١١١١١١١١١١١١-aaaaaaaaaaaaaaa1-01",
    "",
])
def test_malformed_traceparent_is_typed_and_not_retained(bad: str) -> None:
    assert not is_valid_traceparent(bad)
    assert correlation(bad) == {"basis": "malformed_trace_context", "traceparent": None, "source_class": None}


def test_correlation_states() -> None:
    assert correlation(VALID_TP) == {"basis": "propagated_trace_context", "traceparent": VALID_TP,
                                     "source_class": "propagated"}
    assert correlation(None) == {"basis": "none", "traceparent": None, "source_class": None}
    assert is_valid_traceparent("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00")
    tp_in_args = decide("t", {"_meta": {"traceparent": VALID_TP}}, params={})
    assert tp_in_args["correlation"]["basis"] == "none"  # the carrier is params._meta, not arguments


# --- the entry and the envelope ------------------------------------------------------

def test_entry_insertion_order_and_fixed_fields() -> None:
    params = {"_meta": {"traceparent": VALID_TP}}
    d = decide("github.add_deploy_key", {"owner": "o", "repo": "r"}, params=params)
    assert list(d) == ["server", "tool", "classification", "reason_code", "action", "decision", "response",
                       "redaction", "correlation"]
    assert list(d["action"]) == ["class", "verb", "resource_type", "target", "required_scope"]
    assert d["server"] == {"id": "github", "transport": "mcp"}
    assert d["decision"] == {"effect": "allow", "source": "drawbridge", "rule_id": "r1", "enforced": True}
    assert list(d["response"]) == ["status", "side_effect_asserted", "side_effect_verified", "side_effect"]
    assert d["response"]["side_effect"] == {"asserted": True, "level": "asserted",
                                            "irreversibility_class": "one_way_consequential"}
    assert d["redaction"] == {
        "arguments_redacted": True, "credential_alias": None, "secret_material_stored": False}


@pytest.mark.parametrize(("effect", "status", "asserted"), [
    ("allow", "success", True), (Effect.ALLOW, "success", True), ("allow", "Success", False),
    ("allow", "success ", False), ("deny", "success", False), ("deny", "blocked", False),
    ("error", "-32000", False),
])
def test_side_effect_asserted_rule(effect: Any, status: str, asserted: bool) -> None:
    d = decide("github.add_deploy_key", {"owner": "o", "repo": "r"}, effect=effect, status=status)
    assert d["response"]["side_effect_asserted"] is asserted
    assert d["response"]["side_effect"]["asserted"] is asserted
    assert d["response"]["side_effect_verified"] is False
    assert d["response"]["side_effect"]["level"] == "asserted"
    assert d["response"]["side_effect"]["irreversibility_class"] == "one_way_consequential"


def test_status_is_compared_before_sanitizing() -> None:
    d = decide("t", {}, status="success\x00")
    assert d["response"] == {"status": "success\ufffd", "side_effect_asserted": False,
                             "side_effect_verified": False,
                             "side_effect": {"asserted": False, "level": "asserted"}}


def test_hostile_strings_are_sanitized_everywhere() -> None:
    d = decide("tool\x1b[31m\x00", {}, server_id="srv\x07", status="ok\x9b", rule_id="rule\x1b")
    assert d["tool"]["name"] == "tool\ufffd[31m\ufffd"
    assert d["server"]["id"] == "srv\ufffd"
    assert d["response"]["status"] == "ok\ufffd"
    assert d["decision"]["rule_id"] == "rule\ufffd"


def test_rule_id_none_is_null_and_bad_effect_is_a_caller_error() -> None:
    assert decide("t", {}, rule_id=None)["decision"]["rule_id"] is None
    with pytest.raises(ValueError):
        decide("t", {}, effect="maybe")


def test_envelope() -> None:
    entry = decide("t", {})
    s = build_surface([entry])
    assert list(s) == ["schema", "observed_tool_decisions", "non_claims"]
    assert s["schema"] == "assay.tool_decision_surface.v0"
    assert s["observed_tool_decisions"] == [entry]
    assert s["non_claims"] == [
        "does not prove SaaS-side persistence without external audit evidence",
        "does not infer tool actions outside observed MCP proxy traffic",
        "does not expose raw secrets or tokens",
    ]


def test_vocabularies_are_the_formats() -> None:
    assert v.CLASSIFICATION_STATES == ("classified", "classified_incomplete", "observed_unknown_tool",
                                       "redaction_failed", "not_observed")
    assert v.REASON_CODES == ("classified_github_deploy_key", "classified_slack_add_member",
                              "classified_workspace_admin", "missing_required_target_field",
                              "unknown_tool_name", "redacted_secret_argument", "unsupported_argument_shape")
    assert set(v.DETAIL_VALUES) == {"missing_github_owner_or_repo", "missing_slack_principal",
                                    "missing_slack_scope", "missing_workspace_id",
                                    "missing_workspace_principal"}


def test_huge_inputs() -> None:
    name = ("x\x00" * 200_000) + ".grant_admin"
    args = {"workspace": "w" * 1_000_000, "principal": "p", "deep": _nest(5_000)}
    d = decide(name, args)
    assert d["classification"] == "classified"
    assert d["tool"]["name"].count("\ufffd") == 200_000
    assert d["action"]["target"]["workspace_id_hash"] == spec_hash("workspace", "w" * 1_000_000)


def _nest(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"a": [value]}
    return value


# --- properties ---------------------------------------------------------------------

LEAVES = ["add_deploy_key", "create_deploy_key", "add_member", "invite", "grant_admin", "change_role",
          "invite_external", "modify_org_policy", "create_workspace_token", "do_thing", ""]
READ_KEYS = ["owner", "repo", "title", "key_title", "read_only", "workspace_id", "channel_id", "user_id",
             "user", "workspace", "org", "principal", "role"]
#: evidence-formats.md §1.6 (exact) and 2.3 (normalised forms and their spelled variants).
SECRET_KEYS = [
    "public_key", "private_key", "token", "access_token", "authorization", "secret", "credential", "password",
    "api_key", "accesstoken", "refreshtoken", "authtoken", "idtoken", "sessiontoken", "passwd", "apikey",
    "clientsecret", "secretkey", "credentials", "privatekey", "secretaccesskey", "Authorization",
    "client_secret", "clientSecret", "refresh_token", "ACCESS_TOKEN", "access-token", "apiKey", "api-key",
    "privateKey", "secretAccessKey", "id_token", "session-token", "SECRET_KEY",
]

any_text = st.text(alphabet=st.characters(exclude_categories=()), max_size=12)
finite = st.floats(allow_nan=False, allow_infinity=False)
scalars = st.none() | st.booleans() | st.integers() | finite | any_text
keys = st.sampled_from(READ_KEYS + SECRET_KEYS) | any_text
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=6),
    max_leaves=25,
)
tool_names = any_text | st.builds(lambda p, leaf: p + leaf, any_text, st.sampled_from(LEAVES))
tp_values = st.sampled_from([VALID_TP, "00-bad", ""]) | json_values
params_values = json_values | st.fixed_dictionaries(
    {"_meta": json_values | st.fixed_dictionaries({"traceparent": tp_values})})
effects = st.sampled_from(["allow", "deny", "error"])
statuses = st.sampled_from(["success", "blocked", "error"]) | any_text


def _guard_invariants(d: dict[str, Any]) -> None:
    """The format's fixture guard (evidence-formats.md §1.8), per entry."""
    assert d["classification"] in v.EMITTED_CLASSIFICATION_STATES
    assert d["reason_code"] in v.EMITTED_REASON_CODES
    assert d["redaction"]["secret_material_stored"] is False
    corr = d["correlation"]
    assert corr["basis"] in v.CORRELATION_BASES
    if corr["basis"] == "propagated_trace_context":
        assert isinstance(corr["traceparent"], str) and corr["source_class"] == "propagated"
    else:
        assert corr["traceparent"] is None and corr["source_class"] is None
    category = d["tool"]["category"]
    assert (d["action"]["required_scope"] is not None) == isinstance(category, str)
    assert d["response"]["side_effect_verified"] is False
    if d["decision"]["effect"] == "deny":
        assert d["response"]["side_effect_asserted"] is False
    if "detail" in d:
        assert d["detail"] in v.DETAIL_VALUES and list(d)[-1] == "detail"
        assert d["classification"] == "classified_incomplete"


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tool=tool_names, arguments=json_values, params=params_values, effect=effects, status=statuses,
       server_id=any_text, rule_id=st.none() | any_text)
def test_builder_is_total(tool: str, arguments: Any, params: Any, effect: str, status: str, server_id: str,
                          rule_id: str | None) -> None:
    d = build_decision(server_id=server_id, tool_name=tool, arguments=arguments, params=params, effect=effect,
                       status=status, rule_id=rule_id)
    _guard_invariants(d)
    json.dumps(d, ensure_ascii=False).encode("utf-8")  # no lone surrogate survives
    canonical_bytes(build_surface([d]))


def _projection(arguments: Any) -> Any:
    """What the classifier may read: the top-level allowlisted keys of an object."""
    if not isinstance(arguments, dict):
        return None
    return {k: arguments[k] for k in READ_KEYS if k in arguments}


@settings(max_examples=300, deadline=None)
@given(tool=tool_names, arguments=json_values, params=params_values)
def test_everything_but_the_read_fields_is_dropped(tool: str, arguments: Any, params: Any) -> None:
    full = build_decision(server_id="s", tool_name=tool, arguments=arguments, params=params, effect="allow",
                          status="success")
    projected = build_decision(server_id="s", tool_name=tool, arguments=_projection(arguments), params=params,
                               effect="allow", status="success")
    assert json.dumps(full) == json.dumps(projected)


MARK = "Q7ZSECRETZ"


def _plant(value: Any, counter: list[int]) -> Any:
    """Replace whatever sits under a secret-like key, at any depth, by a unique marked string."""
    if isinstance(value, dict):
        out = {}
        for k, item in value.items():
            if k in SECRET_KEYS:
                counter[0] += 1
                out[k] = f"{MARK}{counter[0]}"
            else:
                out[k] = _plant(item, counter)
        return out
    if isinstance(value, list):
        return [_plant(item, counter) for item in value]
    return value


@settings(max_examples=300, deadline=None)
@given(tool=tool_names, arguments=json_values, secret_key=st.sampled_from(SECRET_KEYS),
       owner=st.booleans())
def test_no_secret_value_ever_reaches_the_record(
    tool: str, arguments: Any, secret_key: str, owner: bool
) -> None:
    base = {"owner": "o", "repo": "r", "workspace_id": "w", "user": "u", "principal": "p"} if owner else {}
    planted = _plant({**base, secret_key: None, "nested": [arguments, {secret_key: arguments}],
                      "arg": arguments}, [0])
    d = build_decision(server_id="s", tool_name=tool, arguments=planted, params={"_meta": planted},
                       effect="allow", status="success")
    assert MARK not in json.dumps(d, ensure_ascii=False)


@settings(max_examples=200, deadline=None)
@given(arguments=st.dictionaries(st.sampled_from(READ_KEYS) | any_text, json_values, max_size=8),
       leaf=st.sampled_from(LEAVES))
def test_only_owner_repo_and_role_are_copied_as_text(arguments: dict[str, Any], leaf: str) -> None:
    """Give every string leaf a unique mark; only marks from top-level owner/repo/role may appear."""
    counter = [0]
    origin: dict[str, str] = {}

    def mark(value: Any, top_key: str | None) -> Any:
        if isinstance(value, str):
            counter[0] += 1
            m = f"{MARK}{counter[0]}X"
            origin[m] = top_key or ""
            return m
        if isinstance(value, dict):
            return {k: mark(item, None) for k, item in value.items()}
        if isinstance(value, list):
            return [mark(item, None) for item in value]
        return value

    marked = {k: mark(item, k) for k, item in arguments.items()}
    text = json.dumps(decide(f"p.{leaf}", marked), ensure_ascii=False)
    for m, top_key in origin.items():
        if m in text:
            assert top_key in ("owner", "repo", "role")
