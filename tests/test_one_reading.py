"""A message is decided as every parser would read it: what two readers could read apart is refused,
and no input, however deep or strange, switches the gateway off.

The gateway runs as a subprocess (``wrap``, ``serve --stdio``, serve over HTTP) in front of the
recording server, which writes down every byte it receives; what reached it is then read by Python's
parser and by a Go-like one (keys matched ignoring case and Unicode form, the last match winning, a
key cut at NUL). The policy allows ``safe_read`` only. After every hostile line a well-formed call
must still run.
"""

from __future__ import annotations

import json
import random
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from conftest import examples, scaled
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from one_reading_support import RECORDING, LineGateway, read_apart, readings, refused_calls_run
from serve_support import dump, http_client, http_gateway, write_config

from drawbridge.evidence.chain import verify_chain
from drawbridge.gateway.pipeline.tool_call import parse_tool_call
from drawbridge.gateway.protocol.jsonrpc import MessageError, parse_client_message
from drawbridge.gateway.protocol.one_reading import (
    CALL_MEMBERS,
    KEY_FORBIDDEN_CATEGORIES,
    Ambiguous,
    check_keys,
    fold,
    inexact_member,
)

MODES = ("wrap", "serve")

# The lines, and their cousins: each is a message some parser reads as a call of delete_all.
HOSTILE = {
    "name and Name": b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"@safe_read","Name":"delete_all"}}',
    "ping and Method": b'{"jsonrpc":"2.0","id":3,"method":"ping","Method":"tools/call","params":{"name":"delete_all"}}',
    "notification and ID": (
        b'{"jsonrpc":"2.0","method":"notifications/progress","Method":"tools/call","ID":7,"params":{"name":"delete_all"}}'
    ),
    "response and Method": b'{"jsonrpc":"2.0","id":8,"result":{},"Method":"tools/call","params":{"name":"delete_all"}}',
    "key cut at NUL": b'{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name\\u0000":"delete_all","name":"@safe_read"}}',
    "fullwidth name": (
        b'{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"@safe_read","\\uff4e\\uff41\\uff4d\\uff45":"delete_all"}}'
    ),
    "Kelvin sign": b'{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"@safe_read","arguments":{"k":1,"\\u212a":2}}}',
    "colliding arguments": (
        b'{"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"name":"@safe_read","arguments":{"p":{"path":"/srv","PATH":"/etc"}}}}'
    ),
    "zero-width key": b'{"jsonrpc":"2.0","id":13,"method":"tools/call","params":{"name":"@safe_read","name\\u200b":"delete_all"}}',
    "Name alone": b'{"jsonrpc":"2.0","id":14,"method":"tools/call","params":{"Name":"delete_all"}}',
    "Arguments alone": b'{"jsonrpc":"2.0","id":15,"method":"tools/call","params":{"name":"@safe_read","Arguments":{"all":true}}}',
    "exact repeat": b'{"jsonrpc":"2.0","id":16,"method":"tools/call","params":{"name":"@safe_read","name":"delete_all"}}',
    "Method alone": b'{"jsonrpc":"2.0","id":17,"Method":"tools/call","params":{"name":"delete_all"}}',
    # A JavaScript or Go server reads 2**53 + 1 as 2**53: a rule would judge one number, the tool run another.
    "integer beyond a double": b'{"jsonrpc":"2.0","id":18,"method":"tools/call","params":{"name":"@safe_read","arguments":{"n":9007199254740993}}}',
}
# What each is answered with: the code, and the id when the gateway can still name the request.
EXPECTED = {
    "Name alone": (-32602, 14),
    "Arguments alone": (-32602, 15),
    "exact repeat": (-32700, None),
    "integer beyond a double": (-32700, None),
}


def _line(template: bytes, prefix: str) -> bytes:
    return template.replace(b"@", prefix.encode())


@pytest.fixture(scope="module", params=MODES)
def gateway(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LineGateway]:
    running = LineGateway(tmp_path_factory.mktemp(request.param), serve=request.param == "serve")
    try:
        yield running
    finally:
        running.close()


def _decided(gateway: LineGateway) -> set[str]:
    """The ids of the calls the trace holds as allowed (it writes an id as text)."""
    return {str(e["body"]["request_id"]) for e in gateway.trace()
            if e["kind"] == "tool_decision" and e["body"].get("action") == "allow"}


