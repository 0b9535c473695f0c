"""The tools/call pipeline pieces without pipes: parsing, refusals, response outcomes, the child's environment."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from drawbridge.catalogue.names import tool_name_problem
from drawbridge.gateway.pipeline.deciders import allow_all, decider_failure, deny_all
from drawbridge.gateway.pipeline.outcomes import Outcome, outcome_of_response
from drawbridge.gateway.pipeline.tool_call import ToolCall, parse_tool_call, requested_tool_name
from drawbridge.gateway.pipeline.verdicts import Action, Provenance, Verdict, refusal_for, refusal_result
from drawbridge.gateway.protocol.jsonrpc import INVALID_PARAMS, MessageError, parse_client_message
from drawbridge.gateway.upstreams.child_spawn import EnvPolicy

ENVELOPE_KEY = "io.modelcontextprotocol/protocolVersion"


def _call_message(params: object, request_id: object = 1) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}).encode()


def test_parse_reads_name_arguments_meta_and_era() -> None:
    message = parse_client_message(
        _call_message({"name": "get_repo", "arguments": {"owner": "a"}, "_meta": {ENVELOPE_KEY: "2026-07-28"}})
    )
    call = parse_tool_call(message, "agent-1", "2025-11-25")
    assert call == ToolCall("agent-1", "get_repo", {"owner": "a"}, {ENVELOPE_KEY: "2026-07-28"}, 1, "2026-07-28")
    assert call.modern
    legacy = parse_tool_call(parse_client_message(_call_message({"name": "x"})), "a", "2025-11-25")
    assert legacy.arguments == {} and legacy.protocol_version == "2025-11-25" and not legacy.modern


@pytest.mark.parametrize(
    "params",
    [None, [], "x", {}, {"name": 3}, {"name": "x", "arguments": []}, {"name": "x", "arguments": None},
     {"name": "x", "_meta": "m"}, {"name": "a\tb"}],
)
def test_parse_refuses_what_policy_cannot_read(params: object) -> None:
    with pytest.raises(MessageError) as caught:
        parse_tool_call(parse_client_message(_call_message(params, "q")), "a", None)
    assert caught.value.code == INVALID_PARAMS
    assert caught.value.request_id == "q"


@given(st.text(min_size=1, max_size=40))
def test_tool_name_check_refuses_exactly_the_dangerous_categories(name: str) -> None:
    import unicodedata

    dangerous = any(unicodedata.category(c) in {"Cc", "Cf", "Cs", "Zl", "Zp"} for c in name)
    problem = tool_name_problem(name)
    if dangerous:
        assert problem is not None
    elif name == name.strip():
        assert problem is None
    if problem is not None:  # one of the fixed messages: the name itself is never repeated
        assert re.fullmatch(
            r"tool name (is empty|is longer than 1024 characters|has leading or trailing whitespace|"
            r"contains a control or format character \(U\+[0-9A-F]{4,6} at index \d+\))",
            problem,
        )


def test_requested_name_is_made_printable_for_records() -> None:
    message = parse_client_message(_call_message({"name": "a\nb\u202ec\u2028d"}))
    assert requested_tool_name(message) == "a\ufffdb\ufffdc\ufffdd"
    assert requested_tool_name(parse_client_message(_call_message({"name": 5}))) is None


def test_only_allow_forwards() -> None:
    assert refusal_for(Verdict(Action.ALLOW, "ok")) is None
    deny = refusal_for(Verdict(Action.DENY, "no"))
    assert deny is not None and deny.outcome is Outcome.REFUSED and deny.reason == "no"
    approval = refusal_for(Verdict(Action.HUMAN_APPROVAL, "ask"))
    assert approval is not None and approval.outcome is Outcome.APPROVAL_UNAVAILABLE
    assert approval.reason == "approval unavailable"


def test_refusal_result_names_rule_and_reason_for_each_era() -> None:
    verdict = Verdict(Action.DENY, "writes are reviewed\x1b[31m", Provenance("team", "p/team.yaml", 4))
    refusal = refusal_for(verdict)
    assert refusal is not None
    legacy_call = ToolCall("a", "delete_repo", {"name": "secret-value"}, None, 9, "2025-11-25")
    result = refusal_result(verdict, refusal, legacy_call)
    assert result == {
        "content": [
            {
                "type": "text",
                "text": 'drawbridge refused this call: policy "team" rule 4: writes are reviewed\ufffd[31m',
            }
        ],
        "isError": True,
        "_meta": {"drawbridge/decision": {"action": "deny", "outcome": "refused", "policy": "team", "rule_index": 4}},
    }
    assert "secret-value" not in json.dumps(result)
    assert "p/team.yaml" not in json.dumps(result)  # the agent learns the rule, not the server's paths
    modern_call = ToolCall("a", "delete_repo", {}, None, 9, "2026-07-28")
    assert refusal_result(verdict, refusal, modern_call)["resultType"] == "complete"


def test_provenance_labels() -> None:
    assert Provenance().label() == "default deny"
    assert Provenance("p").label() == 'policy "p"'
    assert Provenance("p", "f", 0).label() == 'policy "p" rule 0'


@pytest.mark.anyio
async def test_builtin_deciders() -> None:
    call = ToolCall("a", "t", {}, None, 1)
    assert (await allow_all(call)).action is Action.ALLOW
    denied = await deny_all(call)
    assert denied.action is Action.DENY and denied.reason == "no policy is loaded"
    failed = decider_failure(KeyError("secret-value"))
    assert failed.action is Action.DENY and "secret-value" not in failed.reason and "KeyError" in failed.reason


@pytest.mark.parametrize(
    ("body", "outcome"),
    [
        ({"result": {"content": []}}, Outcome.OK),
        ({"result": {"content": [], "isError": True}}, Outcome.TOOL_ERROR),
        ({"result": {"content": [], "isError": "yes"}}, Outcome.OK),
        ({"result": {"resultType": "input_required", "inputRequests": {}}}, Outcome.INPUT_REQUIRED),
        ({"error": {"code": -32602, "message": "unknown tool"}}, Outcome.UPSTREAM_ERROR),
        ({"error": "weird"}, Outcome.UPSTREAM_ERROR),
    ],
)
def test_outcome_of_an_upstream_answer(body: dict, outcome: Outcome) -> None:
    assert outcome_of_response(body)[0] is outcome


def test_env_policy() -> None:
    environ = {"PATH": "/bin", "GITHUB_TOKEN": "g", "DRAWBRIDGE_TDT_HMAC_KEY": "k", "DRAWBRIDGE_X": "x", "OTHER": "o"}
    assert EnvPolicy()(environ) == {"PATH": "/bin", "GITHUB_TOKEN": "g", "OTHER": "o"}
    strict = EnvPolicy(inherit=False, allow=frozenset({"PATH", "DRAWBRIDGE_X"}))
    assert strict(environ) == {"PATH": "/bin"}
    extra = EnvPolicy(deny_names=frozenset({"OTHER"}), extra={"NEW": "n", "DRAWBRIDGE_Y": "y"})
    assert extra(environ) == {"PATH": "/bin", "GITHUB_TOKEN": "g", "NEW": "n"}
    # A denied name the upstream's own env sets passes, with that value, never the gateway's.
    given = EnvPolicy(deny_names=frozenset({"OTHER", "GITHUB_TOKEN"}), extra={"OTHER": "from-config"})
    assert given(environ) == {"PATH": "/bin", "OTHER": "from-config"}
