"""The control plane served by real uvicorn on 127.0.0.1, called over HTTP with httpx.

Real parts everywhere: policy files full of comments in a temporary policy directory (hot-reload
store), SQLite state, the hash-chained trace log, the approval engine in blocking mode, pinned
catalogues. Access from other addresses is simulated with ``httpx.ASGITransport(client=...)``, since
no other address reaches this machine's loopback listener.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import eventually, scaled
from control_support import (
    ADMIN_SHA256,
    ADMIN_TOKEN,
    CLAUDE,
    CREATE_ISSUE,
    CURRENT,
    LIST_REPOS_V1,
    LIST_REPOS_V2,
    NEEDS_PERSON,
    LiveServer,
    Plane,
    build_plane,
    expected_fingerprint,
    make_call,
)
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from drawbridge.control import AdminAuth, control_app, control_routes
from drawbridge.gateway.pipeline.approvals.settlement import SettlementKind

ADMIN_REQUIRED = {"error": "control plane requires admin authorization"}
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
HEX16 = re.compile(r"[0-9a-f]{16}")

ROUTES = [
    ("GET", "/tools"),
    ("GET", "/tools/decisions?agent=claude"),
    ("GET", "/tools/pins"),
    ("POST", "/tools/pins/accept"),
    ("GET", "/policies"),
    ("PUT", "/policies/claude/tools/github.delete_repo"),
    ("GET", "/approvals"),
    ("GET", "/approvals/0123456789abcdef"),
    ("POST", "/approvals/0123456789abcdef/approve"),
    ("POST", "/approvals/0123456789abcdef/deny"),
    ("GET", "/grants"),
    ("POST", "/grants"),
    ("DELETE", "/grants/0123456789abcdef"),
    ("PATCH", "/tools"),  # a method no route serves: refused before anything says so
    ("GET", "/no/such/route"),  # a path no route serves: refused too, so routes cannot be probed
    ("POST", "/approvals/0123456789abcdef/approve/again"),
    ("GET", "/metrics/../admin"),
]


@pytest.fixture(scope="module")
def live() -> Iterator[LiveServer]:
    server = LiveServer()
    yield server
    server.close()


@pytest.fixture
def plane(live: LiveServer, tmp_path: Path) -> Iterator[Plane]:
    built: Plane = live.call(build_plane(tmp_path))
    yield built
    live.stop_servers()
    built.close()


@pytest.fixture
def http(live: LiveServer, plane: Plane) -> Iterator[httpx.Client]:
    """An operator's client of the control plane: it presents the admin token."""
    url = live.serve(plane.app(ADMIN_SHA256))
    with httpx.Client(base_url=url, timeout=scaled(10), headers=AUTH) as client:
        yield client


def by_name(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in rows}


def wait_pending(http: httpx.Client, count: int = 1) -> list[dict[str, Any]]:
    def enough() -> list[dict[str, Any]] | None:
        pending = http.get("/approvals", params={"status": "pending"}).json()
        return pending if len(pending) >= count else None

    return eventually(enough, scaled(10), f"{count} pending approval(s)")


# ------------------------------------------------------------------------------ catalogue, decisions


def test_tools_lists_every_served_tool_with_its_classification(http: httpx.Client) -> None:
    response = http.get("/tools")
    assert response.status_code == 200
    tools = response.json()
    assert [t["name"] for t in tools] == [f"{s}.{t['name']}" for s, ts in CURRENT.items() for t in ts]
    rows = by_name(tools)
    # The spec's signals, re-read by hand: readOnlyHint true -> read; destructiveHint / write verbs -> write.
    assert (rows["github.get_repo"]["classification"]["family"], rows["github.get_repo"]["classification"]["access"]) \
        == ("named", "read")
    delete = rows["github.delete_repo"]["classification"]
    assert (delete["family"], delete["access"]) == ("named", "write")
    assert 'name verb "delete"' in delete["reasons"]
    assert 'name verb "create"' in rows["github.create_issue"]["classification"]["reasons"]
    assert rows["slack.search_messages"]["classification"]["access"] == "read"
    assert rows["slack.post_message"]["classification"]["access"] == "write"
    assert {n: r["pin_status"] for n, r in rows.items()} == {
        "github.list_repos": "changed", "github.get_repo": "pinned", "github.add_deploy_key": "pinned",
        "github.delete_repo": "pinned", "github.create_issue": "new",
        "slack.post_message": "pinned", "slack.search_messages": "pinned",
    }
    assert rows["github.list_repos"]["description"] == LIST_REPOS_V2["description"]
    assert rows["github.list_repos"]["server"] == "github"
    assert rows["github.list_repos"]["upstream_name"] == "list_repos"


