"""What a person is shown of a waiting call's arguments, and how long the gateway holds it.

The pure part (``approval.shown_arguments``) from values written out by hand; the holding on a real
SQLite state and a real trace log, with the approval engine resolving and expiring as it does in the
gateway; the terminal output helpers of the CLI.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from approval_support import trace_log_appender, unfolded
from hypothesis import given, settings
from hypothesis import strategies as st

from drawbridge.approval.shown_arguments import (
    MAX_SHOWN_CHARS,
    MAX_SHOWN_VALUES,
    MAX_VALUE_CHARS,
    argument_lines,
    show_arguments,
)
from drawbridge.cli.output import display_text, emit_json
from drawbridge.gateway.pipeline.approvals.engine import ApprovalEngine
from drawbridge.gateway.pipeline.approvals.held_arguments import HeldArguments
from drawbridge.gateway.pipeline.approvals.settlement import SettlementKind
from drawbridge.gateway.pipeline.tool_call import ToolCall
from drawbridge.gateway.pipeline.verdicts import Action, Provenance, Verdict
from drawbridge.state.sqlite import StateDB
from drawbridge.state.trace_log import TraceLog

# -- what is shown -------------------------------------------------------------------------------


def test_secret_like_keys_are_masked_at_every_depth_whatever_the_value() -> None:
    arguments = {
        "user": "ada",
        "API-Key": "k-1",
        "db": {"Password": {"old": "p-1", "new": "p-2"}, "host": "h"},
        "hooks": [{"client_secret": "c-1", "url": "u"}, ["x", {"token": ["t-1"]}]],
        "Authorization": None,
    }
    assert show_arguments(arguments).as_dict() == {
        "values": [
            {"path": "/user", "value": "ada"},
            {"path": "/API-Key", "masked": True},
            {"path": "/db/Password", "masked": True},
            {"path": "/db/host", "value": "h"},
            {"path": "/hooks/0/client_secret", "masked": True},
            {"path": "/hooks/0/url", "value": "u"},
            {"path": "/hooks/1/0", "value": "x"},
            {"path": "/hooks/1/1/token", "masked": True},
            {"path": "/Authorization", "masked": True},
        ],
        "omitted": 0,
    }
    text = json.dumps(show_arguments(arguments).as_dict())
    for secret in ("k-1", "p-1", "p-2", "c-1", "t-1"):
        assert secret not in text


def test_paths_are_json_pointers_and_every_kind_of_leaf_is_kept() -> None:
    arguments = {"a/b": 1, "m~n": 2.5, "": True, "e": {}, "l": [], "z": None, "s": ""}
    assert [(v.path, v.value) for v in show_arguments(arguments).values] == [
        ("/a~1b", 1), ("/m~0n", 2.5), ("/", True), ("/e", {}), ("/l", []), ("/z", None), ("/s", ""),
    ]
    assert show_arguments({}).as_dict() == {"values": [], "omitted": 0}
    assert argument_lines(show_arguments({}).as_dict()) == ["(no arguments)"]


def test_a_long_string_is_cut_and_says_so() -> None:
    shown = show_arguments({"code": "c" * (MAX_VALUE_CHARS + 1), "tail": "t"})
    first, second = shown.as_dict()["values"]
    assert first == {"path": "/code", "value": "c" * 8_000, "length": 8_001}
    assert second == {"path": "/tail", "value": "t"}
    assert shown.lines()[0] == '/code (first 8,000 of 8,001 characters): "' + "c" * 8_000 + '"'


def test_past_the_character_budget_values_are_counted_not_shown() -> None:
    # Each value costs its path (2 characters) and its text: two full strings of 7,998 fill 16,000.
    arguments = {"a": "a" * 7_998, "b": "b" * 7_998, "c": "c", "d": 1}
    shown = show_arguments(arguments)
    assert [v.path for v in shown.values] == ["/a", "/b"] and shown.omitted == 2
    assert MAX_SHOWN_CHARS == 16_000
    said = "(2 more values not shown: at most 100 values and 16,000 characters are shown)"
    assert shown.lines()[-1] == said
    # A string that still fits in part is cut to what is left.
    shown = show_arguments({"a": "a" * 7_998, "b": "b" * 7_000, "c": "c" * 3_000})
    assert shown.as_dict()["values"][2] == {"path": "/c", "value": "c" * 996, "length": 3_000}


def test_past_the_value_count_values_are_counted_not_shown() -> None:
    shown = show_arguments({"n": list(range(MAX_SHOWN_VALUES + 5))})
    assert len(shown.values) == 100 and shown.values[-1].path == "/n/99" and shown.omitted == 5
    assert shown.lines()[-1].startswith("(5 more values not shown")
    # What cannot be shown any more is counted as it would have been shown: one per leaf.
    later = {"token": {"a": 1, "b": 2}, "o": {"x": [1, {}, []], "y": {"password": [1, 2]}}}
    shown = show_arguments({"n": list(range(MAX_SHOWN_VALUES)), **later})
    assert len(shown.values) == 100 and shown.omitted == 1 + 3 + 1


def test_deep_nesting_is_walked_without_recursion() -> None:
    value: Any = "bottom"
    for _ in range(20_000):
        value = [value]
    shown = show_arguments({"deep": value})
    assert shown.omitted == 1 and shown.values == ()  # its 40,005-character path does not fit


# -- how it is rendered --------------------------------------------------------------------------

STEERING = {
    "\x1b": "\\u001b",  # ESC: every terminal escape sequence starts here
    "\x07": "\\u0007",
    "\x7f": "\\u007f",
    "\x85": "\\u0085",  # C1: NEL
    "\x9b": "\\u009b",  # C1: CSI
    "\u200b": "\\u200b",  # zero-width space
    "\u200e": "\\u200e",  # left-to-right mark
    "\u202e": "\\u202e",  # right-to-left override
    "\u2066": "\\u2066",  # left-to-right isolate
    "\u2069": "\\u2069",  # pop directional isolate
    "\u2028": "\\u2028",  # line separator
    "\u2029": "\\u2029",  # paragraph separator
    "\U000e0041": "\\udb40\\udc41",  # tag character
}


@pytest.mark.parametrize(("char", "escape"), list(STEERING.items()))
def test_controls_format_characters_and_separators_are_visible_escapes(char: str, escape: str) -> None:
    one_line, = show_arguments({"v": f"a{char}b"}).lines()
    assert one_line == f'/v: "a{escape}b"'
    block = show_arguments({"v": f"a{char}b\n\tc\r"}).lines()
    assert block == ["/v: text, 2 lines:", f"  | a{escape}b", "  | \\tc\\r"]


def test_a_string_with_line_breaks_is_a_block_that_no_line_of_it_can_leave() -> None:
    code = 'x = 1\n/other: "forged"\n  | \n'
    assert show_arguments({"code": code, "other": "real"}).lines() == [
        "/code: text, 4 lines:",
        "  | x = 1",
        '  | /other: "forged"',
        "  |   | ",
        "  | ",
        '/other: "real"',
    ]


def test_rendering_reads_what_the_control_plane_sent_without_failing() -> None:
    assert argument_lines(None) == ["(the arguments could not be read)"]
    assert argument_lines({"values": "x"}) == ["(the arguments could not be read)"]
    assert argument_lines({"values": [3, {"path": 5, "value": 1}, {"path": "/p"}], "omitted": True}) == [
        "?: (unreadable entry)", "?: 1", "/p: (no value)",
    ]
    assert argument_lines({"values": [{"path": "/\x1b", "value": float("nan")}]}) == ["/\\u001b: (not JSON)"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=300),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=20), inner, max_size=4),
    max_leaves=30,
)


def cells(line: str) -> int:
    return sum(2 if unicodedata.east_asian_width(c) in ("W", "F", "A") else 1 for c in line)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.text(max_size=20), json_values, max_size=6), st.integers(24, 120))
def test_folded_lines_fit_and_continuations_are_marked(arguments: dict[str, Any], width: int) -> None:
    shown = show_arguments(arguments)
    whole = shown.lines()
    folded = shown.lines(width)
    for line in folded:
        assert cells(line) <= width
        for char in line:  # nothing that steers a terminal survives
            assert unicodedata.category(char) not in ("Cc", "Cf", "Cs", "Zl", "Zp"), repr(char)
    assert unfolded(folded) == whole
    assert not any(line.startswith("  + ") for line in whole)  # only a fold starts a line so


# -- how long it is held -------------------------------------------------------------------------


def test_the_holder_is_bounded_and_the_first_holding_stands() -> None:
    held = HeldArguments(max_held=3)
    for n in range(5):
        held.hold(f"id{n}", {"n": n})
    assert held.ids() == {"id2", "id3", "id4"}  # the oldest let go first
    held.hold("id2", {"n": "other"})
    assert held.shown("id2").values[0].value == 2  # type: ignore[union-attr]
    held.release("id3")
    held.release_ended(held_before={"id2", "id4"}, pending={"id4", "id9"})
    assert held.ids() == {"id4"} and held.shown("id2") is None


T0 = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)
NEEDS_PERSON = Verdict(Action.HUMAN_APPROVAL, "writes need a person", Provenance("ci", "policies/ci.yaml", 2))


@dataclass(frozen=True)
class DigestKey:
    key: bytes
    key_id: str


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


@asynccontextmanager
async def engines(tmp_path: Path, clock: Clock, count: int = 1) -> AsyncIterator[list[ApprovalEngine]]:
    """``count`` engines on one state file (several gateways sharing it), non-blocking."""
    db = StateDB.open(tmp_path / "state.db")
    log = TraceLog(tmp_path / "trace.ndjson", fsync="never")
    made = [
        ApprovalEngine.on_state_db(
            db, trace_log_appender(log, clock), key_for_args_digest=DigestKey(b"k" * 32, "k1"), clock=clock,
            non_blocking=True, state_keys=[b"s" * 32], timeout_seconds=60,
        )
        for _ in range(count)
    ]
    try:
        yield made
    finally:
        log.close()
        db.close()


def call(arguments: dict[str, Any], request_id: int = 1) -> ToolCall:
    return ToolCall("ci-bot", "fs.write_file", arguments, None, request_id, None)


@pytest.mark.anyio
async def test_arguments_are_held_while_pending_and_let_go_when_resolved_or_expired(tmp_path: Path) -> None:
    clock = Clock()
    async with engines(tmp_path, clock) as (engine,):
        first = await engine.settle(call({"path": "/srv/a", "password": "pw-1"}), NEEDS_PERSON,
                                    elicitation_supported=False)
        assert first.kind is SettlementKind.PENDING and first.approval_id
        shown = engine.shown_arguments(first.approval_id)
        assert shown is not None and shown.as_dict()["values"] == [
            {"path": "/path", "value": "/srv/a"}, {"path": "/password", "masked": True},
        ]
        # An identical waiting call joins the same approval: the same arguments, held once.
        again = await engine.settle(call({"path": "/srv/a", "password": "pw-1"}, 2), NEEDS_PERSON,
                                    elicitation_supported=False)
        assert again.approval_id == first.approval_id and engine.shown_arguments(first.approval_id) is shown

        await engine.resolve(first.approval_id, "approve", "op-alice", "control_plane")
        assert engine.shown_arguments(first.approval_id) is None

        other = await engine.settle(call({"path": "/srv/b"}), NEEDS_PERSON, elicitation_supported=False)
        assert other.approval_id and engine.shown_arguments(other.approval_id) is not None
        clock.now += timedelta(seconds=61)
        (expired,) = await engine.sweep()
        assert expired.id == other.approval_id and engine.shown_arguments(other.approval_id) is None
        for line in (tmp_path / "trace.ndjson").read_text().splitlines():
            assert "/srv/" not in line and "pw-1" not in line


@pytest.mark.anyio
async def test_an_approval_resolved_by_another_gateway_is_let_go_at_the_next_sweep(tmp_path: Path) -> None:
    clock = Clock()
    async with engines(tmp_path, clock, count=2) as (here, there):
        asked = await here.settle(call({"path": "/srv/c"}), NEEDS_PERSON, elicitation_supported=False)
        assert asked.approval_id and here.shown_arguments(asked.approval_id) is not None
        assert there.shown_arguments(asked.approval_id) is None  # held only where the call came in
        await there.resolve(asked.approval_id, "deny", "op-bob", "cli")
        assert here.shown_arguments(asked.approval_id) is not None  # this process has not looked yet
        await here.sweep()
        assert here.shown_arguments(asked.approval_id) is None


# -- the terminal --------------------------------------------------------------------------------


def test_display_text_leaves_no_escape_sequence_c1_control_or_bidi_override() -> None:
    hostile = "a\x1b[2Jb\x9b31mc\x85d\u202ee\u2066f\r"
    shown = display_text(hostile)
    assert shown == "a\ufffd[2Jb\ufffd31mc\ufffdd\ufffde\ufffdf\ufffd"


def test_json_output_escapes_what_steers_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    report = {"v": "a\x1b\x9b\u202e\u2028\x7f\U000e0041 é 中", "n": [1, "x"]}
    emit_json(report)
    out = capsys.readouterr().out
    assert json.loads(out) == report
    for char in ("\x1b", "\x9b", "\u202e", "\u2028", "\x7f", "\U000e0041"):
        assert char not in out
    assert "é 中" in out  # readable text stays as it is
