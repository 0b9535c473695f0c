"""The tool-decision-truth carrier: keyed argument digest, secret drop, builder, import gate.

Expected digests are recomputed inline with hmac/hashlib from the algorithm of
evidence-formats.md §2.2-2.4, or taken from the reference page itself.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drawbridge.evidence.truth.carrier import (
    FORBIDDEN_RAW_ARG_KEYS,
    IDENTITY_STATES,
    RESULT_STATUSES,
    SECRET_KEY_TOKENS,
    SOURCE_CLASSES,
    CarrierError,
    CarrierVocabularyError,
    args_digest,
    build_carrier,
    carrier_content_digest,
    decision_identity_digest,
    drop_secret_keys,
    is_secret_key,
    normalize_secret_key,
    observed_input_digest,
    try_build_carrier,
    validate_carrier,
)

# The key Assay's conformance vectors use (its test source), with the key id of evidence-formats.md §2.2.
REFERENCE_KEY = b"tool-decision-truth-vectors-key-v0"
REFERENCE_KID = "fixture-kid-v0"
KEY = b"drawbridge-test-key"
KID = "drawbridge-kid-v0"
DECL = "sha256:" + "1" * 64


def hmac_hex(key: bytes, preimage: str) -> str:
    return hmac.new(key, preimage.encode("utf-8"), hashlib.sha256).hexdigest()


def sha_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def plain_jcs(value: Any) -> str:
    """JCS for values with ASCII keys and no numbers beyond small integers (enough for these tests)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def carrier(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = dict(
        tool_name="deploy",
        args={"env": "prod"},
        order=0,
        declared_policy_digest=DECL,
        key=KEY,
        key_id=KID,
        source_class="authoritative_boundary",
        call_id="c1",
        result_status="ok",
        identity_state="present",
        decision_verdict="match",
    )
    fields.update(overrides)
    return build_carrier(**fields)


# --- args_digest (2.2) ---------------------------------------------------------------------


def test_reference_example_args_digest() -> None:
    preimage = 'assay.tool_args.v0:fixture-kid-v0:{"env":"prod"}'
    expected_hex = hmac_hex(REFERENCE_KEY, preimage)
    assert expected_hex.startswith("c6b5ae61") and expected_hex.endswith("6ffd")  # the page's example
    digest = args_digest({"env": "prod"}, REFERENCE_KEY, REFERENCE_KID)
    assert digest == f"hmac-sha256:fixture-kid-v0:{expected_hex}"


def test_args_digest_preimage_is_domain_kid_and_jcs() -> None:
    args = {"z": [1, {"b": True, "a": None}], "a": "x/y", "m": "é"}
    preimage = "assay.tool_args.v0:" + KID + ":" + plain_jcs(args)
    assert args_digest(args, KEY, KID) == f"hmac-sha256:{KID}:{hmac_hex(KEY, preimage)}"


@pytest.mark.parametrize("args,jcs", [(None, "null"), ([1, "a"], '[1,"a"]'), ("s", '"s"'), (7, "7")])
def test_args_digest_accepts_any_json_arguments(args: Any, jcs: str) -> None:
    expected = hmac_hex(KEY, f"assay.tool_args.v0:{KID}:{jcs}")
    assert args_digest(args, KEY, KID) == f"hmac-sha256:{KID}:{expected}"


def test_args_digest_integers_beyond_2_53_digest_as_doubles() -> None:
    preimage = f"assay.tool_args.v0:{KID}:" + '{"n":9007199254740992}'
    assert args_digest({"n": 9007199254740993}, KEY, KID) == f"hmac-sha256:{KID}:{hmac_hex(KEY, preimage)}"


@pytest.mark.parametrize(
    "key,key_id",
    [(b"", KID), (KEY, ""), (KEY, "bad id"), (KEY, "bad:id"), (KEY, "k\u00efd"), ("str-key", KID)],
)
def test_args_digest_refuses_empty_key_or_bad_key_id(key: Any, key_id: str) -> None:
    assert args_digest({"path": "/x"}, key, key_id) is None


def test_args_digest_good_key_id_alphabet() -> None:
    assert args_digest({"path": "/x"}, KEY, "good.key_id-v0") is not None


def test_args_digest_refuses_uncanonical_arguments() -> None:
    assert args_digest({"n": 10**400}, KEY, KID) is None


def test_low_entropy_argument_is_not_recoverable_without_the_key() -> None:
    truth = args_digest({"admin": True}, KEY, KID)
    assert truth in {args_digest({"admin": v}, KEY, KID) for v in (True, False)}
    assert truth not in {args_digest({"admin": v}, b"attacker-guess", KID) for v in (True, False)}


# --- secret-key rule (2.3) -----------------------------------------------------------------

SPEC_TOKENS = (
    "token accesstoken refreshtoken authtoken idtoken sessiontoken password passwd apikey secret "
    "clientsecret secretkey authorization credential credentials privatekey secretaccesskey"
).split()
SPEC_DROPPED = [
    "Authorization",
    "client_secret",
    "clientSecret",
    "refresh_token",
    "ACCESS_TOKEN",
    "access-token",
    "apiKey",
    "api-key",
    "privateKey",
    "secretAccessKey",
]
SPEC_KEPT = ["github_token", "public_key", "key"]


def test_secret_token_list_is_the_spec_list() -> None:
    assert SECRET_KEY_TOKENS == frozenset(SPEC_TOKENS)
    assert len(SPEC_TOKENS) == 17


@pytest.mark.parametrize("name", SPEC_DROPPED + SPEC_TOKENS + ["Api Key", "PASS-WD", "Session_Token"])
def test_secret_like_key_is_dropped(name: str) -> None:
    assert is_secret_key(name)
    base_preimage = f"assay.tool_args.v0:{KID}:" + '{"path":"/x"}'
    assert args_digest({"path": "/x", name: "super-secret-value"}, KEY, KID) == (
        f"hmac-sha256:{KID}:{hmac_hex(KEY, base_preimage)}"
    )


@pytest.mark.parametrize("name", SPEC_KEPT + ["tokens", "my_password", "secret_name", "keyid"])
def test_other_key_is_kept(name: str) -> None:
    assert not is_secret_key(name)
    preimage = f"assay.tool_args.v0:{KID}:" + plain_jcs({"path": "/x", name: "v"})
    assert args_digest({"path": "/x", name: "v"}, KEY, KID) == f"hmac-sha256:{KID}:{hmac_hex(KEY, preimage)}"


def test_normalization_is_per_character_lowercase_without_separators() -> None:
    assert normalize_secret_key("Client_Secret-Key Id") == "clientsecretkeyid"
    # Kelvin sign lowercases to ASCII k per character, as Rust's char::to_lowercase does.
    assert is_secret_key("api\u212aey")
    # Final sigma is not applied: each character lowercases on its own.
    assert normalize_secret_key("AΣ") == "aσ"


def test_secret_keys_dropped_at_every_depth_including_arrays() -> None:
    args = {
        "cfg": {"host": "h", "token": "aaa", "inner": {"Password": "p"}},
        "items": [{"password": "p1", "k": "v"}, [{"apiKey": "x"}], "token"],
        "token": "top",
    }
    projected = {"cfg": {"host": "h", "inner": {}}, "items": [{"k": "v"}, [{}], "token"]}
    assert drop_secret_keys(args) == projected
    preimage = f"assay.tool_args.v0:{KID}:" + plain_jcs(projected)
    assert args_digest(args, KEY, KID) == f"hmac-sha256:{KID}:{hmac_hex(KEY, preimage)}"


def test_non_secret_value_still_contributes() -> None:
    assert args_digest({"account": "a"}, KEY, KID) != args_digest({"account": "b"}, KEY, KID)


# --- observed input and identity digests (2.4, 2.9) -----------------------------------------


def test_observed_input_digest_preimage() -> None:
    ad = f"hmac-sha256:{KID}:" + "ab" * 32
    preimage = '{"args_digest":"' + ad + '","order":3,"tool_name":"deploy"}'
    assert observed_input_digest("deploy", ad, 3) == "sha256:" + sha_hex(preimage)


@settings(max_examples=400)
@given(
    tool_name=st.text(st.characters(blacklist_categories=())),  # control characters and lone surrogates too
    args_digest=st.text(st.characters(blacklist_categories=())),
    order=st.one_of(
        st.integers(-(2**63), 2**63 - 1),
        st.sampled_from([2**53 - 1, 2**53, -(2**53 - 1), -(2**53), 0, -1]),
    ),
)
def test_observed_input_digest_is_the_digest_of_the_canonical_object(
    tool_name: str, args_digest: str, order: int
) -> None:
    from drawbridge.canonical import CanonicalizationError, jcs_digest

    try:
        expected = jcs_digest({"tool_name": tool_name, "args_digest": args_digest, "order": order})
    except CanonicalizationError:
        with pytest.raises(CanonicalizationError):
            observed_input_digest(tool_name, args_digest, order)
        return
    assert observed_input_digest(tool_name, args_digest, order) == expected


def test_observed_input_digest_rejects_non_integer_order() -> None:
    with pytest.raises(ValueError):
        observed_input_digest("t", "x", True)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        observed_input_digest("t", "x", 2**63)


def test_decision_identity_digest_preimage_sorts_declared_first() -> None:
    oid, dpd = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    preimage = '{"declared_policy_digest":"' + dpd + '","observed_input_digest":"' + oid + '"}'
    assert decision_identity_digest(oid, dpd) == "sha256:" + sha_hex(preimage)


# --- builder (2.1) ----------------------------------------------------------------------------


def test_carrier_fields_in_format_order_with_recomputed_digests() -> None:
    c = carrier(args={"env": "prod", "token": "T0P-SECRET"}, order=4, call_id="call-4")
    assert list(c) == [
        "schema",
        "tool_name",
        "args_digest",
        "order",
        "source_class",
        "call_id",
        "result_status",
        "identity_state",
        "key_id",
        "declared_ref",
        "decision_verdict",
        "observed_input_digest",
        "declared_policy_digest",
        "decision_identity",
    ]
    ad = f"hmac-sha256:{KID}:" + hmac_hex(KEY, f'assay.tool_args.v0:{KID}:{{"env":"prod"}}')
    oid = "sha256:" + sha_hex('{"args_digest":"' + ad + '","order":4,"tool_name":"deploy"}')
    assert c["schema"] == "assay.tool_decision_truth.v0"
    assert c["args_digest"] == ad
    assert c["observed_input_digest"] == oid
    assert c["declared_ref"] is None
    assert c["decision_verdict"] == "match"
    assert c["key_id"] == KID
    assert c["decision_identity"] == {"observed_input_digest": oid, "declared_policy_digest": DECL}
    assert list(c["decision_identity"]) == ["observed_input_digest", "declared_policy_digest"]
    assert "T0P-SECRET" not in json.dumps(c)
    assert carrier_content_digest(c) == "sha256:" + sha_hex(plain_jcs(c))
    assert validate_carrier(c) == []


def test_unclassified_carrier_has_null_verdict_in_place() -> None:
    c = carrier(decision_verdict=None)
    assert list(c).index("decision_verdict") == 10 and c["decision_verdict"] is None


def test_identity_stable_under_provenance_and_moved_by_observed_inputs() -> None:
    a = carrier()
    b = carrier(
        source_class="reported_trace", call_id="other", result_status="error", identity_state="absent"
    )
    assert a["decision_identity"] == b["decision_identity"]
    assert carrier_content_digest(a) != carrier_content_digest(b)
    for change in ({"tool_name": "deploy2"}, {"args": {"env": "dev"}}, {"order": 5}):
        assert carrier(**change)["observed_input_digest"] != a["observed_input_digest"]


@pytest.mark.parametrize(
    "field,bad",
    [
        ("source_class", "made_up_source"),
        ("result_status", "maybe"),
        ("identity_state", "unknown_state"),
        ("decision_verdict", "approved"),
        ("source_class", None),
    ],
)
def test_builder_refuses_out_of_vocabulary_labels(field: str, bad: Any) -> None:
    with pytest.raises(CarrierVocabularyError) as err:
        carrier(**{field: bad})
    assert err.value.field == field
    assert try_build_carrier(**_fields(**{field: bad})) is None


@pytest.mark.parametrize(
    "field,bad",
    [
        ("declared_policy_digest", "sha256:decl"),
        ("declared_policy_digest", "not-a-digest"),
        ("declared_policy_digest", "sha256:" + "A" * 64),
        ("key", b""),
        ("key_id", "bad id"),
        ("order", True),
        ("order", 1.0),
        ("order", -(2**63) - 1),
        ("tool_name", None),
        ("call_id", 5),
        ("args", {"n": float("nan")}),
    ],
)
def test_builder_refuses_malformed_inputs_naming_the_field(field: str, bad: Any) -> None:
    with pytest.raises(CarrierError) as err:
        carrier(**{field: bad})
    assert err.value.field == field
    assert try_build_carrier(**_fields(**{field: bad})) is None


def _fields(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = dict(
        tool_name="deploy",
        args={"env": "prod"},
        order=0,
        declared_policy_digest=DECL,
        key=KEY,
        key_id=KID,
        source_class="authoritative_boundary",
        call_id="c1",
        result_status="ok",
        identity_state="present",
    )
    fields.update(overrides)
    return fields


def test_vocabularies_are_the_spec_vocabularies() -> None:
    assert SOURCE_CLASSES == ("authoritative_boundary", "reported_trace", "inferred")
    assert RESULT_STATUSES == ("ok", "error", "n/a")
    assert IDENTITY_STATES == ("present", "absent", "required_missing", "invalid")
    assert FORBIDDEN_RAW_ARG_KEYS == ("args", "arguments", "input", "tool_arguments")


# --- import gate (5.3) --------------------------------------------------------------------


def tampered(mutate: Any) -> dict[str, Any]:
    c = copy.deepcopy(carrier())
    mutate(c)
    return c


@pytest.mark.parametrize(
    "name,mutate,field",
    [
        ("not_object", None, "carrier"),
        ("schema", lambda c: c.update(schema="other.v0"), "schema"),
        ("raw_args_top", lambda c: c.update(arguments={"env": "SECRET-VALUE"}), "raw_arguments"),
        ("raw_args_nested", lambda c: c["decision_identity"].update(input="SECRET-VALUE"), "raw_arguments"),
        ("raw_args_in_array", lambda c: c.update(extra=[{"tool_arguments": 1}]), "raw_arguments"),
        ("args_digest_form", lambda c: c.update(args_digest="not-an-hmac"), "args_digest"),
        ("args_digest_upper", lambda c: c.update(args_digest=c["args_digest"].upper()), "args_digest"),
        ("kid_mismatch", lambda c: c.update(key_id="other-kid"), "key_id"),
        ("kid_missing", lambda c: c.pop("key_id"), "key_id"),
        ("oid_form", lambda c: c.update(observed_input_digest="sha256:bad"), "observed_input_digest"),
        ("dpd_form", lambda c: c.update(declared_policy_digest="sha256:bad"), "declared_policy_digest"),
        (
            "identity_pair",
            lambda c: c["decision_identity"].update(declared_policy_digest="sha256:" + "2" * 64),
            "decision_identity",
        ),
        ("identity_missing", lambda c: c.pop("decision_identity"), "decision_identity"),
        ("tool_name_changed", lambda c: c.update(tool_name="delete_all"), "observed_input_digest"),
        ("order_changed", lambda c: c.update(order=7), "observed_input_digest"),
        ("order_float", lambda c: c.update(order=0.0), "order"),
        ("order_bool", lambda c: c.update(order=False), "order"),
        ("source_class", lambda c: c.update(source_class="made_up"), "source_class"),
        ("result_status", lambda c: c.update(result_status="maybe"), "result_status"),
        ("identity_state", lambda c: c.update(identity_state="unknown"), "identity_state"),
        ("call_id_missing", lambda c: c.pop("call_id"), "call_id"),
        ("verdict_vocab", lambda c: c.update(decision_verdict="approved"), "decision_verdict"),
        ("uncanonical", lambda c: c.update(extra=10**400), "carrier"),
    ],
)
def test_validate_carrier_names_each_problem(name: str, mutate: Any, field: str) -> None:
    c: Any = "not an object" if mutate is None else tampered(mutate)
    problems = validate_carrier(c)
    assert problems, name
    assert any(p.startswith(field + ":") for p in problems), problems
    assert not any("SECRET-VALUE" in p for p in problems)


def test_validate_carrier_null_verdict_ok_unless_binding() -> None:
    c = carrier(decision_verdict=None)
    assert validate_carrier(c) == []
    problems = validate_carrier(c, require_verdict=True)
    assert len(problems) == 1 and "to bind a recipe row" in problems[0]


def test_validate_carrier_reports_every_problem_not_just_the_first() -> None:
    c = tampered(lambda c: c.update(schema="x", source_class="y", call_id=None))
    fields = {p.split(":")[0] for p in validate_carrier(c)}
    assert {"schema", "source_class", "call_id"} <= fields


# --- properties ----------------------------------------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers(-(2**60), 2**60) | st.text(max_size=8)
plain_keys = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=6).filter(
    lambda k: not is_secret_key(k)
)


@st.composite
def secret_spellings(draw: st.DrawFn) -> str:
    """A spec token with random case and separators sprinkled in: always secret-like."""
    token = draw(st.sampled_from(SPEC_TOKENS))
    out = []
    for ch in token:
        out.append(ch.upper() if draw(st.booleans()) else ch)
        out.append(draw(st.sampled_from(["", "", "_", "-", " "])))
    return "".join(out)


@st.composite
def args_with_secrets(draw: st.DrawFn, depth: int = 3) -> tuple[Any, Any]:
    """(arguments holding MARKER values under secret-like keys, the same arguments without them)."""
    if depth == 0 or draw(st.booleans()):
        value = draw(json_scalars)
        if isinstance(value, str) and "MARKER" in value:
            value = "x"
        return value, value
    if draw(st.booleans()):
        items = draw(st.lists(args_with_secrets(depth - 1), max_size=3))
        return [a for a, _ in items], [b for _, b in items]
    plain = draw(st.dictionaries(plain_keys, args_with_secrets(depth - 1), max_size=3))
    secrets = draw(st.lists(secret_spellings(), max_size=3))
    full = {k: a for k, (a, _) in plain.items()}
    for i, name in enumerate(secrets):
        full[name] = f"MARKER-{i}-{{leak}}"
    return full, {k: b for k, (_, b) in plain.items()}


@settings(max_examples=150, deadline=None)
@given(args_with_secrets())
def test_no_secret_value_ever_reaches_a_carrier(pair: tuple[Any, Any]) -> None:
    full, cleaned = pair
    c = carrier(args=full)
    assert "MARKER" not in json.dumps(c, ensure_ascii=False)
    assert c["args_digest"] == args_digest(cleaned, KEY, KID)
    assert validate_carrier(c) == []


def _reverse_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _reverse_keys(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reverse_keys(v) for v in value]
    return value


json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_args_digest_ignores_key_order(args: Any) -> None:
    assert args_digest(args, KEY, KID) == args_digest(_reverse_keys(args), KEY, KID)