def _as_recorded(request_id: object) -> str:
    """A request id as the trace writes it: text, each control character but TAB, LF and CR as U+FFFD
    (the evidence's sanitizing rule, evidence-formats.md §0.4), at most 128 characters."""
    text = str(request_id)[:128] if isinstance(request_id, str) else str(request_id)
    return "".join("\ufffd" if unicodedata.category(c) == "Cc" and c not in "\t\n\r" else c for c in text)


def _check_upstream(gateway: LineGateway) -> None:
    """Nothing reached the upstream that the policy refuses or that two readers read apart; under wrap
    (which forwards the agent's ids) every call that arrived was decided as allowed first."""
    received = gateway.received()
    assert refused_calls_run(received) == []
    assert read_apart(received) == []
    if gateway.prefix == "":
        decided = _decided(gateway)
        for line in received:
            for method, request_id, _ in readings(line):
                if method == "tools/call":
                    assert _as_recorded(json.loads(request_id)) in decided, line[:200]


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_line_two_parsers_read_apart_is_refused_and_never_forwarded(gateway: LineGateway, case: str) -> None:
    line = _line(HOSTILE[case], gateway.prefix)
    answers = gateway.hostile(line)
    code, request_id = EXPECTED.get(case, (-32600, None))
    assert [(a.get("id"), a.get("error", {}).get("code")) for a in answers] == [(request_id, code)], answers
    assert "delete_all" not in json.dumps(answers)  # a refusal names the rule, never the content
    _check_upstream(gateway)
    incidents = [e for e in gateway.trace() if e["kind"] == "relay_incident" and e["body"]["code"] == code]
    invalid_calls = [e for e in gateway.trace() if e["kind"] == "tool_decision" and e["body"]["outcome"] == "invalid"]
    assert incidents or invalid_calls  # recorded as invalid
    assert all(e["body"].get("tool") != "delete_all" for e in gateway.trace())


def test_a_parser_differential_in_the_upstreams_messages_never_reaches_the_agent(tmp_path: Path) -> None:
    """The server's request whose "Method" reads as sampling, and its answer with a second id, are
    dropped: the call ends at its timeout instead of taking an answer that could be another's."""
    for mode in MODES:
        extra = ("--call-timeout", "2") if mode == "wrap" else ()
        running = LineGateway(tmp_path / mode, serve=mode == "serve", extra=extra, limits={"call_timeout_seconds": 2})
        try:
            answer, before = running.exchange({"jsonrpc": "2.0", "id": "twice-read", "method": "tools/call",
                                               "params": {"name": running.prefix + "two_readings", "arguments": {}}})
            assert before == []
            assert "error" in answer or answer["result"].get("isError"), answer
            assert "timed out" in json.dumps(answer) or "did not answer" in json.dumps(answer), answer
            assert "result" in running.call("safe_read")
            incidents = [e["body"] for e in running.trace() if e["kind"] == "relay_incident"]
            assert any(i["direction"] == "upstream" for i in incidents), (mode, incidents)
        finally:
            running.close()


def test_over_http_the_same_lines_are_refused(tmp_path: Path) -> None:
    log = tmp_path / "received.ndjson"
    upstream = {"name": "fx", "transport": "stdio", "command": RECORDING[0], "args": RECORDING[1:],
                "env": {"RECORDING_LOG": str(log)}}
    policies = {"reads.yaml": 'name: reads\nagent: "*"\nrules:\n  - tools: ["fx.safe_read"]\n    action: allow\n'}
    config = write_config(tmp_path, [upstream], policies=policies, auth={"anonymous_agent": "web"},
                          evidence_dir="./evidence", state_path="./state.db")
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                  "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}
    with http_gateway(config) as running:
        assert running.url is not None
        with httpx.Client(timeout=scaled(20)) as http:
            opened = http.post(running.url, json=initialize, headers=headers)
            session = {**headers, "Mcp-Session-Id": opened.headers["mcp-session-id"]}
            http.post(running.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session)
            for case in ("name and Name", "ping and Method", "key cut at NUL", "colliding arguments"):
                response = http.post(running.url, content=_line(HOSTILE[case], "fx."), headers=session)
                assert response.status_code == 400, (case, response.text)
                assert response.json()["error"]["code"] == -32600, case
        async def well_formed() -> Any:
            async with http_client(running.url) as client:
                return dump(await client.call_tool("fx.safe_read", {}))

        assert anyio.run(well_formed)["content"][0]["text"] == "ran safe_read"
    received = log.read_bytes().splitlines()
    assert refused_calls_run(received) == [] and read_apart(received) == []
    assert sum(b'"tools/call"' in line for line in received) == 1


