"""The catalogue features of a running ``drawbridge serve``: per-agent ``tools/list`` under
``hide_denied_tools``, a policy edit over HTTP that the next call obeys, and the control plane's access
rule on the gateway's own listener (and on a listener of its own with ``--stdio``). Real gateway
processes, real upstream servers."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest
from conftest import MODERN, connect, eventually_async, scaled
from serve_support import (
    GITHUB,
    SLACK,
    Running,
    dump,
    free_port,
    http_client,
    http_gateway,
    sha256,
    stdio_params,
    wait_for_port,
    write_config,
)

ALICE, BOB, CLAUDE_TOKEN = "alice-catalogue-token", "bob-catalogue-token", "claude-catalogue-token"
ADMIN = "catalogue-admin-token-93e1"
ENVELOPE = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}

HIDING = {
    "alice.yaml": (
        "name: alice\nagent: alice\nrules:\n"
        "  - tools: ['github.list_*', 'github.get_*']\n    action: allow\n"
        "  - tools: ['github.add_deploy_key']\n    action: allow\n"
        "    when:\n      - {arg: repo, op: starts_with, value: 'staging-'}\n"
        "  - tools: ['github.delete_repo', 'slack.*']\n    action: deny\n"
    ),
    "bob.yaml": "name: bob\nagent: bob\nrules:\n  - tools: ['slack.*']\n    action: human_approval\n",
    "default.yaml": "name: default\nagent: '*'\nrules:\n  - tools: ['*']\n    action: deny\n",
}

COMMENTED = """\
# Claude's policy. Owner: platform team.
#
# Reviewed 2026-07-01; keep the comments.

name: claude
agent: "claude"

rules:
  # --- reads ---------------------------------------------------------
  - tools: ["github.list_*", "github.get_*"]
    action: allow      # read-only token anyway


  # --- writes --------------------------------------------------------
  # everything else on github needs a human
  - tools: ["github.*"]
    action: human_approval
