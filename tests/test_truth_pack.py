"""The pack recipe row: construction, the eight fail-closed checks in order, tamper resistance.

Expected digests are recomputed inline with hashlib over JCS text written out per
evidence-formats.md §2.9; forged rows are made self-coherent by the same inline
recomputation, so only the check under test can reject them.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drawbridge.evidence.truth import verdict as verdict_module
from drawbridge.evidence.truth.carrier import DECISION_VERDICTS, build_carrier
from drawbridge.evidence.truth.pack import (
    CHECKS,
    RECIPE,
    RecipeRowError,
    evidence_ref,
    pack_recipe_row,
    verify_recipe_row,
)

KEY = b"drawbridge-test-key"
KID = "drawbridge-kid-v0"
DECL = "sha256:" + "4" * 64
REF = "audit://decision/c1"


def sha_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def plain_jcs(value: Any) -> str:
    """JCS for values with ASCII keys and small integers only."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def make_carrier(verdict: str | None = "match", tool: str = "deploy", order: int = 0) -> dict[str, Any]:
    return build_carrier(
        tool_name=tool,
        args={"env": "prod"},
        order=order,
        declared_policy_digest=DECL,
        key=KEY,
        key_id=KID,
        source_class="authoritative_boundary",
        call_id="c1",
        result_status="ok",
        identity_state="present",
        decision_verdict=verdict,
    )


def content_of(carrier: dict[str, Any]) -> str:
    return "sha256:" + sha_hex(plain_jcs(carrier))


def identity_of(carrier: dict[str, Any]) -> str:
    return "sha256:" + sha_hex(
        '{"declared_policy_digest":"'
        + carrier["declared_policy_digest"]
        + '","observed_input_digest":"'
        + carrier["observed_input_digest"]
        + '"}'
    )


def coherent_row(recipe: str, envelope: Any, identity: str, run_verdict: str) -> dict[str, Any]:
    """A row whose coherence binding is self-consistent over whatever it is given."""
    binding = {
        "recipe": recipe,
        "evidence_ref": envelope,
        "decision_identity_digest": identity,
        "run_verdict": run_verdict,
    }
    return dict(binding, coherence_binding="sha256:" + sha_hex(plain_jcs(binding)))


def good_envelope(carrier: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "tool_decision_truth",
        "digest": content_of(carrier),
        "digest_subject": "carrier_content",
        "canonicalization": "jcs-json-v1",
        "schema": "assay.tool_decision_truth.v0",
        "ref": REF,
    }


def failed_check(result: tuple[bool, str | None]) -> str | None:
    ok, failed = result
    assert ok == (failed is None)
    return None if failed is None else failed.split(":")[0]


# --- construction --------------------------------------------------------------------------


def test_vocabularies_agree_with_the_lattice() -> None:
    assert set(DECISION_VERDICTS) == set(verdict_module.VERDICTS)
    assert RECIPE == "tool_decision_truth.v0"
    assert CHECKS == (
        "recipe",
        "envelope",
        "run_verdict",
        "verdict_covers",
        "digest_form",
        "content_digest",
        "decision_identity",
        "coherence_binding",
    )


def test_evidence_ref_fields_and_order() -> None:
    c = make_carrier()
    er = evidence_ref(content_of(c), REF)
    assert er == good_envelope(c)
    assert list(er) == ["type", "digest", "digest_subject", "canonicalization", "schema", "ref"]


def test_pack_recipe_row_matches_inline_recomputation() -> None:
    c = make_carrier()
    row = pack_recipe_row(c, "match", REF)
    assert list(row) == [
        "recipe",
        "evidence_ref",
        "decision_identity_digest",
        "run_verdict",
        "coherence_binding",
    ]
    assert row == coherent_row(RECIPE, good_envelope(c), identity_of(c), "match")
    assert row["decision_identity_digest"] != row["evidence_ref"]["digest"]
    assert verify_recipe_row(row, c, "match") == (True, None)


def test_null_verdict_carrier_accepts_any_run_verdict() -> None:
    c = make_carrier(verdict=None)
    for v in ("match", "incomplete", "mismatch", "invalid"):
        assert verify_recipe_row(pack_recipe_row(c, v, REF), c, v) == (True, None)


def test_more_severe_run_verdict_covers_the_carrier() -> None:
    c = make_carrier(verdict="incomplete")
    assert verify_recipe_row(pack_recipe_row(c, "invalid", REF), c, "invalid") == (True, None)


