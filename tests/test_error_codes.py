"""The gateway's error codes follow MCP 2026-07-28's allocation rules, and docs/errors.md lists them all.

The rules ("Error Codes" of the 2026-07-28 base protocol): -32700 and -32600..-32603 are JSON-RPC's;
-32020..-32099 holds MCP's codes, and no implementation may answer with an undefined one there;
-32002 and -32042 must not be answered; -32000..-32019 is a legacy band new code should not take
(the SDKs' -32000 connection closed and -32001 request timeout are kept, with those meanings); a
code of an implementation's own lies outside -32768..-32000. The allowed set below is written from
those rules, not read from the code under test.
"""

from __future__ import annotations

import ast
import re
from typing import Final

from conftest import ROOT
from mcp.shared.inbound import ERROR_CODE_HTTP_STATUS

from drawbridge.gateway.protocol import jsonrpc

JSON_RPC = {-32700, -32600, -32601, -32602, -32603}
MCP_DEFINED = {-32020: "header mismatch", -32021: "missing required client capability", -32022: "unsupported protocol version"}
LEGACY = {-32000, -32001}
FORBIDDEN = {-32002, -32042}


def allowed(code: int) -> bool:
    if code in FORBIDDEN:
        return False
    if code in JSON_RPC or code in MCP_DEFINED or code in LEGACY:
        return True
    return not -32768 <= code <= -32000


READ_ONLY: Final = "# read, never answered"
"""Marks a line naming codes an upstream may send, which the gateway recognises in order to translate
them away (``protocol.hop.modern_error``); the test below proves they never reach an agent of 2026."""


def _codes_in_source() -> dict[int, list[str]]:
    """Every negative integer literal that looks like a JSON-RPC code, where it is written (except on a
    line marked ``READ_ONLY``)."""
    found: dict[int, list[str]] = {}
    for path in sorted((ROOT / "src" / "drawbridge").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant)
                    and isinstance(node.operand.value, int) and 31000 <= node.operand.value <= 32768
                    and READ_ONLY not in lines[node.lineno - 1]):
                found.setdefault(-node.operand.value, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_the_rule_itself() -> None:
    assert not allowed(-32002) and not allowed(-32042) and not allowed(-32050) and not allowed(-32010)
    assert allowed(-32001) and allowed(-32020) and allowed(-31002) and allowed(-32700)


def test_every_code_the_gateway_writes_is_allowed() -> None:
    found = _codes_in_source()
    assert -31002 in found  # the evidence-unwritten code is there to be checked
    bad = {code: where for code, where in found.items() if not allowed(code)}
    assert bad == {}


def test_evidence_unwritten_left_the_reserved_range() -> None:
    assert jsonrpc.EVIDENCE_UNWRITTEN == -31002
    assert (jsonrpc.UPSTREAM_EXITED, jsonrpc.UPSTREAM_TIMEOUT) == (-32000, -32001)


def test_docs_list_every_code_the_gateway_answers_with() -> None:
    text = (ROOT / "docs" / "errors.md").read_text(encoding="utf-8")
    listed = {int(code) for code in re.findall(r"^\| (-3\d{4}) \|", text, flags=re.MULTILINE)}
    answered = set(_codes_in_source()) | set(ERROR_CODE_HTTP_STATUS) | set(MCP_DEFINED)
    answered |= {value for name, value in vars(jsonrpc).items() if name.isupper() and isinstance(value, int) and value < -30000}
    assert answered - listed == set()
    assert listed - answered == set()
    assert "-32002" in text and "never answers" in text  # says which codes it does not use