@pytest.mark.parametrize("mode", MODES)
def test_arguments_490_deep_are_refused_naming_the_limit_and_the_gateway_goes_on(tmp_path: Path, mode: str) -> None:
    running = LineGateway(tmp_path, serve=mode == "serve")
    try:
        deep = b"[" * 490 + b"]" * 490
        line = (b'{"jsonrpc":"2.0","id":"deep","method":"tools/call","params":{"name":"'
                + running.prefix.encode() + b'safe_read","arguments":{"a":' + deep + b"}}}")
        assert len(line) < 1200
        (answer,) = running.hostile(line)
        assert answer["error"]["code"] == -32600
        assert "deeper than 64 levels" in answer["error"]["message"]
        # Far past what Python's parser can nest: the same refusal, not a crash.
        (answer,) = running.hostile(b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"a":' + b"[" * 200_000 + b"}}")
        assert "deeper than 64 levels" in answer["error"]["message"]
        for _ in range(3):  # every later call of every kind still runs
            assert running.call("safe_read")["result"]["content"][0]["text"] == "ran safe_read"
        assert refused_calls_run(running.received()) == []
        assert b'"deep"' not in b"".join(running.received())
    finally:
        assert running.close() == 0
    with (running.evidence / "trace.ndjson").open("rb") as trace:
        assert verify_chain(trace).ok


def test_the_depth_limit_is_a_setting_and_a_record_that_cannot_be_built_refuses_only_its_call(tmp_path: Path) -> None:
    """With the limit raised to 512, arguments 500 deep pass the reader but their record cannot be
    built: the call is refused without running, and the gateway is not switched off."""
    running = LineGateway(tmp_path / "wrap", extra=("--max-depth", "512"))
    try:
        deep = b"[" * 508 + b"]" * 508  # with the envelope, 512 levels: within the limit
        (answer,) = running.hostile(b'{"jsonrpc":"2.0","id":"deep","method":"tools/call","params":{"name":"safe_read","arguments":{"a":'
                                    + deep + b"}}}")
        assert answer["id"] == "deep" and answer["error"]["code"] == -32602
        assert "record cannot be built" in answer["error"]["message"] and "not run" in answer["error"]["message"]
        assert b'"deep"' not in b"".join(running.received())
        entry = [e["body"] for e in running.trace() if e["body"].get("request_id") == "deep"]
        assert [e["outcome"] for e in entry] == ["invalid"]
    finally:
        assert running.close() == 0
    narrow = LineGateway(tmp_path / "narrow", extra=("--max-depth", "4"))
    try:
        (answer,) = narrow.hostile(b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"safe_read","arguments":{"a":[[1]]}}}')
        assert "deeper than 4 levels" in answer["error"]["message"]
        assert narrow.call("safe_read", {"a": [1]})["result"]["content"][0]["text"] == "ran safe_read"
    finally:
        narrow.close()


# ---------------------------------------------------------------- hostile JSON, generated
# A value is rendered by hand so that it can hold what json.dumps never writes: repeated keys, numbers
# beyond a double, lone surrogates as escapes.

KEYS = ["name", "Name", "NAME", "\uff4e\uff41\uff4d\uff45", "name\x00", "arguments", "Arguments", "path", "PATH",
        "k", "\u212a", "_meta", "_META", "a\u200b", "x", "\u00df", "ss", "\u0130", "i\u0307"]
NUMBERS = ["1e400", "-1e400", "9" * 400, "1" + "0" * 309, "1.5", "-0", "1E2", "123456789012345678901234567890",
           "9007199254740993", "-9007199254740993", "9007199254740992", "1152921504606846976", "18446744073709551615"]
SURROGATES = ['"\\ud800"', '"a\\udfffb"', '"\\udbff\\udbff"']