"""
SHARED = "# Shared: deny what nobody listed.\nname: default\nagent: '*'\nrules:\n  - tools: ['*']\n    action: deny\n"


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _base(running: Running) -> str:
    """The control plane's own listener (never the agents' /mcp one)."""
    return running.control()


def _claude_config(directory: Path, policy: str) -> Path:
    """github behind a gateway with an admin token and claude's token, ``policy`` as claude's own."""
    return write_config(
        directory,
        [GITHUB],
        policies={"claude.yaml": policy, "default.yaml": SHARED},
        fsync="never",
        auth={"admin": {"token_sha256": sha256(ADMIN)},
              "agents": [{"agent": "claude", "token_sha256": sha256(CLAUDE_TOKEN)}]},
    )


def _comments(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith("#")]


def _text(result: dict[str, Any]) -> str:
    return " ".join(part.get("text", "") for part in result.get("content", []))


# ------------------------------------------------------------------------------------ hiding


@pytest.fixture(scope="module")
def hiding(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    directory = tmp_path_factory.mktemp("hide")
    config = write_config(
        directory,
        [GITHUB, SLACK],
        policies=HIDING,
        hide_denied_tools=True,
        fsync="never",
        listen={"host": "127.0.0.1", "port": 0},
        auth={"agents": [{"agent": "alice", "token_sha256": sha256(ALICE)}, {"agent": "bob", "token_sha256": sha256(BOB)}]},
    )
    with http_gateway(config) as running:
        running.url = f"http://127.0.0.1:{running.url.rsplit(':', 1)[1]}" if running.url else None
        yield running


@pytest.mark.anyio
async def test_each_agent_sees_only_the_tools_it_may_use_and_hidden_calls_are_refused(hiding: Running) -> None:
    assert hiding.url is not None
    async with http_client(hiding.url, "legacy", ALICE) as alice:
        alice_tools = sorted(tool.name for tool in (await alice.list_tools()).tools)
        hidden_call = dump(await alice.call_tool("github.delete_repo", {"owner": "acme", "name": "anvil"}))
        visible_call = dump(await alice.call_tool("github.list_repos", {"owner": "acme"}))
    async with http_client(hiding.url, "legacy", BOB) as bob:
        bob_tools = sorted(tool.name for tool in (await bob.list_tools()).tools)
    # A conditional allow keeps add_deploy_key listed; human_approval is never hidden.
    assert alice_tools == ["github.add_deploy_key", "github.get_repo", "github.list_repos"]
    assert bob_tools == ["slack.add_member", "slack.invite", "slack.list_channels"]
    assert hidden_call["isError"] is True
    assert hidden_call["_meta"]["drawbridge/decision"] == {
        "action": "deny", "outcome": "refused", "policy": "alice", "rule_index": 2,
    }
    assert not visible_call.get("isError")

    rows = httpx.get(f"{_base(hiding)}/tools/decisions", params={"agent": "alice"}, headers=hiding.control_headers()).json()
    assert sorted(r["name"] for r in rows if not r["hidden"]) == alice_tools


def test_a_filtered_2026_list_is_private_and_filtered(hiding: Running) -> None:
    assert hiding.url is not None
    listed = httpx.post(
        hiding.url,
        json={"jsonrpc": "2.0", "id": "l", "method": "tools/list", "params": {"_meta": ENVELOPE}},
        headers={**_auth(BOB), "mcp-protocol-version": MODERN, "mcp-method": "tools/list",
                 "accept": "application/json, text/event-stream"},
    )
    result = listed.json()["result"]
    assert result["cacheScope"] == "private"
    assert sorted(t["name"] for t in result["tools"]) == ["slack.add_member", "slack.invite", "slack.list_channels"]


def test_without_a_configured_token_the_control_plane_needs_the_one_serve_keeps(hiding: Running) -> None:
    """An agent with a shell on this host is a loopback caller: it gets nothing without the token, which
    serve made at its first start and keeps in a file only its user may read."""
    base = _base(hiding)
    assert hiding.token_file is not None and hiding.token_file.name == "drawbridge.admin-token"
    assert hiding.token_file.parent == hiding.config.parent if hiding.config else False
    assert hiding.token_file.stat().st_mode & 0o777 == 0o600
    token = hiding.token_file.read_text(encoding="ascii").strip()
    assert token not in hiding.text()  # its path is printed, never the token
    assert httpx.get(f"{base}/policies").status_code == 401
    assert httpx.get(f"{base}/policies", headers={"X-Forwarded-For": "127.0.0.1"}).status_code == 401
    assert httpx.get(f"{base}/policies", headers=_auth(ALICE)).status_code == 401  # an agent's token is not it
    served = httpx.get(f"{base}/policies", headers=hiding.control_headers())
    assert served.status_code == 200 and [p["name"] for p in served.json()] == ["alice", "bob", "default"]
    # The two listeners are apart: no control route beside /mcp, no /mcp beside the control plane.
    assert hiding.url is not None
    assert httpx.get(hiding.url.removesuffix("/mcp") + "/policies", headers=hiding.control_headers()).status_code == 404
    assert httpx.post(f"{base}/mcp", json={}, headers=_auth(ALICE)).status_code in (401, 404)
    agent_mcp = httpx.post(
        hiding.url,
        json={"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}},
        headers={**_auth(ALICE), "accept": "application/json, text/event-stream"},
    )
    assert agent_mcp.status_code == 200


# ------------------------------------------------------------------------------- policy edits


@pytest.mark.anyio
async def test_a_policy_edit_over_http_keeps_comments_and_decides_the_next_call(tmp_path: Path) -> None:
    config = _claude_config(tmp_path, COMMENTED)
    policy = tmp_path / "policies" / "claude.yaml"
    original = policy.read_bytes()
    with http_gateway(config) as running:
        assert running.url is not None
        base = _base(running)
        async with http_client(running.url, "legacy", CLAUDE_TOKEN) as claude:
            before = dump(await claude.call_tool("github.list_repos", {"owner": "acme"}))
            assert not before.get("isError"), before

            for token in (None, "not-the-admin-token", CLAUDE_TOKEN):
                refused = httpx.put(f"{base}/policies/claude/tools/github.list_repos",
                                    json={"action": "deny", "by": "mallory"}, headers=_auth(token) if token else {})
                assert refused.status_code == 401, refused.text
                assert refused.json() == {"error": "control plane requires admin authorization"}
            assert policy.read_bytes() == original

            edited = httpx.put(f"{base}/policies/claude/tools/github.list_repos",
                               json={"action": "deny", "by": "marc"}, headers=_auth(ADMIN))
            assert edited.status_code == 200, edited.text
            body = edited.json()
            assert (body["action_before"], body["action_after"], body["placement"]) == (
                "allow", "deny", "before_deciding_rule")
            text = policy.read_text(encoding="utf-8")
            kept = iter(_comments(text))
            assert all(comment in kept for comment in _comments(COMMENTED)), "a comment was lost or moved"
            assert re.search(r"^  # set from console, \d{4}-\d{2}-\d{2} by marc$", text, re.MULTILINE)
            assert "read-only token anyway" in text and "\n\n\n  # --- writes" in text
            assert (tmp_path / "policies" / "claude.yaml.bak").read_bytes() == original

            # The very next call through the gateway is decided by the new rule, without a restart.
            after = dump(await claude.call_tool("github.list_repos", {"owner": "acme"}))
            assert after["isError"] is True
            assert after["_meta"]["drawbridge/decision"] == {
                "action": "deny", "outcome": "refused", "policy": "claude", "rule_index": body["rule_index"],
            }
            assert dump(await claude.call_tool("github.get_repo", {"owner": "acme", "name": "anvil"})).get(
                "isError") is not True

            # An edit that would leave a set that does not load changes nothing and says why.
            edited_text = policy.read_bytes()
            (tmp_path / "policies" / "zz.yaml").write_text("name: [unclosed\n", encoding="utf-8")
            broken = httpx.put(f"{base}/policies/claude/tools/github.get_repo",
                               json={"action": "deny", "by": "marc"}, headers=_auth(ADMIN))
            assert broken.status_code == 422, broken.text
            assert "zz.yaml" in broken.json()["error"]
            assert policy.read_bytes() == edited_text
            still = dump(await claude.call_tool("github.get_repo", {"owner": "acme", "name": "anvil"}))
            assert still.get("isError") is not True
        (tmp_path / "policies" / "zz.yaml").unlink()

    entries = [json.loads(line) for line in (tmp_path / "evidence" / "trace.ndjson").read_text().splitlines()]
    edits = [e["body"] for e in entries if e["kind"] == "mesh.policy_edit"]
    assert len(edits) == 1
    assert (edits[0]["tool"], edits[0]["action_before"], edits[0]["action_after"], edits[0]["by"]) == (
        "github.list_repos", "allow", "deny", "marc")
    decisions = [(e["body"]["tool"], e["body"]["action"]) for e in entries if e["kind"] == "tool_decision"]
    assert decisions == [
        ("github.list_repos", "allow"), ("github.list_repos", "deny"),
        ("github.get_repo", "allow"), ("github.get_repo", "allow"),
    ]


@pytest.mark.anyio
async def test_a_policy_edit_decides_calls_a_conditional_rule_for_the_tool_decided_before(tmp_path: Path) -> None:
    conditional = (
        "name: claude\nagent: claude\nrules:\n"
        "  # acme's repositories may be listed\n"
        "  - tools: [github.list_repos]\n    action: allow\n"
        "    when: [{arg: owner, op: starts_with, value: acme}]\n"
        "  - tools: ['github.*']\n    action: allow\n"
    )
    config = _claude_config(tmp_path, conditional)
    with http_gateway(config) as running:
        assert running.url is not None
        edited = httpx.put(f"{_base(running)}/policies/claude/tools/github.list_repos",
                           json={"action": "deny", "by": "marc"}, headers=_auth(ADMIN))
        assert edited.status_code == 200, edited.text
        body = edited.json()
        assert (body["action_after"], body["after"]["conditional"]) == ("deny", [])
        async with http_client(running.url, "legacy", CLAUDE_TOKEN) as claude:
            for owner in ("acme", "other"):
                result = dump(await claude.call_tool("github.list_repos", {"owner": owner}))
                assert result["_meta"]["drawbridge/decision"]["action"] == "deny", (owner, result)


@pytest.mark.anyio
async def test_a_policy_reload_tells_filtered_agents_that_their_tool_list_changed(tmp_path: Path) -> None:
    reads = "name: all\nagent: '*'\nrules:\n  - tools: ['github.list_*']\n    action: allow\n"
    config = write_config(tmp_path, [GITHUB], policies={"all.yaml": reads}, hide_denied_tools=True, fsync="never")
    changed: list[str] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.append(message.method)

    async with connect(stdio_params(config), "legacy", message_handler=on_message) as client:
        assert [tool.name for tool in (await client.list_tools()).tools] == ["github.list_repos"]
        await anyio.sleep(scaled(0.6))  # more than one look of the policy watcher
        assert changed == []  # nothing changed, nothing announced
        (tmp_path / "policies" / "all.yaml").write_text(
            reads + "  - tools: ['github.get_*']\n    action: allow\n", encoding="utf-8"
        )
        await eventually_async(lambda: changed, scaled(10), "tools/list_changed")
        names = sorted(tool.name for tool in (await client.list_tools()).tools)
    assert names == ["github.get_repo", "github.list_repos"]


@pytest.mark.anyio
@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_2026_agent_listening_for_tool_changes_hears_of_a_policy_reload(tmp_path: Path, transport: str) -> None:
    reads = "name: all\nagent: '*'\nrules:\n  - tools: ['github.list_*']\n    action: allow\n"
    options: dict[str, Any] = {"policies": {"all.yaml": reads}, "hide_denied_tools": True, "fsync": "never"}
    if transport == "http":
        options.update(listen={"host": "127.0.0.1", "port": 0},
                       auth={"agents": [{"agent": "alice", "token_sha256": sha256(ALICE)}]})
    config = write_config(tmp_path, [GITHUB], **options)

    def edit_policy() -> None:
        (tmp_path / "policies" / "all.yaml").write_text(
            reads + "  - tools: ['github.get_*']\n    action: allow\n", encoding="utf-8"
        )

    async def exercise(client: Any) -> list[str]:
        assert [tool.name for tool in (await client.list_tools()).tools] == ["github.list_repos"]
        async with client.listen(tools_list_changed=True, resource_subscriptions=["repo://acme/anvil"]) as sub:
            # Honored: tool list changes; not a resource no upstream serves (left out of the ack).
            assert dump(sub.honored) == {"toolsListChanged": True}
            edit_policy()
            with anyio.fail_after(scaled(10)):
                event = await sub.__anext__()
            assert type(event).__name__ == "ToolsListChanged"
        return sorted(tool.name for tool in (await client.list_tools()).tools)

    if transport == "stdio":
        async with connect(stdio_params(config), MODERN) as client:
            names = await exercise(client)
    else:
        with http_gateway(config) as running:
            assert running.url is not None
            async with http_client(running.url, MODERN, ALICE) as client:
                names = await exercise(client)
    assert names == ["github.get_repo", "github.list_repos"]


@pytest.mark.anyio
async def test_listen_is_refused_to_a_handshake_session_and_checks_its_filter(tmp_path: Path) -> None:
    config = write_config(tmp_path, [GITHUB], policies={"default.yaml": SHARED}, fsync="never")
    async with connect(stdio_params(config), "legacy") as client:
        with pytest.raises(Exception) as legacy:
            await client.session.send_request(
                types.SubscriptionsListenRequest(
                    params=types.SubscriptionsListenRequestParams(notifications=types.SubscriptionFilter())
                ),
                types.SubscriptionsListenResult,
            )
        assert "subscriptions/listen is part of 2026-07-28" in str(legacy.value)


def test_a_listen_post_that_takes_no_event_stream_is_refused_at_once(hiding: Running) -> None:
    assert hiding.url is not None
    body = {"jsonrpc": "2.0", "id": "sub-1", "method": "subscriptions/listen",
            "params": {"notifications": {"toolsListChanged": True}, "_meta": ENVELOPE}}
    headers = {**_auth(BOB), "mcp-protocol-version": MODERN, "mcp-method": "subscriptions/listen"}
    refused = httpx.post(hiding.url, json=body, headers={**headers, "accept": "application/json"}, timeout=scaled(10))
    assert refused.json()["error"]["message"] == (
        "invalid request: subscriptions/listen needs a response stream (Accept: text/event-stream)"
    )
    body["params"]["notifications"] = {"toolsListChanged": "yes"}
    bad = httpx.post(hiding.url, json=body, headers={**headers, "accept": "application/json, text/event-stream"},
                     timeout=scaled(10))
    assert bad.json()["error"]["message"] == "invalid params: toolsListChanged must be a boolean"


# ---------------------------------------------------------------------------- --stdio + control


@pytest.mark.anyio
async def test_with_stdio_the_control_plane_has_its_own_listener_when_control_is_configured(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(
        tmp_path, [GITHUB], fsync="never", control={"host": "127.0.0.1", "port": port},
        auth={"admin": {"token_sha256": sha256(ADMIN)}},
    )
    async with connect(stdio_params(config, "--agent", "claude")) as client:
        listed = sorted(tool.name for tool in (await client.list_tools()).tools)
        wait_for_port(port)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            tools = await http.get("/tools", headers=_auth(ADMIN))
            assert tools.status_code == 200
            assert sorted(t["name"] for t in tools.json()) == listed
            assert (await http.get("/tools")).status_code == 401
            # No agents over HTTP here: /mcp is no route of the control plane (401 first without the token).
            assert (await http.post("/mcp", json={}, headers=_auth(ADMIN))).status_code == 404
            assert (await http.post("/mcp", json={})).status_code == 401
    assert "github.list_repos" in listed