@pytest.mark.parametrize(
    "carrier_verdict,run_verdict",
    [("match", "approved"), ("mismatch", "match"), ("invalid", "mismatch"), ("match", "")],
)
def test_pack_recipe_row_refuses_bogus_or_understated_verdict(carrier_verdict: str, run_verdict: str) -> None:
    with pytest.raises(RecipeRowError):
        pack_recipe_row(make_carrier(verdict=carrier_verdict), run_verdict, REF)


def test_pack_recipe_row_refuses_non_vocabulary_carrier_verdict_and_bad_digests() -> None:
    bad_verdict = dict(make_carrier(), decision_verdict="approved")
    for run in ("match", "invalid"):
        with pytest.raises(RecipeRowError):
            pack_recipe_row(bad_verdict, run, REF)
    for field in ("observed_input_digest", "declared_policy_digest"):
        with pytest.raises(RecipeRowError):
            pack_recipe_row(dict(make_carrier(), **{field: "sha256:bad"}), "match", REF)
    with pytest.raises(RecipeRowError):
        pack_recipe_row(dict(make_carrier(), extra=10**400), "match", REF)


# --- the eight checks, each isolated ------------------------------------------------------


def check_of(row: Any, carrier: Any, run_verdict: str = "match") -> str | None:
    return failed_check(verify_recipe_row(row, carrier, run_verdict))


def forged(
    carrier: dict[str, Any],
    run_verdict: str = "match",
    recipe: str = RECIPE,
    identity: str | None = None,
    **envelope_changes: Any,
) -> dict[str, Any]:
    """A self-coherent row over ``carrier`` with the given substitutions."""
    envelope = dict(good_envelope(carrier), **envelope_changes)
    return coherent_row(recipe, envelope, identity or identity_of(carrier), run_verdict)


def test_check_1_recipe() -> None:
    c = make_carrier()
    assert check_of(forged(c, recipe="other.recipe.v0"), c) == "recipe"
    assert check_of(["not", "a", "row"], c) == "recipe"


@pytest.mark.parametrize(
    "field,bad",
    [
        ("type", "other"),
        ("schema", "other.schema.v0"),
        ("canonicalization", "cbor-deterministic-v1"),
        ("digest_subject", "decision_identity"),
    ],
)
def test_check_2_envelope_fields(field: str, bad: str) -> None:
    c = make_carrier()
    ok, failed = verify_recipe_row(forged(c, **{field: bad}), c, "match")
    assert not ok and failed is not None and failed.startswith("envelope:") and field in failed
    missing = {k: v for k, v in good_envelope(c).items() if k != field}
    assert check_of(coherent_row(RECIPE, missing, identity_of(c), "match"), c) == "envelope"


def test_check_2_envelope_not_an_object() -> None:
    c = make_carrier()
    assert check_of(coherent_row(RECIPE, "sha256:x", identity_of(c), "match"), c) == "envelope"


def test_check_3_run_verdict_is_the_verified_one() -> None:
    c = make_carrier()
    row = pack_recipe_row(c, "match", REF)
    assert check_of(dict(row, run_verdict="incomplete"), c, "match") == "run_verdict"
    assert check_of(row, c, "mismatch") == "run_verdict"


def test_check_4_verdict_vocabulary_and_coverage() -> None:
    c = make_carrier()
    assert check_of(forged(c, "approved"), c, "approved") == "verdict_covers"
    worse = make_carrier(verdict="mismatch", tool="delete_all")
    assert check_of(forged(worse, "match"), worse, "match") == "verdict_covers"
    odd = dict(make_carrier(), decision_verdict="approved")
    assert check_of(forged(odd, "invalid"), odd, "invalid") == "verdict_covers"
    assert check_of(pack_recipe_row(c, "match", REF), "not a carrier") == "verdict_covers"


def test_check_5_digest_forms() -> None:
    c = make_carrier()
    assert check_of(forged(c, digest="sha256:short"), c) == "digest_form"
    assert check_of(forged(c, identity="not-a-digest"), c) == "digest_form"
    upper = "sha256:" + content_of(c)[7:].upper()
    assert check_of(forged(c, digest=upper), c) == "digest_form"