def test_decisions_per_agent_show_rule_provenance_conditions_floors_and_pins(http: httpx.Client) -> None:
    response = http.get("/tools/decisions", params={"agent": "claude"})
    assert response.status_code == 200
    rows = by_name(response.json())
    deploy = rows["github.add_deploy_key"]
    assert (deploy["action"], deploy["rule"], deploy["source_file"], deploy["rule_index"]) == (
        "human_approval", "claude", "claude.yaml", 3)
    assert [(c["action"], c["rule"], c["field"], c["operator"], c["rule_index"]) for c in deploy["conditional"]] == [
        ("allow", "claude", "repo", "starts_with", 1)]
    # list_repos: the policy allows it, the changed pin raises it to human_approval.
    listed = rows["github.list_repos"]
    assert (listed["policy_action"], listed["action"], listed["by_floor"], listed["pin_status"]) == (
        "allow", "human_approval", True, "changed")
    # create_issue: new since pinning, denied whatever github.* says.
    new = rows["github.create_issue"]
    assert (new["policy_action"], new["action"], new["by_floor"], new["pin_status"]) == (
        "human_approval", "deny", True, "new")
    assert (rows["github.get_repo"]["action"], rows["github.get_repo"]["rule_index"]) == ("allow", 0)
    search = rows["slack.search_messages"]
    assert (search["action"], search["rule"], search["source_file"], search["rule_index"]) == (
        "deny", "default", "default.yaml", 0)
    others = http.get("/tools/decisions", params={"agent": "someone-else"}).json()
    assert {row["action"] for row in others} == {"deny"}

    missing = http.get("/tools/decisions")
    assert missing.status_code == 400
    assert "agent" in missing.json()["error"]


def test_policies_are_listed_in_evaluation_order_with_source_files(http: httpx.Client) -> None:
    policies = http.get("/policies").json()
    assert [(p["name"], p["agent"], p["source_file"]) for p in policies] == [
        ("claude", "claude", "claude.yaml"), ("default", "*", "default.yaml")]
    rules = policies[0]["rules"]
    assert [r["action"] for r in rules] == ["allow", "allow", "deny", "human_approval"]
    assert rules[1]["conditions"] == [{"field": "repo", "operator": "starts_with", "value": "staging-"}]
    assert policies[0]["schemas"] == ["github.add_deploy_key"]


# ------------------------------------------------------------------------------------- policy edits


def _comments(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if "#" in line]


