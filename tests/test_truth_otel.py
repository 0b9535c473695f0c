"""The OTel projection of verified tool-decision-truth evidence (evidence-formats.md §2.11)."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import pytest

from drawbridge.evidence.truth.carrier import build_carrier
from drawbridge.evidence.truth.otel import (
    UnverifiedDecisionError,
    VerifiedDecision,
    project_tool_decision_truth,
)
from drawbridge.evidence.truth.pack import pack_recipe_row

KEY = b"drawbridge-otel-test-key"
KID = "drawbridge-kid-v0"
DECL = "sha256:" + "8" * 64

# The five non-claims of the reference projection, verbatim.
REFERENCE_NON_CLAIMS = [
    "This projection is a one-directional, lossy view; the assay artifacts remain authoritative.",
    "gen_ai.* and openinference.* fields are a projection, not the source of truth.",
    "A tool-decision-truth verdict is a derived comparison over observed and declared data "
    "(assay.claim_class=derived); it is not a raw observation, not enforcement, and not an intent or "
    "safety judgement.",
    "Raw tool arguments and the keyed args_digest are not projected; this view carries only the "
    "higher-level observed-input, declared-policy, decision-identity, and carrier-content digests.",
    "Pinned to OTel GenAI semconv 1.37.0-development and OpenInference pinned; a version bump is explicit.",
]


def plain_jcs(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def carrier(tool: str, args: Any, order: int, verdict: str | None) -> dict[str, Any]:
    return build_carrier(
        tool_name=tool,
        args=args,
        order=order,
        declared_policy_digest=DECL,
        key=KEY,
        key_id=KID,
        source_class="authoritative_boundary",
        call_id=f"c{order}",
        result_status="ok",
        identity_state="present",
        decision_verdict=verdict,
    )


def verified(c: dict[str, Any], run_verdict: str) -> VerifiedDecision:
    return VerifiedDecision.from_row(c, pack_recipe_row(c, run_verdict, f"ref/{c['order']}"))


def test_projection_envelope_and_spans() -> None:
    c0 = carrier("deploy", {"env": "prod", "password": "hunter2"}, 0, "match")
    c1 = carrier("delete_all", {}, 1, "mismatch")
    projection = project_tool_decision_truth([verified(c0, "match"), verified(c1, "mismatch")])
    assert list(projection) == [
        "schema",
        "semconv",
        "spans",
        "resource_attributes",
        "lossy",
        "source_of_truth",
        "non_claims",
    ]
    assert projection["schema"] == "assay.tool_decision_truth.otel_projection.v0"
    assert projection["semconv"] == {"otel_genai": "1.37.0-development", "openinference": "pinned"}
    assert projection["resource_attributes"] == {"service.name": "drawbridge"}
    assert projection["lossy"] is True
    assert projection["source_of_truth"] == "assay artifacts"
    assert projection["non_claims"] == REFERENCE_NON_CLAIMS

    for span, c, run in zip(projection["spans"], (c0, c1), ("match", "mismatch")):
        assert span["name"] == "execute_tool " + c["tool_name"]
        assert span["kind"] == "INTERNAL"
        oid = c["observed_input_digest"]
        identity = sha('{"declared_policy_digest":"' + DECL + '","observed_input_digest":"' + oid + '"}')
        expected = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": c["tool_name"],
            "tool.name": c["tool_name"],
            "openinference.span.kind": "TOOL",
            "assay.claim_class": "derived",
            "assay.tdt.schema": "assay.tool_decision_truth.v0",
            "assay.tdt.decision_verdict": c["decision_verdict"],
            "assay.tdt.observed_input_digest": c["observed_input_digest"],
            "assay.tdt.declared_policy_digest": DECL,
            "assay.tdt.source_class": "authoritative_boundary",
            "assay.tdt.run_verdict": run,
            "assay.tdt.decision_identity_digest": identity,
            "assay.tdt.carrier_content_digest": sha(plain_jcs(c)),
        }
        assert span["attributes"] == expected
        assert list(span["attributes"]) == list(expected)


def test_never_projects_arguments_or_args_digest() -> None:
    c = carrier("deploy", {"env": "prod", "note": "visible-arg"}, 0, "match")
    text = json.dumps(project_tool_decision_truth([verified(c, "match")]))
    assert c["args_digest"] not in text
    assert c["args_digest"].split(":")[-1] not in text
    assert "visible-arg" not in text
    assert '"arguments"' not in text
    assert "assay.tdt.args_digest" not in text


def test_empty_tool_name_and_non_string_fields_are_left_out() -> None:
    c = carrier("", None, 0, None)
    span = project_tool_decision_truth([verified(c, "incomplete")])["spans"][0]
    assert span["name"] == "execute_tool "
    assert "gen_ai.tool.name" not in span["attributes"] and "tool.name" not in span["attributes"]
    assert "assay.tdt.decision_verdict" not in span["attributes"]
    assert span["attributes"]["assay.tdt.run_verdict"] == "incomplete"


def test_service_name_is_a_parameter() -> None:
    projection = project_tool_decision_truth([], service_name="gateway-eu")
    assert projection["resource_attributes"] == {"service.name": "gateway-eu"}
    assert projection["spans"] == []


def test_unverified_pairs_cannot_be_projected() -> None:
    c = carrier("deploy", {"env": "prod"}, 0, "match")
    row = pack_recipe_row(c, "match", "ref/0")
    with pytest.raises(UnverifiedDecisionError, match="content_digest"):
        VerifiedDecision.from_row(dict(c, call_id="forged"), row)
    understated = copy.deepcopy(row)
    understated["run_verdict"] = "incomplete"
    with pytest.raises(UnverifiedDecisionError, match="coherence_binding"):
        VerifiedDecision.from_row(c, understated)
    with pytest.raises(UnverifiedDecisionError):
        VerifiedDecision.from_row(c, {"run_verdict": 3})