def _render(value: Any) -> str:
    if isinstance(value, tuple) and value[0] == "raw":
        return value[1]
    if isinstance(value, tuple):  # an object: (pairs,)
        return "{" + ",".join(json.dumps(k) + ":" + _render(v) for k, v in value[1]) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_render(v) for v in value) + "]"
    return json.dumps(value)


def _objects(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(st.tuples(st.sampled_from(KEYS) | st.text(max_size=6), children), max_size=6).map(lambda p: ("obj", p))


SCALARS = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
           | st.text(max_size=20) | st.text(min_size=2000, max_size=20000, alphabet="ab\u00e9\U0001f600")
           | st.sampled_from(NUMBERS + SURROGATES).map(lambda raw: ("raw", raw)))
VALUES = st.recursive(SCALARS, lambda children: st.lists(children, max_size=5) | _objects(children), max_leaves=30)


@st.composite
def _deep(draw: st.DrawFn) -> Any:
    depth = draw(st.integers(1, 600))
    value: Any = draw(SCALARS)
    for _ in range(depth):
        value = [value] if draw(st.booleans()) else ("obj", [(draw(st.sampled_from(KEYS)), value)])
    return value


@st.composite
def hostile_lines(draw: st.DrawFn, prefix: str) -> bytes:
    """A JSON-RPC line around a tools/call or a look-alike, with hostile parts anywhere."""
    pairs: list[tuple[str, Any]] = [("jsonrpc", "2.0")]
    method = draw(st.sampled_from(["tools/call", "tools/call", "ping", "notifications/progress", None]))
    if method is not None:
        pairs.append(("method", method))
    if draw(st.booleans()):
        pairs.append(("id", draw(st.integers(0, 10**6) | st.text(max_size=8))))
    name = draw(st.sampled_from([prefix + "safe_read", prefix + "delete_all", "delete_all"]))
    params: list[tuple[str, Any]] = [("name", name)]
    params += draw(st.lists(st.tuples(st.sampled_from(KEYS), st.sampled_from(["delete_all", prefix + "delete_all"])), max_size=2))
    params.append(("arguments", draw(_deep() | _objects(VALUES))))
    pairs.append(("params", ("obj", draw(st.permutations(params)))))
    pairs += draw(st.lists(st.tuples(st.sampled_from(["Method", "ID", "METHOD", "Params", "id", "result"]),
                                     st.sampled_from(["tools/call", 7, ("obj", [("name", "delete_all")])])), max_size=2))
    return _render(("obj", draw(st.permutations(pairs)))).encode("utf-8", "surrogatepass")


