"""The pure parts of ``drawbridge serve``: namespacing, per-hop rewriting, backoff, identities, SSE framing."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from drawbridge.catalogue.merged import build_catalogue
from drawbridge.catalogue.names import namespaced, split_namespaced
from drawbridge.config import AgentToken
from drawbridge.gateway.protocol.eras import negotiate_version
from drawbridge.gateway.protocol.hop import (
    downstream_result,
    outbound_params,
    progress_token,
    union_capabilities,
)
from drawbridge.gateway.transports.http_hosts import AllowedHosts, origin_authority
from drawbridge.gateway.transports.http_identity import HttpSettings, identify
from drawbridge.gateway.upstreams.http_link import HttpLink, SseFramer, safe_url
from drawbridge.gateway.upstreams.session import backoff_delay

SERVER = st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True)
PRINTABLE = st.text(st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Zl", "Zp", "Zs")), min_size=1, max_size=30)
JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


# ----------------------------------------------------------------------------------------- catalogue


@given(SERVER, PRINTABLE)
def test_namespaced_names_split_back_at_the_first_dot(server: str, name: str) -> None:
    assert split_namespaced(namespaced(server, name)) == (server, name)


@given(
    st.dictionaries(
        SERVER,
        st.lists(st.dictionaries(st.text(max_size=8).filter(lambda k: k != "name"), JSON_VALUE, max_size=4), max_size=4),
        max_size=3,
    )
)
def test_every_field_but_name_is_kept_and_every_name_routes_back(upstreams: dict[str, list[dict[str, Any]]]) -> None:
    sources = [
        (server, [{**fields, "name": f"tool{i}.x"} for i, fields in enumerate(items)]) for server, items in upstreams.items()
    ]
    original = copy.deepcopy(sources)
    catalogue = build_catalogue(sources)
    assert sources == original  # the upstream dicts are not touched
    listing = catalogue.listing()
    expected = [
        ({**tool, "name": f"{server}.{tool['name']}"}, server, tool["name"]) for server, tools in original for tool in tools
    ]
    assert listing == [item for item, _, _ in expected]
    for item, server, upstream_name in expected:
        entry = catalogue.resolve(item["name"])
        assert entry is not None and (entry.server, entry.upstream_name) == (server, upstream_name)
    assert not catalogue.problems


def test_unroutable_tools_are_refused_with_a_reason_and_never_served() -> None:
    tools = [
        {"name": "good", "annotations": {"readOnlyHint": True}},
        {"name": "bell\u0007tool"},
        {"name": "zero\u200bwidth"},
        {"name": " padded"},
        {"name": ""},
        {"name": 42},
        "not an object",
        {"name": "twice", "description": "first"},
        {"name": "twice", "description": "second"},
        {"name": "x" * 1100},
    ]
    catalogue = build_catalogue([("gh", tools)])
    assert catalogue.names() == ["gh.good"]
    assert catalogue.listing() == [{"name": "gh.good", "annotations": {"readOnlyHint": True}}]
    problems = {problem.index: problem.problem for problem in catalogue.problems}
    assert "U+0007" in problems[1] and "\u0007" not in problems[1]
    assert "U+200B" in problems[2]
    assert "whitespace" in problems[3]
    assert "empty" in problems[4]
    assert "no string name" in problems[5]
    assert "not a JSON object" in problems[6]
    assert "more than once" in problems[8] and 7 not in problems  # neither copy is served
    assert "longer than" in problems[9]
    assert catalogue.resolve("gh.twice") is None and catalogue.resolve("good") is None


def test_upstream_names_must_be_unique_and_dot_free() -> None:
    with pytest.raises(ValueError):
        build_catalogue([("a", []), ("a", [])])
    with pytest.raises(ValueError):
        build_catalogue([("a.b", [])])


# ------------------------------------------------------------------------------------------ per hop


def test_outbound_params_rewrite_only_the_per_hop_parts() -> None:
    params = {
        "name": "github.list_repos",
        "arguments": {"owner": "acme"},
        "x-unknown": [1, 2],
        "_meta": {
            "progressToken": "agent-token",
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "agent"},
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/related-task": {"taskId": "t"},
            "example.com/trace": "abc",
        },
    }
    before = copy.deepcopy(params)
    out = outbound_params(params, name="list_repos", progress="drawbridge-1")
    assert params == before
    assert out == {
        "name": "list_repos",
        "arguments": {"owner": "acme"},
        "x-unknown": [1, 2],
        "_meta": {
            "progressToken": "drawbridge-1",
            "io.modelcontextprotocol/related-task": {"taskId": "t"},
            "example.com/trace": "abc",
        },
    }
    only_envelope = {"name": "t", "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}
    assert outbound_params(only_envelope) == {"name": "t"}
    assert outbound_params({"name": "t", "_meta": {}}) == {"name": "t", "_meta": {}}
    assert outbound_params(None) is None


def test_progress_tokens_are_strings_or_integers() -> None:
    assert progress_token({"_meta": {"progressToken": 7}}) == 7
    assert progress_token({"_meta": {"progressToken": "t"}}) == "t"
    assert progress_token({"_meta": {"progressToken": True}}) is None
    assert progress_token({"_meta": {"progressToken": 1.5}}) is None
    assert progress_token({"_meta": None}) is None


def test_results_for_2026_agents_are_marked_complete_and_private() -> None:
    upstream = {"tools": [], "cacheScope": "public", "ttlMs": 5000, "_meta": {"io.modelcontextprotocol/serverInfo": {}}}
    assert downstream_result(upstream, method="tools/list", modern=True) == {
        "tools": [],
        "cacheScope": "private",
        "ttlMs": 5000,
        "resultType": "complete",
    }
    assert downstream_result({"content": []}, method="tools/call", modern=True) == {"content": [], "resultType": "complete"}
    legacy = {"content": [], "_meta": {"k": 1}}
    assert downstream_result(legacy, method="tools/call", modern=False) == legacy
    assert downstream_result({"contents": [], "ttlMs": -1}, method="resources/read", modern=True)["ttlMs"] == 0


def test_capabilities_are_the_union_of_what_upstreams_offer() -> None:
    assert union_capabilities([]) == {"tools": {"listChanged": True}}
    union = union_capabilities(
        [
            {"tools": {}, "prompts": {"listChanged": False}, "tasks": {"list": {}}},
            {"resources": {"subscribe": True}, "logging": {}, "experimental": {"x": {}}},
            {"resources": {"listChanged": True}, "completions": {}, "prompts": {"listChanged": True}},
        ]
    )
    assert union == {
        "tools": {"listChanged": True},
        "prompts": {"listChanged": True},
        "resources": {"subscribe": True, "listChanged": True},
        "logging": {},
        "completions": {},
    }


def test_initialize_answers_with_a_version_both_sides_speak() -> None:
    assert negotiate_version("2025-06-18") == "2025-06-18"
    assert negotiate_version("2026-07-28") == "2025-11-25"  # not a handshake version
    assert negotiate_version("1999-01-01") == "2025-11-25"
    assert negotiate_version(None) == "2025-11-25"


# --------------------------------------------------------------------------------------------- shell


def test_backoff_starts_at_one_second_doubles_and_caps_at_thirty() -> None:
    assert [backoff_delay(n, lambda: 0.999999) for n in range(7)] == pytest.approx([1, 2, 4, 8, 16, 30, 30], rel=1e-5)
    assert [backoff_delay(n, lambda: 0.0) for n in range(3)] == [0.5, 1.0, 2.0]
    assert backoff_delay(10**6, lambda: 0.5) == 22.5
    assert backoff_delay(0, lambda: 7.0) == 1.0  # a misbehaving source is clamped


def test_bearer_tokens_map_to_agents_by_their_sha256() -> None:
    settings = HttpSettings(
        agents=(
            AgentToken("alice", hashlib.sha256(b"a-token").hexdigest()),
            AgentToken("bob", hashlib.sha256(b"b-token").hexdigest()),
        )
    )
    assert identify("Bearer a-token", settings) == "alice"
    assert identify("bearer   b-token ", settings) == "bob"
    assert identify("Bearer c-token", settings) is None
    assert identify("Basic a-token", settings) is None
    assert identify("Bearer", settings) is None
    assert identify(None, settings) is None
    anonymous = HttpSettings(agents=settings.agents, anonymous_agent="guest")
    assert identify(None, anonymous) == "guest"
    assert identify("", anonymous) is None and identify("  ", anonymous) is None  # presented, so refused
    assert identify("Bearer wrong", anonymous) is None  # a wrong token is refused, not made anonymous


def test_allowed_hosts_compare_one_spelling_of_each_authority() -> None:
    default = AllowedHosts.build(None, "127.0.0.2", 40123)
    for host in ("127.0.0.1:40123", "LocalHost:40123", "[::1]:40123", "[0::1]:040123", "127.0.0.2:40123"):
        assert default.admits(host), host
    for host in ("127.0.0.1", "localhost:40124", "localhost.:40123", "[::1%lo]:40123", "[::1]:x", "[::1]40123",
                 "127.0.0.1:99999", "127.0.0.1:40123:1", "a@127.0.0.1:40123", "", "[::2]:40123", "evil.example:40123"):
        assert not default.admits(host), host
    configured = AllowedHosts.build(("gw.test", "proxy.test:8443", "[::1]:*"), "0.0.0.0", 8787)
    assert [configured.admits(h) for h in ("gw.test", "gw.test:8787", "gw.test:80", "proxy.test:8443", "proxy.test")] == [
        True, True, False, True, False
    ]
    assert configured.admits("[::1]") and configured.admits("[::1]:1") and not configured.admits("127.0.0.1:8787")
    assert configured.check(["gw.test"], []) is None
    for hosts in (["gw.test", "gw.test"], []):  # a repeated Host, or none
        refusal = configured.check(hosts, [])
        assert refusal is not None and (refusal.status, refusal.incident) == (421, "foreign_host")
    assert configured.check(["gw.test"], ["https://GW.test"]) is None
    for origin in ("null", "https://gw.test/", "ftp://gw.test", "https://user@gw.test", "gw.test", "https://evil.test"):
        refusal = configured.check(["gw.test"], [origin])
        assert refusal is not None and refusal.status == 403, origin
    assert configured.check(["gw.test"], ["https://gw.test", "https://gw.test"]) is not None
    assert origin_authority("HTTP://[::1]:8787") == "[::1]:8787" and origin_authority("null") is None


def test_sse_framing_yields_message_data_and_skips_primers_comments_and_other_events() -> None:
    framer = SseFramer(max_bytes=1000)
    stream = (
        b": keepalive\r\n\r\n"
        b"id: 1\ndata:\n\n"  # a resumption primer
        b"event: message\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\n"
        b"event: other\ndata: {}\n\n"
        b"data: {\"b\":2}\n"
    )
    out: list[bytes] = []
    for i in range(0, len(stream), 7):  # arbitrary chunk boundaries
        out += framer.feed(stream[i : i + 7])
    assert out == [b'{"a":\n1}']
    assert framer.feed(b"\n") == [b'{"b":2}']
    with pytest.raises(ValueError):
        SseFramer(max_bytes=10).feed(b"data: 0123456789abc\n")


def test_http_upstream_headers_carry_the_upstream_name_not_the_namespaced_one() -> None:
    link = HttpLink("http://user:pw@example.com:8080/mcp?key=secret", {"Authorization": "Bearer upstream"}, 1000)
    link.session_id, link.protocol_version = "sid-1", "2025-11-25"
    headers = link._headers({"method": "tools/call", "params": {"name": "list_repos", "arguments": {}}})
    assert headers["mcp-method"] == "tools/call" and headers["mcp-name"] == "list_repos"
    assert headers["mcp-session-id"] == "sid-1" and headers["mcp-protocol-version"] == "2025-11-25"
    assert headers["Authorization"] == "Bearer upstream"
    odd = link._headers({"method": "resources/read", "params": {"uri": "file:///é"}})
    assert odd["mcp-name"].startswith("=?base64?")
    assert "mcp-name" not in link._headers({"method": "tools/list"})
    assert link.shown_url == safe_url(link.url) == "http://example.com:8080/mcp"