def test_check_6_content_digest_covers_every_carrier_field() -> None:
    c = make_carrier()
    row = pack_recipe_row(c, "match", REF)
    for field, value in [("result_status", "error"), ("call_id", "c2"), ("declared_ref", "x"), ("extra", 1)]:
        assert check_of(row, dict(c, **{field: value})) == "content_digest"
    assert check_of(forged(c, digest="sha256:" + "0" * 64), c) == "content_digest"


def test_check_7_decision_identity() -> None:
    bad = dict(make_carrier(), observed_input_digest="sha256:bad")
    identity = "sha256:" + sha_hex(
        '{"declared_policy_digest":"' + DECL + '","observed_input_digest":"sha256:bad"}'
    )
    assert check_of(forged(bad, identity=identity), bad) == "decision_identity"
    c = make_carrier()
    assert check_of(forged(c, identity="sha256:" + "9" * 64), c) == "decision_identity"


def test_check_8_coherence_binding() -> None:
    c = make_carrier()
    row = pack_recipe_row(c, "match", REF)
    assert check_of(dict(row, coherence_binding="sha256:" + "0" * 64), c) == "coherence_binding"
    moved_ref = copy.deepcopy(row)
    moved_ref["evidence_ref"]["ref"] = "audit://decision/elsewhere"
    assert check_of(moved_ref, c) == "coherence_binding"
    extra = copy.deepcopy(row)
    extra["evidence_ref"]["note"] = "added"
    assert check_of(extra, c) == "coherence_binding"
    assert check_of({k: v for k, v in row.items() if k != "coherence_binding"}, c) == "coherence_binding"


def test_ref_and_extra_envelope_keys_are_bound_not_validated() -> None:
    c = make_carrier()
    assert verify_recipe_row(forged(c, ref=12, note="kept"), c, "match") == (True, None)


def test_checks_run_in_order() -> None:
    c = make_carrier()
    # Foreign recipe AND wrong verdict AND bad binding: the recipe check reports first.
    row = dict(pack_recipe_row(c, "match", REF), recipe="x", run_verdict="invalid", coherence_binding="y")
    assert check_of(row, c) == "recipe"
    row = dict(pack_recipe_row(c, "match", REF), run_verdict="invalid", coherence_binding="y")
    assert check_of(row, c) == "run_verdict"

# --- property: any single-byte change that still parses fails closed ------------------------

CARRIERS = [
    make_carrier(),
    make_carrier(verdict="mismatch", tool="delete_all", order=1),
    make_carrier(verdict=None, order=2),
]
PAIRS = [(c, pack_recipe_row(c, v, REF)) for c, v in zip(CARRIERS, ["match", "mismatch", "incomplete"])]


def compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def flipped(data: bytes, position: int, replacement: int) -> Any:
    mutated = bytearray(data)
    mutated[position % len(mutated)] = replacement
    try:
        return json.loads(bytes(mutated))
    except (ValueError, UnicodeDecodeError):
        return None


def verifies(row: Any, carrier: Any) -> bool:
    run = row.get("run_verdict") if isinstance(row, dict) else None
    return verify_recipe_row(row, carrier, run if isinstance(run, str) else "")[0]


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(range(len(PAIRS))),
    st.booleans(),
    st.integers(min_value=0, max_value=10**6),
    st.integers(min_value=0, max_value=255),
)
def test_any_parseable_single_byte_change_fails(
    pair: int, in_carrier: bool, position: int, byte: int
) -> None:
    carrier, row = PAIRS[pair]
    assert verifies(row, carrier)
    data = compact(carrier if in_carrier else row)
    if data[position % len(data)] == byte:
        return
    changed = flipped(data, position, byte)
    if changed is None:
        return
    if in_carrier:
        assert not verifies(row, changed)
    else:
        assert not verifies(changed, carrier)


def test_every_position_flipped_fails() -> None:
    """Exhaustive companion to the property: each byte, replaced by a neighbour value."""
    for carrier, row in PAIRS:
        for in_carrier in (True, False):
            data = compact(carrier if in_carrier else row)
            for position in range(len(data)):
                for byte in {data[position] ^ 1, data[position] ^ 0x20}:
                    changed = flipped(data, position, byte)
                    if changed is None:
                        continue
                    if in_carrier:
                        assert not verifies(row, changed), (position, byte)
                    else:
                        assert not verifies(changed, carrier), (position, byte)
