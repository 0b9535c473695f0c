"""OpenAPI upstreams behind ``drawbridge serve``: a real HTTP backend serving a committed OpenAPI 3.1
spec on a loopback port, the mcp SDK client calling its operations through the gateway, the same
decision, evidence and control plane as MCP upstreams, and the SSRF guard."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import mcp_types as types
import pytest
from approval_support import cli, decisions, text_of
from conftest import scaled
from openapi_support import Backend, items_entry, openapi_backend
from serve_support import http_client, http_gateway, serve_argv, write_config

pytestmark = pytest.mark.anyio

ALLOW_READS = {
    "p.yaml": "name: p\nagent: '*'\nrules:\n"
    "  - tools: ['items.get_*', 'items.list_items', 'items.create_item']\n    action: allow\n"
    "  - tools: ['items.delete_item']\n    action: deny\n"
}


@pytest.fixture(scope="module")
def backend() -> Iterator[Backend]:
    with openapi_backend() as running:
        yield running


def _config(tmp_path: Path, entry: dict[str, Any], **top: Any) -> Path:
    top.setdefault("evidence_dir", str(tmp_path / "evidence"))
    top.setdefault("state_path", str(tmp_path / "state.db"))
    top.setdefault("auth", {"anonymous_agent": "guest"})
    return write_config(tmp_path, [], policies=top.pop("policies", ALLOW_READS), openapi=[entry], **top)


def structured(result: types.CallToolResult) -> Any:
    return result.structured_content


def _sent(backend: Backend, since: int) -> list[dict[str, Any]]:
    return backend.log()[since:]


async def test_operations_are_served_and_called_through_the_gateway(tmp_path: Path, backend: Backend) -> None:
    with http_gateway(_config(tmp_path, items_entry(backend))) as gateway:
        assert gateway.url is not None
        async with http_client(gateway.url) as client:
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert set(listed) == {
                "items.list_items", "items.create_item", "items.get_item", "items.delete_item", "items.get_report",
                "items.get_echo", "items.get_hello", "items.get_big", "items.get_home", "items.get_away",
            }  # getSession needs a cookie the gateway does not send: not served
            get_item = listed["items.get_item"]
            assert get_item.input_schema["required"] == ["item_id"]
            assert get_item.annotations is not None and get_item.annotations.read_only_hint is True
            assert get_item.description is not None and get_item.description.endswith(f"GET {backend.api}/items/{{item_id}}")
            create = listed["items.create_item"].input_schema
            # $refs resolved and bundled: the body's schema and the schemas it refers to are in the tool.
            assert create["properties"]["body"]["$ref"] == "#/$defs/NewItem"
            assert create["$defs"]["NewItem"]["properties"]["price"] == {"$ref": "#/$defs/Price"}
            assert create["$defs"]["Price"] == {"type": "number", "minimum": 0}
            assert listed["items.list_items"].input_schema["properties"]["limit"]["maximum"] == 100

            start = len(backend.log())
            found = await client.call_tool("items.list_items", {"limit": 1, "tag": ["tools"]})
            assert not found.is_error and structured(found) == {"result": [
                {"id": "1", "name": "hammer", "price": 12.5, "tags": ["tools"]}
            ]}
            assert json.loads(text_of(found)) == structured(found)["result"]
            assert _sent(backend, start)[-1]["query"] == "limit=1&tag=tools"

            one = await client.call_tool("items.get_item", {"item_id": "2"})
            assert not one.is_error and structured(one)["name"] == "apple"

            missing = await client.call_tool("items.get_item", {"item_id": "404"})
            assert missing.is_error and text_of(missing).startswith("HTTP 404 Not Found")
            assert structured(missing) == {"status": 404, "body": {"error": "no item 404"}}

            broken = await client.call_tool("items.get_report", {"report_id": 7})
            assert broken.is_error and text_of(broken).startswith("HTTP 500")

            created = await client.call_tool("items.create_item", {"body": {"name": "saw", "price": 3}})
            assert not created.is_error and structured(created)["name"] == "saw"
            assert json.loads(_sent(backend, start)[-1]["body"]) == {"name": "saw", "price": 3}

            hello = await client.call_tool("items.get_hello", {})
            assert not hello.is_error and text_of(hello) == "hello from the backend"
            assert hello.structured_content is None

            # Path parameters are escaped whole; the query is encoded.
            echoed = await client.call_tool("items.get_echo", {"text": "a/../b c", "q": "x&y=z"})
            assert structured(echoed) == {"raw_path": "/api/echo/a%2F..%2Fb%20c", "query": "q=x%26y%3Dz"}

            before = len(backend.log())
            bad_body = await client.call_tool("items.create_item", {"body": {"price": -1}})
            assert bad_body.is_error and "input schema" in text_of(bad_body)
            dotdot = await client.call_tool("items.get_item", {"item_id": ".."})
            assert dotdot.is_error and "'..'" in text_of(dotdot)
            extra = await client.call_tool("items.get_item", {"item_id": "1", "path": "/admin"})
            assert extra.is_error and "input schema" in text_of(extra)
            assert len(backend.log()) == before  # none of them was sent

            refused = await client.call_tool("items.delete_item", {"item_id": "1"})
            assert refused.is_error and "deny" in text_of(refused)
            assert len(backend.log()) == before

    # The same evidence as an MCP call: one decision in the trace per call, one surface record each.
    evidence = tmp_path / "evidence"
    recorded = decisions(evidence)
    assert [d["tool"] for d in recorded][:3] == ["items.list_items", "items.get_item", "items.get_item"]
    by_tool = {d["tool"]: d for d in recorded}
    assert by_tool["items.delete_item"]["action"] == "deny"
    surface = [
        json.loads(line)["observed_tool_decisions"][0]
        for line in (evidence / "tool-decisions.ndjson").read_text().splitlines()
    ]
    assert len(surface) == len(recorded) == 11
    assert {d["server"]["id"] for d in surface} == {"items"}
    assert "saw" not in (evidence / "trace.ndjson").read_text()  # arguments are never stored raw
    verify = cli("evidence", "verify-chain", str(evidence / "trace.ndjson"))
    assert verify.returncode == 0, verify.stderr


async def test_redirects_stay_on_the_backend_and_answers_are_capped(tmp_path: Path, backend: Backend) -> None:
    with http_gateway(_config(tmp_path, items_entry(backend, max_response_bytes=1024))) as gateway:
        assert gateway.url is not None
        async with http_client(gateway.url) as client:
            home = await client.call_tool("items.get_home", {})
            assert not home.is_error and [i["id"] for i in structured(home)["result"]][:1] == ["1"]
            start = len(backend.log())
            away = await client.call_tool("items.get_away", {})
            assert away.is_error and "another host" in text_of(away) and "127.0.0.2" in text_of(away)
            assert len(backend.log()) == start + 1  # the redirect itself, not its target
            big = await client.call_tool("items.get_big", {})
            assert not big.is_error
            text = text_of(big)
            assert text.startswith("x" * 1024) and "x" * 1025 not in text
            assert "cut at 1024 bytes" in text


async def test_tools_show_source_upstream_and_the_method_signal(tmp_path: Path, backend: Backend) -> None:
    entry = items_entry(backend, headers={"X-Api-Key": "ITEMS_API_KEY"})
    with http_gateway(_config(tmp_path, entry), env={"ITEMS_API_KEY": "k-31337"}) as gateway:
        assert gateway.url is not None
        base = gateway.control()
        async with http_client(gateway.url) as client:
            assert not (await client.call_tool("items.get_item", {"item_id": "1"})).is_error
            assert "k-31337" not in str([tool.model_dump() for tool in (await client.list_tools()).tools])
        assert backend.log()[-1]["x_api_key"] == "k-31337"  # sent to the backend, shown nowhere
        with httpx.Client(base_url=base, trust_env=False, headers=gateway.control_headers()) as http:
            listing = http.get("/tools")
            assert "k-31337" not in listing.text and "ITEMS_API_KEY" not in listing.text
            tools = {t["name"]: t for t in listing.json()}
            rows = {r["name"]: r for r in http.get("/tools/decisions", params={"agent": "someone"}).json()}
    assert "k-31337" not in gateway.text()
    assert "k-31337" not in (tmp_path / "evidence" / "trace.ndjson").read_text()
    get_item, create, delete = tools["items.get_item"], tools["items.create_item"], tools["items.delete_item"]
    assert (get_item["source"], get_item["server"], get_item["upstream_name"]) == ("openapi", "items", "get_item")
    assert get_item["classification"]["access"] == "read" and "HTTP method GET" in get_item["classification"]["reasons"]
    assert create["classification"]["access"] == "write" and "HTTP method POST" in create["classification"]["reasons"]
    assert delete["classification"]["access"] == "write" and "HTTP method DELETE" in delete["classification"]["reasons"]
    assert (rows["items.get_item"]["action"], rows["items.delete_item"]["action"]) == ("allow", "deny")


async def test_a_spec_served_by_url(tmp_path: Path, backend: Backend) -> None:
    entry = {"name": "items", "url": backend.spec_url, "allow_private": True}  # backend: the spec's server /api
    with http_gateway(_config(tmp_path, entry)) as gateway:
        assert gateway.url is not None
        async with http_client(gateway.url) as client:
            found = await client.call_tool("items.get_item", {"item_id": "1"})
            assert not found.is_error and structured(found)["name"] == "hammer"
            tool = {t.name: t for t in (await client.list_tools()).tools}["items.get_item"]
            assert tool.description is not None and tool.description.endswith(f"GET {backend.api}/items/{{item_id}}")


def _start(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(serve_argv(config), capture_output=True, text=True, timeout=scaled(60), stdin=subprocess.DEVNULL)


def test_the_ssrf_guard_refuses_loopback_without_allow_private(tmp_path: Path, backend: Backend) -> None:
    # An address literal: refused when the configuration is read.
    literal = _start(_config(tmp_path, {"name": "items", "url": backend.spec_url}))
    assert literal.returncode == 2
    assert "SSRF guard" in literal.stderr and "127.0.0.1 is a loopback address" in literal.stderr
    assert "allow_private" in literal.stderr
    backend_literal = _start(_config(tmp_path, {"name": "items", "file": str(items_entry(backend)["file"]),
                                                "backend_url": backend.api}))
    assert backend_literal.returncode == 2 and "backend_url is refused by the SSRF guard" in backend_literal.stderr
    # A host that only resolves to loopback (127.1 is 127.0.0.1): refused when the spec is fetched.
    spelled = backend.spec_url.replace("127.0.0.1", "127.1")
    start = len(backend.log())
    resolved = _start(_config(tmp_path, {"name": "items", "url": spelled}))
    assert resolved.returncode == 2, resolved.stderr
    assert "the SSRF guard refuses 127.1: it resolves to 127.0.0.1 is a loopback address" in resolved.stderr
    assert "Traceback" not in resolved.stderr
    assert len(backend.log()) == start
    # The backend too, when it resolves to loopback.
    resolved_backend = _start(_config(tmp_path, {"name": "items", "file": str(items_entry(backend)["file"]),
                                                 "backend_url": backend.api.replace("127.0.0.1", "127.1")}))
    assert resolved_backend.returncode == 2 and "refused by the SSRF guard" in resolved_backend.stderr


def test_an_unreadable_spec_is_a_startup_error(tmp_path: Path, backend: Backend) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        "openapi: 3.1.0\ninfo: {title: t, version: '1'}\npaths:\n  /x:\n    get:\n"
        "      parameters: [{$ref: '#/components/parameters/Nope'}]\n      responses: {'200': {description: ok}}\n"
    )
    result = _start(_config(tmp_path, {"name": "items", "file": str(broken), "backend_url": backend.api,
                                       "allow_private": True}))
    assert result.returncode == 2 and "'#/components/parameters/Nope' cannot be resolved" in result.stderr
    no_server = _start(_config(tmp_path, {"name": "items", "file": str(items_entry(backend)["file"]),
                                          "allow_private": True}))
    assert no_server.returncode == 2 and "set backend_url" in no_server.stderr