@pytest.mark.parametrize("mode", MODES)
def test_property_hostile_json_is_never_forwarded_undecided(tmp_path: Path, mode: str) -> None:
    running = LineGateway(tmp_path, serve=mode == "serve")
    try:
        @settings(max_examples=examples(60), deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(line=hostile_lines(running.prefix))
        def check(line: bytes) -> None:
            running.hostile(line)  # asserts the well-formed call after it runs
            _check_upstream(running)

        check()
    finally:
        assert running.close() == 0
    with (running.evidence / "trace.ndjson").open("rb") as trace:
        assert verify_chain(trace).ok


# ---------------------------------------------------------------- bounded fuzz through wrap

def _mutations(rng: random.Random) -> bytes:
    """One hostile line: a call of delete_all disguised by a random trick, or a mutated allowed call."""
    rid = rng.randrange(10**9)
    name_key = rng.choice(["Name", "NAME", "nAme", "\uff4e\uff41\uff4d\uff45", "name\x00", "name\u200b", "name\x7f",
                           "na\u00adme", "name\u2028"])
    method_key = rng.choice(["Method", "METHOD", "metHod", "\uff4d\uff45\uff54\uff48\uff4f\uff44", "method\x00"])
    tricks = [
        {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": [("name", "safe_read"), (name_key, "delete_all")]},
        {"jsonrpc": "2.0", "id": rid, "method": "ping", method_key: "tools/call", "params": {"name": "delete_all"}},
        {"jsonrpc": "2.0", "method": "notifications/progress", method_key: "tools/call", "ID": rid, "params": {"name": "delete_all"}},
        {"jsonrpc": "2.0", "id": rid, "result": {}, method_key: "tools/call", "params": {"name": "delete_all"}},
        {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": [(name_key, "delete_all")]},
        {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": [(name_key, "delete_all"), ("name", "safe_read")]},
        {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": [("name", "safe_read"), ("name", "delete_all")]},
    ]
    message = rng.choice(tricks)
    params = message.pop("params")
    pairs = list(params.items()) if isinstance(params, dict) else params
    body = ("obj", [*((k, v) for k, v in message.items()), ("params", ("obj", pairs))])
    rng.shuffle(body[1])
    return _render(body).encode("utf-8", "surrogatepass")


def test_bounded_fuzz_through_wrap_forwards_no_call_the_policy_refuses(tmp_path: Path) -> None:
    rng = random.Random(20261201)
    lines = [_mutations(rng) for _ in range(2400)]
    # Sanity of the corpus: every line is a tools/call to some reader, and the gateway's reading refuses it.
    for line in lines[:300]:
        assert any(method == "tools/call" or name == "delete_all" for method, _, name in readings(line))
        with pytest.raises(MessageError):
            parse_tool_call(parse_client_message(line), "fuzz", None)
    running = LineGateway(tmp_path)
    try:
        writer = running.send_all(lines)
        assert running.call("safe_read")["result"]["content"][0]["text"] == "ran safe_read"  # amid the stream
        running.drain_while(writer)
        for _ in range(2):
            assert running.call("safe_read")["result"]["content"][0]["text"] == "ran safe_read"
        received = running.received()
    finally:
        assert running.close() == 0
    assert refused_calls_run(received) == []
    assert read_apart(received) == []
    assert sum(b'"tools/call"' in line for line in received) == 3  # only the well-formed calls
    with (running.evidence / "trace.ndjson").open("rb") as trace:
        report = verify_chain(trace)
    assert report.ok and report.entries >= len(lines)


def test_fold_is_what_a_case_and_form_insensitive_reader_compares() -> None:
    assert fold("NAME") == fold("name") == fold("\uff4e\uff41\uff4d\uff45")
    assert fold("\u212a") == fold("k") and fold("\u00df") == fold("ss")
    assert fold("name") != fold("names")


_KEY_CHARS = st.sampled_from(list("nameNAMEkK_0 -\x00\x1f\x7f") + ["\u212a", "\u00df", "\u00e9", "\u200b", "\uff4e", "\u2028"])


_KEYS = ["name", "Name", "NAME", "k", "K", "\u212a", "ss", "SS", "\u00df", "n\u00e9", "ne\u0301", "a\x00", "b\u200b",
         "requeststate", "requestState", "Arguments", "arguments", "_meta", "_Meta", "x y", "\uff4e\uff41\uff4d\uff45"]
"""Keys that fold alike, or nearly, or hold a refused character."""


def _reference_refuses(keys: list[str]) -> bool:
    """The rules as stated: a key holding a control, format or separator character, or two keys
    equal after NFKC and case folding."""
    if any(unicodedata.category(char) in KEY_FORBIDDEN_CATEGORIES for key in keys for char in key):
        return True
    return len({unicodedata.normalize("NFKC", key).casefold() for key in keys}) != len(keys)


@settings(max_examples=examples(400), deadline=None)
@given(keys=st.lists(st.one_of(st.sampled_from(_KEYS), st.text(_KEY_CHARS, max_size=4)), max_size=5, unique=True))
def test_the_key_checks_refuse_exactly_what_the_rules_name(keys: list[str]) -> None:
    obj = dict.fromkeys(keys, 0)
    try:
        check_keys(obj)
        refused = False
    except Ambiguous:
        refused = True
    assert refused == _reference_refuses(keys)
    expected = next((k for k in keys if CALL_MEMBERS.get(unicodedata.normalize("NFKC", k).casefold()) not in (None, k)), None)
    assert inexact_member(obj, CALL_MEMBERS) == expected


def test_a_key_read_as_a_call_member_is_refused_naming_the_member_and_every_one_read() -> None:
    line = b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"safe_read","RequestState":"x"}}'
    with pytest.raises(MessageError) as info:
        parse_tool_call(parse_client_message(line), "fuzz", None)
    message = info.value.message
    assert info.value.code == -32602 and "reads as requestState" in message, message
    assert "name, arguments, _meta, requestState, inputResponses" in message and "RequestState" not in message
