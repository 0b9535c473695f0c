"""A policy prepared once gives the same verdict as reading it on every call.

``prepared_decision_verdict(prepare_policy(p), ...)`` must equal ``decision_verdict(p, ...)`` for every
policy, tool, arguments, identity and evidence: checked on the committed truth vectors and on a
generated matrix that reaches every axis, malformed schemas and shared ``$defs`` included.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from drawbridge.evidence.truth.assay_errors import AssayPolicyError
from drawbridge.evidence.truth.evidence import Evidence
from drawbridge.evidence.truth.prepared import prepare_policy, prepared_decision_verdict
from drawbridge.evidence.truth.verdict import JSON_NULL, decision_axes, decision_verdict

VECTORS = json.loads((Path(__file__).parent / "vectors" / "tdt" / "vectors.json").read_text(encoding="utf-8"))


def _observed_args(decision: dict[str, Any]) -> Any:
    args = decision.get("args")
    return None if args is None else args


@pytest.mark.parametrize("index", range(len(VECTORS["cases"])))
def test_prepared_verdicts_equal_the_vectors_and_the_unprepared_route(index: int) -> None:
    case = VECTORS["cases"][index]
    policy = VECTORS["policies"][case["policy"]]
    prepared = prepare_policy(policy)
    verdicts = []
    for decision in case["observed"]:
        evidence = Evidence.from_json(decision.get("evidence"))
        args = _observed_args(decision)
        plain = decision_verdict(policy, decision["tool_name"], args, decision["identity_state"], evidence)
        # Twice: the second call reads the prepared schema cache.
        for _ in range(2):
            got = prepared_decision_verdict(prepared, decision["tool_name"], args, decision["identity_state"], evidence)
            assert got == plain
        verdicts.append(got)
    assert verdicts == case["expected"]["decisions"]


POLICIES: list[dict[str, Any]] = [
    {"version": "2.0", "tools": {"allow": ["read_*", "echo"], "deny": ["*admin*"]}, "schemas": {}},
    {
        "tools": {"allow": ["*"], "approval_required": ["pay*"], "redact_args": ["secret*"]},
        "schemas": {
            "echo": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
            "pay": {"type": "object", "properties": {"amount": {"$ref": "#/$defs/money"}}},
            "$defs": {"money": {"type": "integer", "maximum": 100}},
            "broken": {"type": "not-a-type"},
            "remote": {"$ref": "https://example.invalid/schema.json"},
        },
        "enforcement": {"unconstrained_tools": "deny"},
    },
    {"tools": {"deny_classes": ["admin"], "allow_classes": ["read"]}, "enforcement": {"unconstrained_tools": "warn"}},
    {"constraints": [{"tool": "fetch", "params": {"url": {"matches": "^https://"}}}], "schemas": {"fetch": True}},
    {"schemas": {"x": {"$defs": 3}, "$defs": {"a": {}}}, "tools": {"restrict_scope": ["x"]}},
]
TOOLS = ["echo", "read_file", "site_admin", "pay", "broken", "remote", "fetch", "secret_rotate", "x", "$defs", "other"]
ARGS = [None, JSON_NULL, {}, {"text": "hi"}, {"text": 3}, {"amount": 50}, {"amount": 500}, {"url": "https://a"},
        {"url": "http://a"}, [1, 2]]
EVIDENCE = [
    Evidence(),
    Evidence(tool_classes=("admin",), approval_obtained=True),
    Evidence(tool_classes=("read",), scope_satisfied=False, redaction_applied=True),
]


@pytest.mark.parametrize("policy_index", range(len(POLICIES)))
def test_prepared_axes_equal_the_unprepared_axes(policy_index: int) -> None:
    policy = POLICIES[policy_index]
    prepared = prepare_policy(policy)
    for tool, args, identity, evidence in itertools.product(
        TOOLS, ARGS, ["present", "absent", "required_missing", "bogus"], EVIDENCE
    ):
        assert prepared.axes(tool, args, identity, evidence) == decision_axes(policy, tool, args, identity, evidence)
        assert prepared_decision_verdict(prepared, tool, args, identity, evidence) == decision_verdict(
            policy, tool, args, identity, evidence
        )


def test_preparing_copies_the_policy() -> None:
    policy: dict[str, Any] = {"tools": {"allow": ["echo"]}, "schemas": {}}
    prepared = prepare_policy(policy)
    policy["tools"]["allow"].append("other")  # the caller changes its dict afterwards
    assert prepared_decision_verdict(prepared, "other", {}, "present") == "mismatch"


def test_an_unreadable_policy_raises_when_prepared() -> None:
    with pytest.raises(AssayPolicyError):
        prepare_policy({"tools": {"allow": "echo"}})
    with pytest.raises(TypeError):
        prepare_policy({"tools": {}}).axes(3, {}, "present")  # type: ignore[arg-type]