def test_policy_edit_over_http_keeps_comments_and_applies_without_restart(http: httpx.Client, plane: Plane) -> None:
    path = plane.policy_dir / "claude.yaml"
    original = path.read_bytes()
    assert plane.policy_store.evaluate("claude", "github.delete_repo").action == "human_approval"

    response = http.put("/policies/claude/tools/github.delete_repo", json={"action": "deny", "by": "marc"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["action_before"], body["action_after"], body["changed"], body["by"]) == (
        "human_approval", "deny", True, "marc")
    assert body["backup"] == "claude.yaml.bak"

    text = path.read_text(encoding="utf-8")
    new_comments = _comments(text)
    kept = iter(new_comments)
    assert all(comment in kept for comment in _comments(CLAUDE)), "a comment was lost or moved"
    assert any(c.startswith("# set from console, ") and c.endswith(" by marc") for c in new_comments)
    assert "\n\n\n  # --- writes" in text  # the blank lines stay as written
    assert (plane.policy_dir / "claude.yaml.bak").read_bytes() == original

    # In force at once: the store the gateway evaluates with, and the decision table.
    assert plane.policy_store.evaluate("claude", "github.delete_repo").action == "deny"
    rows = by_name(http.get("/tools/decisions", params={"agent": "claude"}).json())
    assert rows["github.delete_repo"]["action"] == "deny"
    assert rows["github.add_deploy_key"]["action"] == "human_approval"

    [entry] = plane.entries("mesh.policy_edit")
    assert entry["seq"] == body["trace_seq"]
    assert (entry["body"]["agent"], entry["body"]["tool"], entry["body"]["by"]) == ("claude", "github.delete_repo", "marc")
    assert (entry["body"]["action_before"], entry["body"]["action_after"]) == ("human_approval", "deny")

    back = http.put("/policies/claude/tools/github.delete_repo", json={"action": "inherit", "by": "marc"})
    assert back.status_code == 200, back.text
    assert (back.json()["action_before"], back.json()["action_after"]) == ("deny", "human_approval")
    assert "set from console" not in path.read_text(encoding="utf-8")
    assert plane.policy_store.evaluate("claude", "github.delete_repo").action == "human_approval"
    assert len(plane.entries("mesh.policy_edit")) == 2
    assert plane.chain_ok()


def test_invalid_policy_edits_leave_the_file_and_answer_the_error(http: httpx.Client, plane: Plane) -> None:
    path = plane.policy_dir / "claude.yaml"
    original = path.read_bytes()
    url = "/policies/claude/tools/github.delete_repo"

    cases = [
        (http.put(url, json={"action": "maybe", "by": "marc"}), 400, "unknown action"),
        (http.put(url, json={"action": "deny"}), 400, "'by' is required"),
        (http.put(url, json={"action": "deny", "by": "marc", "note": "x"}), 400, "unknown field"),
        (http.put(url, content=b"{not json", headers={"content-type": "application/json"}), 400, "not valid JSON"),
        (http.put(url, json={"action": "deny", "by": "x" * 70_000}), 413, "larger than"),
        (http.put("/policies/claude/tools/slack.post_message", json={"action": "inherit", "by": "marc"}), 409,
         "written by hand"),
        (http.put("/policies/nobody/tools/github.delete_repo", json={"action": "deny", "by": "marc"}), 404,
         "no policy is written for agent"),
    ]
    for response, status, words in cases:
        assert response.status_code == status, response.text
        assert words in response.json()["error"]
        assert path.read_bytes() == original

    # Another file breaks on disk: the edit would leave a set that does not load, so it is undone.
    (plane.policy_dir / "zz.yaml").write_text("name: [unclosed\n", encoding="utf-8")
    broken = http.put(url, json={"action": "deny", "by": "marc"})
    assert broken.status_code == 422, broken.text
    assert "zz.yaml" in broken.json()["error"]
    assert path.read_bytes() == original
    assert plane.policy_store.evaluate("claude", "github.delete_repo").action == "human_approval"
    assert plane.entries("mesh.policy_edit") == []


def test_a_percent_encoded_slash_stays_inside_the_agent_name(http: httpx.Client, plane: Plane) -> None:
    team = plane.policy_dir / "team.yaml"
    team.write_text('# the team bot\nname: team\nagent: "team/bot"\nrules:\n  - tools: ["*"]\n    action: deny\n')
    assert plane.policy_store.reload() is None
    response = http.put("/policies/team%2Fbot/tools/github.get_repo", json={"action": "allow", "by": "ana"})
    assert response.status_code == 200, response.text
    assert response.json()["agent"] == "team/bot"
    assert plane.policy_store.evaluate("team/bot", "github.get_repo").action == "allow"
    assert team.read_text().startswith("# the team bot\n")


@pytest.mark.anyio
async def test_an_edit_that_cannot_be_recorded_is_undone(plane: Plane) -> None:
    async def broken_trace(kind: str, body: Any) -> Any:
        raise OSError("the trace log cannot be written")

    app = control_app(dataclasses.replace(plane.services, trace_append=broken_trace), admin_token_sha256=ADMIN_SHA256)
    path = plane.policy_dir / "claude.yaml"
    original = path.read_bytes()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", headers=AUTH) as client:
        response = await client.put("/policies/claude/tools/github.delete_repo", json={"action": "deny", "by": "marc"})
    assert response.status_code == 500
    assert response.json()["error"] == "the edit could not be recorded in the trace chain, so it was undone"
    assert path.read_bytes() == original
    assert plane.policy_store.evaluate("claude", "github.delete_repo").action == "human_approval"


# --------------------------------------------------------------------------------------------- pins


def test_pins_list_and_accept_by_tools_then_by_server_recorded_in_the_chain(http: httpx.Client, plane: Plane) -> None:
    held = by_name(http.get("/tools/pins").json())
    assert set(held) == {"github.list_repos", "github.create_issue"}
    changed = held["github.list_repos"]
    assert changed["status"] == "changed"
    assert changed["pinned"] == {"fingerprint": expected_fingerprint(LIST_REPOS_V1),
                                 "description": LIST_REPOS_V1["description"], "definition": None}
    assert {k: changed["current"][k] for k in ("fingerprint", "description")} == {
        "fingerprint": expected_fingerprint(LIST_REPOS_V2), "description": LIST_REPOS_V2["description"]}
    assert held["github.create_issue"]["status"] == "new"
    assert held["github.create_issue"]["pinned"] is None

    response = http.post("/tools/pins/accept", json={"tools": ["github.list_repos"], "by": "marc"})
    assert response.status_code == 200, response.text
    [accepted] = response.json()["accepted"]
    [entry] = plane.entries("mesh.pin_accept")
    for record in (accepted, entry["body"]):
        assert record["name"] == "github.list_repos"
        assert record["previous_description"] == LIST_REPOS_V1["description"]
        assert record["description"] == LIST_REPOS_V2["description"]
        assert record["previous_fingerprint"] == expected_fingerprint(LIST_REPOS_V1)
        assert record["fingerprint"] == expected_fingerprint(LIST_REPOS_V2)
        assert record["accepted_by"] == "marc"
    assert accepted["trace_seq"] == entry["seq"]

    assert [t["name"] for t in http.get("/tools/pins").json()] == ["github.create_issue"]
    rows = by_name(http.get("/tools/decisions", params={"agent": "claude"}).json())
    assert (rows["github.list_repos"]["action"], rows["github.list_repos"]["pin_status"]) == ("allow", "pinned")

    by_server = http.post("/tools/pins/accept", json={"server": "github", "by": "marc"})
    assert by_server.status_code == 200
    [issue] = by_server.json()["accepted"]
    assert (issue["name"], issue["previous_description"], issue["description"]) == (
        "github.create_issue", None, CREATE_ISSUE["description"])
    assert issue["fingerprint"] == expected_fingerprint(CREATE_ISSUE)
    assert http.get("/tools/pins").json() == []
    assert http.post("/tools/pins/accept", json={"server": "github", "by": "marc"}).json()["count"] == 0
    assert len(plane.entries("mesh.pin_accept")) == 2
    assert plane.chain_ok()


PIN_REFUSALS: list[tuple[dict[str, Any], int, str]] = [
    ({"server": "github", "tools": ["github.list_repos"]}, 400, "either"),
    ({"by": "marc"}, 400, "either"),
    ({"tools": "github.list_repos"}, 400, "non-empty list"),
    ({"tools": []}, 400, "non-empty list"),
    ({"tools": ["github.nope"]}, 404, "neither pinned nor observed"),
    ({"tools": ["gitlab.create_issue"]}, 404, "gitlab.create_issue"),
    ({"server": "gitlab"}, 404, "gitlab"),
    ({"tools": ["github.list_repos"], "fingerprints": ["sha256:" + "0" * 64]}, 400, "non-empty object"),
    ({"tools": ["github.list_repos"], "fingerprints": {"github.list_repos": "md5:0"}}, 400, "sha256:<64"),
    ({"tools": ["github.list_repos"], "fingerprints": {"github.create_issue": None}}, 409,
     "'list_repos' would change but no reviewed fingerprint names it"),
    ({"tools": ["github.list_repos"], "fingerprints": {"github.list_repos": "sha256:" + "0" * 64}}, 409,
     f"'list_repos' was reviewed as sha256:{'0' * 64} but is {expected_fingerprint(LIST_REPOS_V2)} now"),
    ({"server": "github", "fingerprints": {"github.list_repos": expected_fingerprint(LIST_REPOS_V2)}}, 409,
     "'create_issue' would change but no reviewed fingerprint names it"),
    ({"tools": ["github.list_repos"], "fingerprints": {"gitlab.x": None}}, 404, "gitlab.x"),
]


def test_pin_accept_refusals_change_nothing(http: httpx.Client, plane: Plane) -> None:
    for body, status, words in PIN_REFUSALS:
        response = http.post("/tools/pins/accept", json=body)
        assert response.status_code == status, body
        assert words in response.json()["error"], body
    assert plane.entries("mesh.pin_accept") == []
    assert len(http.get("/tools/pins").json()) == 2


def test_a_pin_accept_bound_to_the_reviewed_fingerprints_pins_them(http: httpx.Client, plane: Plane) -> None:
    held = by_name(http.get("/tools/pins").json())
    reviewed = {name: row["current"]["fingerprint"] for name, row in held.items()}
    response = http.post("/tools/pins/accept", json={"server": "github", "by": "marc", "fingerprints": reviewed})
    assert response.status_code == 200, response.text
    assert {a["name"]: a["fingerprint"] for a in response.json()["accepted"]} == reviewed
    assert http.get("/tools/pins").json() == []


# ---------------------------------------------------------------------------------------- approvals


def test_approve_over_http_releases_the_waiting_call_exactly_once(
    live: LiveServer, http: httpx.Client, plane: Plane
) -> None:
    waiting = live.submit(plane.engine.settle(make_call(), NEEDS_PERSON, elicitation_supported=False))
    [pending] = wait_pending(http)
    assert (pending["agent"], pending["tool"], pending["status"]) == ("claude", "github.delete_repo", "pending")
    assert HEX16.fullmatch(pending["id"])
    listing = http.get("/approvals", params={"status": "pending"}).text
    assert "acme" not in listing and "rocket" not in listing  # argument values are never shown

    plane.recent.add("claude", {"tool": "github.get_repo", "action": "allow"})
    detail = http.get(f"/approvals/{pending['short_id']}").json()
    assert detail["id"] == pending["id"]
    assert detail["active_grants"] == []
    assert detail["recent_calls"] == [{"tool": "github.get_repo", "action": "allow"}]
    assert not waiting.done()

    # A key given twice is read one way by one parser and another way by the next: refused, as at /mcp.
    for body in (b'{"resolved_by": "eve", "resolved_by": "marc"}', b'{"resolved_by": "marc", "Resolved_By": "eve"}'):
        twice = http.post(f"/approvals/{pending['id']}/approve", content=body, headers={"content-type": "application/json"})
        assert twice.status_code == 400, twice.text
        assert twice.json()["error"].startswith("the request body is not valid JSON: a JSON object in the message ")
        assert "eve" not in twice.text and "marc" not in twice.text
    assert not waiting.done() and plane.entries("approval_resolved") == []

    response = http.post(f"/approvals/{pending['id']}/approve", json={"resolved_by": "marc", "reason": "looks fine"})
    assert response.status_code == 200, response.text
    assert (response.json()["status"], response.json()["id"]) == ("approved", pending["id"])
    settlement = waiting.result(scaled(10))
    assert settlement.kind is SettlementKind.ALLOW
    assert (settlement.resolved_by, str(settlement.channel)) == ("marc", "control_plane")

    again = http.post(f"/approvals/{pending['id']}/approve", json={"resolved_by": "eve"})
    assert again.status_code == 409
    assert "already resolved" in again.json()["error"]
    assert http.post(f"/approvals/{pending['id']}/deny").status_code == 409
    resolved = [e for e in plane.entries("approval_resolved") if e["body"]["approval_id"] == pending["id"]]
    assert [(e["body"]["status"], e["body"]["resolved_by"]) for e in resolved] == [("approved", "marc")]
    [done] = http.get("/approvals", params={"status": "approved"}).json()
    assert (done["resolved_by"], done["channel"], done["resolution_reason"]) == ("marc", "control_plane", "looks fine")


def test_deny_over_http_refuses_the_waiting_call(live: LiveServer, http: httpx.Client, plane: Plane) -> None:
    waiting = live.submit(plane.engine.settle(make_call(), NEEDS_PERSON, elicitation_supported=False))
    [pending] = wait_pending(http)
    bad = http.post(f"/approvals/{pending['id']}/deny", json={"channel": "memory"})
    assert bad.status_code == 400
    assert "channel" in bad.json()["error"]
    response = http.post(f"/approvals/{pending['id'][:6]}/deny", json={"reasoning": "not today", "channel": "cli"})
    assert response.status_code == 200, response.text
    settlement = waiting.result(scaled(10))
    assert settlement.kind is SettlementKind.DENY
    assert (settlement.resolved_by, str(settlement.channel)) == ("http:127.0.0.1", "cli")
    view = response.json()["approval"]
    assert (view["status"], view["resolution_reason"], view["strength"]) == ("denied", "not today", "operator")


APPROVAL_REFUSALS: list[tuple[str, str, int, str]] = [
    ("GET", "/approvals/0123456789abcdef", 404, "0123456789abcdef"),
    ("POST", "/approvals/0123456789abcdef/approve", 404, "0123456789abcdef"),
    ("GET", "/approvals/zzzz", 400, "not hexadecimal"),
    ("GET", "/approvals/abc", 400, "too short"),
    ("GET", "/approvals/%20abcd", 400, "holds whitespace"),  # malformed: never trimmed into another id
    ("POST", "/approvals/0123456789abcdef%0A/approve", 400, "holds whitespace"),
    ("DELETE", "/grants/%090123456789abcdef?by=marc", 400, "holds whitespace"),
    ("GET", "/approvals?status=bogus", 400, "status must be one of"),
    ("GET", "/approvals?limit=0", 400, "limit"),
    ("GET", "/approvals?tool=%5B", 400, "glob"),
    ("GET", "/approvals?foo=1", 400, 'unknown query parameter(s) "foo"; allowed: status, tool, agent, limit'),
    ("GET", "/approvals?status=pending&Status=all", 400, 'unknown query parameter(s) "Status"'),
    ("GET", "/approvals/0123456789abcdef?verbose=1", 400, 'unknown query parameter(s) "verbose"; allowed: none'),
    ("GET", "/grants?all=true&mine=1", 400, 'unknown query parameter(s) "mine"; allowed: all'),
    ("GET", "/tools?agent=claude", 400, 'unknown query parameter(s) "agent"'),
    ("DELETE", "/grants/0123456789abcdef?by=marc&force=1", 400, 'unknown query parameter(s) "force"; allowed: by'),
]


def test_approval_refusals(http: httpx.Client) -> None:
    for method, path, status, words in APPROVAL_REFUSALS:
        response = http.request(method, path)
        assert response.status_code == status, (path, response.text)
        assert words in response.json()["error"], path


# ------------------------------------------------------------------------------------------- grants


def test_grants_create_list_revoke(live: LiveServer, http: httpx.Client, plane: Plane) -> None:
    created = http.post("/grants", json={"agent": "claude", "tools": "github.*", "duration": "30m", "by": "marc"})
    assert created.status_code == 201, created.text
    grant = created.json()
    assert HEX16.fullmatch(grant["id"])
    assert (grant["agent"], grant["tools"], grant["granted_by"], grant["active"]) == ("claude", "github.*", "marc", True)
    assert 1790 <= grant["remaining_seconds"] <= 1800
    assert [g["id"] for g in http.get("/grants").json()] == [grant["id"]]

    # The grant is the one the engine consults: a human_approval call of claude on github now runs.
    settlement = live.call(plane.engine.settle(make_call(), NEEDS_PERSON, elicitation_supported=False))
    assert (settlement.kind, settlement.grant_id) == (SettlementKind.ALLOW, grant["id"])

    revoked = http.delete(f"/grants/{grant['id'][:6]}", params={"by": "marc"})
    assert revoked.status_code == 200, revoked.text
    assert (revoked.json()["status"], revoked.json()["id"]) == ("revoked", grant["id"])
    assert http.get("/grants").json() == []
    [old] = http.get("/grants", params={"all": "true"}).json()
    assert (old["id"], old["active"]) == (grant["id"], False)
    again = http.delete(f"/grants/{grant['id']}")
    assert again.status_code == 409
    assert "already revoked" in again.json()["error"]
    assert http.delete("/grants/0123456789abcdef").status_code == 404
    assert [e["body"]["grant_id"] for e in plane.entries("grant_created")] == [grant["id"]]
    assert [e["body"]["revoked_by"] for e in plane.entries("grant_revoked")] == ["marc"]


GRANT_REFUSALS: list[tuple[dict[str, Any], int, str]] = [
    ({"agent": "claude", "tools": "github.*", "duration": "48h"}, 422, "maximum"),
    ({"agent": "claude", "tools": "github.*", "duration": "30"}, 422, "missing unit"),
    ({"agent": "claude", "tools": "github.[", "duration": "30m"}, 422, "glob"),
    ({"agent": "claude", "tools": ["github.*"], "duration": "30m"}, 400, "one glob"),
    ({"tools": "github.*", "duration": "30m"}, 400, "'agent' is required"),
    ({"agent": "claude", "tools": "github.*", "duration": 30}, 400, "must be a string"),
    # No agent id and no servable tool name holds these: a grant on them would only hide what it says.
    ({"agent": "cl\x1bOaude", "tools": "github.*", "duration": "1m"}, 400, "'agent' is not a glob over agent ids"),
    ({"agent": "bad agent", "tools": "github.*", "duration": "1m"}, 400, "'agent' is not a glob over agent ids"),
    ({"agent": "claude\n", "tools": "github.*", "duration": "1m"}, 400, "'agent' is not a glob over agent ids"),
    ({"agent": "claude", "tools": "git.\u202ex\nfoo", "duration": "1m"}, 400,
     "'tools' holds a control or format character (U+202E at position 5)"),
    ({"agent": "claude", "tools": "github.*\u2028", "duration": "1m"}, 400, "'tools' holds a control or format"),
    ({"agent": "claude", "tools": " github.*", "duration": "1m"}, 400, "'tools' has leading or trailing whitespace"),
]


def test_grant_refusals_create_nothing(http: httpx.Client, plane: Plane) -> None:
    for body, status, words in GRANT_REFUSALS:
        response = http.post("/grants", json=body)
        assert response.status_code == status, (body, response.text)
        assert words in response.json()["error"], body
    twice = b'{"agent": "claude", "tools": "github.*", "duration": "24h", "duration": "1m"}'
    response = http.post("/grants", content=twice, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    assert response.json() == {"error": "the request body is not valid JSON: a JSON object in the message repeats a key"}
    assert http.get("/grants", params={"all": "true"}).json() == []
    assert plane.entries("grant_created") == []


# --------------------------------------------------------------------------------------------- auth


def test_with_a_token_configured_missing_or_wrong_tokens_are_refused(live: LiveServer, plane: Plane) -> None:
    url = live.serve(plane.app(ADMIN_SHA256))
    wrong = "dbt-admin-WRONG-0000000000000000000000"
    with httpx.Client(base_url=url, timeout=scaled(10)) as client:
        for headers in ({}, {"Authorization": f"Bearer {wrong}"}, {"Authorization": f"Basic {ADMIN_TOKEN}"},
                        {"Authorization": "Bearer"}, {"Authorization": ADMIN_TOKEN}):
            response = client.get("/policies", headers=headers)
            assert response.status_code == 401
            assert response.json() == ADMIN_REQUIRED
            assert response.headers["www-authenticate"].startswith("Bearer")
            assert wrong not in response.text and wrong not in str(response.headers)
            assert ADMIN_TOKEN not in response.text and ADMIN_TOKEN not in str(response.headers)
        # Loopback is no substitute for the token once one is configured; the right token is served.
        assert client.get("/policies", headers={"Authorization": f"bearer {ADMIN_TOKEN}"}).status_code == 200
        assert client.get("/tools", headers=AUTH).status_code == 200


@pytest.mark.anyio
@pytest.mark.parametrize(("method", "path"), ROUTES)
async def test_every_route_is_behind_the_check(plane: Plane, method: str, path: str) -> None:
    guarded = httpx.ASGITransport(app=plane.app(ADMIN_SHA256))
    async with httpx.AsyncClient(transport=guarded, base_url="http://gateway") as client:
        response = await client.request(method, path, json={})
        assert (response.status_code, response.json()) == (401, ADMIN_REQUIRED)
    # An agent with a shell on this host is a loopback caller: no token, nothing served.
    loopback = httpx.ASGITransport(app=plane.app(ADMIN_SHA256), client=("127.0.0.1", 4321))
    async with httpx.AsyncClient(transport=loopback, base_url="http://127.0.0.1:8788") as client:
        response = await client.request(method, path, json={})
        assert (response.status_code, response.json()) == (401, ADMIN_REQUIRED)


@pytest.mark.anyio
async def test_loopback_and_proxy_headers_are_no_substitute_for_the_token(plane: Plane) -> None:
    app = plane.app(ADMIN_SHA256)
    for host in ("127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1", "10.0.0.5"):
        transport = httpx.ASGITransport(app=app, client=(host, 4321))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8788") as client:
            assert (await client.get("/policies")).status_code == 401, host
            forwarded = {"X-Forwarded-For": "127.0.0.1", "Forwarded": "for=127.0.0.1"}
            assert (await client.get("/policies", headers=forwarded)).status_code == 401, host
            assert (await client.get("/policies", headers=AUTH)).status_code == 200, host


def test_a_path_no_route_serves_is_404_only_behind_the_token(live: LiveServer, plane: Plane) -> None:
    url = live.serve(plane.app(ADMIN_SHA256))
    with httpx.Client(base_url=url, timeout=scaled(10)) as client:
        for path in ("/no/such/route", "/approval", "/tools/pins/accept/x"):
            refused = client.get(path)
            assert (refused.status_code, refused.json()) == (401, ADMIN_REQUIRED), path
            assert refused.headers["www-authenticate"].startswith("Bearer")
            found = client.get(path, headers=AUTH)
            assert found.status_code == 404 and "no control-plane route" in found.json()["error"], path


def test_over_real_uvicorn_a_loopback_request_without_the_token_is_refused(live: LiveServer, plane: Plane) -> None:
    url = live.serve(plane.app(ADMIN_SHA256))
    with httpx.Client(base_url=url, timeout=scaled(10)) as client:
        assert client.get("/policies").status_code == 401
        assert client.get("/policies", headers=AUTH).status_code == 200
        two = [("Authorization", f"Bearer {ADMIN_TOKEN}"), ("Authorization", f"Bearer {ADMIN_TOKEN}")]
        assert client.get("/policies", headers=two).status_code == 401  # two credentials: which one?


def test_there_is_no_control_plane_without_a_credential(plane: Plane) -> None:
    for missing in (None, ""):
        with pytest.raises(ValueError, match="needs a credential"):
            AdminAuth(missing)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="needs a credential"):
            control_app(plane.services, admin_token_sha256=missing)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_control_routes_mounted_beside_other_routes_guard_only_themselves(plane: Plane) -> None:
    async def mcp(request: Any) -> PlainTextResponse:
        return PlainTextResponse("mcp")

    app = Starlette(routes=[Route("/mcp", mcp, methods=["POST"]),
                            *control_routes(plane.services, admin_token_sha256=ADMIN_SHA256)])
    transport = httpx.ASGITransport(app=app, client=("10.0.0.5", 1234))
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        assert (await client.post("/mcp")).text == "mcp"
        assert (await client.get("/grants")).status_code == 401
        assert (await client.get("/grants", headers=AUTH)).status_code == 200


def test_admin_digest_must_be_a_sha256_hex() -> None:
    for bad in ("", "abc", ADMIN_SHA256.upper(), ADMIN_TOKEN):
        with pytest.raises(ValueError, match="64 lowercase hex"):
            AdminAuth(bad)
