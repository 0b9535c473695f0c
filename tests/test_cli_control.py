"""The control-plane subcommands (``tools``, ``policy``, ``pins``, ``approvals``, ``grants``) run as
subprocesses against a live control plane (real uvicorn on 127.0.0.1, admin token configured).

Every run is checked for the admin token: it must never appear on stdout or stderr.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import PYTHON, child_env, eventually, scaled
from control_support import ADMIN_SHA256, ADMIN_TOKEN, NEEDS_PERSON, LiveServer, Plane, build_plane, make_call

from drawbridge.approval.channels import Channel
from drawbridge.gateway.pipeline.approvals.settlement import SettlementKind
from drawbridge.gateway.pipeline.verdicts import GATEWAY_POLICY, Action, Provenance, Verdict


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
def url(live: LiveServer, plane: Plane) -> str:
    return live.serve(plane.app(ADMIN_SHA256))


def drawbridge(
    *args: str, token: str | None = ADMIN_TOKEN, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = child_env()
    env.pop("DRAWBRIDGE_URL", None)
    env.pop("DRAWBRIDGE_ADMIN_TOKEN", None)
    if token is not None:
        env["DRAWBRIDGE_ADMIN_TOKEN"] = token
    done = subprocess.run(
        [PYTHON, "-m", "drawbridge", *args], env=env, input=stdin if stdin is not None else "",
        capture_output=True, text=True, timeout=scaled(60),
    )
    assert ADMIN_TOKEN not in done.stdout and ADMIN_TOKEN not in done.stderr, "the admin token was printed"
    return done


def ok_json(*args: str, stdin: str | None = None) -> Any:
    done = drawbridge(*args, "--format", "json", stdin=stdin)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def wait_pending(live: LiveServer, plane: Plane) -> Any:
    return eventually(lambda: live.call(plane.engine.store.list("pending")), scaled(10), "a pending approval")[0]


def test_tools_list_and_decisions(url: str) -> None:
    tools = ok_json("tools", "list", "--url", url)
    assert {t["name"]: t["classification"]["access"] for t in tools}["github.delete_repo"] == "write"
    table = drawbridge("tools", "list", "--url", url)
    assert table.returncode == 0
    assert "github.delete_repo" in table.stdout and "changed" in table.stdout

    rows = {r["name"]: r for r in ok_json("tools", "decisions", "--agent", "claude", "--url", url)}
    assert (rows["github.list_repos"]["action"], rows["github.create_issue"]["action"]) == ("human_approval", "deny")
    table = drawbridge("tools", "decisions", "--agent", "claude", "--url", url)
    assert table.returncode == 0
    assert "claude #3 (claude.yaml)" in table.stdout
    assert "allow if repo starts_with" in table.stdout
    assert "HIDDEN" in table.stdout and "REVIEW" in table.stdout  # every column is labelled

    usage = drawbridge("tools", "decisions", "--url", url)
    assert usage.returncode == 2
    assert "--agent" in usage.stderr


def test_policy_set_edits_the_file_and_is_recorded(url: str, plane: Plane) -> None:
    result = ok_json("policy", "set", "claude", "github.delete_repo", "deny", "--by", "marc", "--url", url)
    assert (result["action_before"], result["action_after"]) == ("human_approval", "deny")
    text = (plane.policy_dir / "claude.yaml").read_text()
    assert "by marc" in text and "# Claude's policy. Owner: platform team." in text
    assert plane.policy_store.evaluate("claude", "github.delete_repo").action == "deny"
    assert [e["body"]["by"] for e in plane.entries("mesh.policy_edit")] == ["marc"]

    table = drawbridge("policy", "set", "claude", "github.delete_repo", "inherit", "--by", "marc", "--url", url)
    assert table.returncode == 0, table.stderr
    assert "deny -> human_approval" in table.stdout

    missing = drawbridge("policy", "set", "nobody", "github.delete_repo", "deny", "--by", "marc", "--url", url)
    assert missing.returncode == 1
    assert "no policy is written for agent" in missing.stderr and "(HTTP 404)" in missing.stderr
    hand = drawbridge("policy", "set", "claude", "slack.post_message", "inherit", "--by", "marc", "--url", url)
    assert hand.returncode == 1
    assert "written by hand" in hand.stderr and "(HTTP 409)" in hand.stderr
    bad = drawbridge("policy", "set", "claude", "github.delete_repo", "maybe", "--by", "marc", "--url", url)
    assert bad.returncode == 2
    no_by = drawbridge("policy", "set", "claude", "github.delete_repo", "deny", "--url", url)
    assert no_by.returncode == 2
    assert len(plane.entries("mesh.policy_edit")) == 2

    policies = ok_json("policy", "list", "--url", url)
    assert [p["name"] for p in policies] == ["claude", "default"]


def test_pins_list_and_accept(url: str, plane: Plane) -> None:
    held = ok_json("pins", "list", "--url", url)
    assert sorted(t["name"] for t in held) == ["github.create_issue", "github.list_repos"]
    unbound = drawbridge("pins", "accept", "--tools", "github.list_repos", "--by", "marc", "--url", url)
    assert unbound.returncode == 2 and "--fingerprint" in unbound.stderr and "--current" in unbound.stderr
    bad = drawbridge("pins", "accept", "--fingerprint", "github.list_repos", "--url", url)
    assert bad.returncode == 2 and "TOOL=sha256" in bad.stderr
    fingerprints = [f"{t['name']}={t['current']['fingerprint']}" for t in held]
    accepted = ok_json("pins", "accept", "--fingerprint", fingerprints[0], "--fingerprint", fingerprints[1],
                       "--by", "marc", "--url", url)
    assert sorted(a["name"] for a in accepted["accepted"]) == ["github.create_issue", "github.list_repos"]
    assert sorted(e["body"]["tool"] for e in plane.entries("mesh.pin_accept")) == ["create_issue", "list_repos"]
    assert ok_json("pins", "list", "--url", url) == []
    again = drawbridge("pins", "accept", "--server", "github", "--current", "--url", url)
    assert again.returncode == 0
    assert "nothing to accept" in again.stdout

    neither = drawbridge("pins", "accept", "--url", url)
    assert neither.returncode == 2
    unknown = drawbridge("pins", "accept", "--server", "gitlab", "--current", "--url", url)
    assert unknown.returncode == 1
    assert "gitlab" in unknown.stderr and "(HTTP 404)" in unknown.stderr


def test_approvals_list_approve_and_deny_release_the_waiting_call(live: LiveServer, url: str, plane: Plane) -> None:
    waiting = live.submit(plane.engine.settle(make_call(), NEEDS_PERSON, elicitation_supported=False))
    pending = wait_pending(live, plane)
    [listed] = ok_json("approvals", "list", "--url", url)
    assert (listed["id"], listed["tool"]) == (pending.id, "github.delete_repo")
    table = drawbridge("approvals", "list", "--url", url)
    assert pending.short_id in table.stdout and "github.delete_repo" in table.stdout
    shown = drawbridge("approvals", "show", pending.short_id, "--url", url)
    assert shown.returncode == 0 and pending.id in shown.stdout

    done = drawbridge("approvals", "approve", pending.short_id, "--by", "marc", "--reason", "ok", "--url", url)
    assert done.returncode == 0, done.stderr
    assert f"approved {pending.id}" in done.stdout
    settlement = waiting.result(scaled(10))
    assert settlement.kind is SettlementKind.ALLOW
    assert (settlement.resolved_by, str(settlement.channel)) == ("marc", "cli")

    again = drawbridge("approvals", "deny", pending.id, "--url", url)
    assert again.returncode == 1
    assert "already resolved" in again.stderr and "(HTTP 409)" in again.stderr
    unknown = drawbridge("approvals", "approve", "0123456789abcdef", "--url", url)
    assert unknown.returncode == 1 and "(HTTP 404)" in unknown.stderr
    malformed = drawbridge("approvals", "approve", "xyz!", "--url", url)
    assert malformed.returncode == 2 and "not hexadecimal" in malformed.stderr  # refused before it is sent

    waiting = live.submit(plane.engine.settle(make_call(request_id=2), NEEDS_PERSON, elicitation_supported=False))
    second = wait_pending(live, plane)
    denied = drawbridge("approvals", "deny", second.id, "--url", url)
    assert denied.returncode == 0, denied.stderr
    assert waiting.result(scaled(10)).kind is SettlementKind.DENY


def test_approvals_list_and_show_keep_a_resolved_by_or_reason_on_its_own_line(
    live: LiveServer, url: str, plane: Plane
) -> None:
    waiting = live.submit(plane.engine.settle(make_call(), NEEDS_PERSON, elicitation_supported=False))
    pending = wait_pending(live, plane)
    by, reason = "marc\n| fake | row |\tx", "ok\nFORGED reason line\x1b[2J\u202egnp.exe"
    # The control plane refuses such a name; one that reached the store through a channel of the
    # gateway's own (a prompt on its terminal) is recorded as given, and only the display escapes it.
    refused = drawbridge("approvals", "approve", pending.short_id, "--by", by, "--url", url)
    assert refused.returncode == 2 and "(HTTP 400)" in refused.stderr
    live.call(plane.engine.resolve(pending.id, "approved", by, Channel.TTY, reason))
    assert waiting.result(scaled(10)).resolved_by == by
    listed = drawbridge("approvals", "list", "--status", "approved", "--url", url)
    shown = drawbridge("approvals", "show", pending.short_id, "--url", url)
    for printed in (listed, shown):
        assert printed.returncode == 0, printed.stderr
        # Each character shown as the console shows it: a visible escape, not U+FFFD for any of them.
        assert "marc\\n| fake | row |\\tx" in printed.stdout, printed.stdout
        assert not any(line.lstrip("│| ").startswith(("| fake", "fake")) for line in printed.stdout.splitlines())
        assert "\x1b" not in printed.stdout and "\t" not in printed.stdout and "\u202e" not in printed.stdout
    assert "ok\\nFORGED reason line\\u001b[2J\\u202egnp.exe" in shown.stdout, shown.stdout
    assert "who may approve" in shown.stdout and "approved by" not in shown.stdout  # who MAY, not who did


def test_a_name_with_a_control_or_format_character_is_refused_and_an_empty_id_is_a_usage_error(
    live: LiveServer, url: str, plane: Plane
) -> None:
    waiting = live.submit(plane.engine.settle(make_call(), NEEDS_PERSON, elicitation_supported=False))
    pending = wait_pending(live, plane)
    for name, shown in (("marc\u202egro.live", "U+202E at position 5"), ("ops\x1b[2J", "U+001B at position 4")):
        refused = drawbridge("approvals", "approve", pending.short_id, "--by", name, "--url", url)
        assert refused.returncode == 2 and "(HTTP 400)" in refused.stderr, refused.stderr
        assert f"'resolved_by' holds a control or format character ({shown})" in refused.stderr
    grant = drawbridge("grants", "create", "--agent", "claude", "--tools", "github.*", "--for", "30m",
                       "--by", "marc\u2066x", "--url", url)
    assert grant.returncode == 2 and "'by' holds a control or format character (U+2066" in grant.stderr
    for agent, tools in (("cl\x1bOaude", "git.*"), ("bad agent", "git.*"), ("claude", "git.\u202ex\nfoo")):
        glob = drawbridge("grants", "create", "--agent", agent, "--tools", tools, "--for", "1m", "--url", url)
        assert glob.returncode == 2 and "(HTTP 400)" in glob.stderr, glob.stderr
        assert "\x1b" not in glob.stderr + glob.stdout and "\u202e" not in glob.stderr + glob.stdout
    edit = drawbridge("policy", "set", "claude", "github.delete_repo", "deny", "--by", "marc\u200b", "--url", url)
    assert edit.returncode == 2 and "'by' holds a control or format character (U+200B" in edit.stderr, edit.stderr
    empty = drawbridge("approvals", "deny", "", "--url", url)
    assert empty.returncode == 2 and "the approval id is empty" in empty.stderr and "HTTP" not in empty.stderr
    for not_an_id, why in ((pending.short_id + " ", "holds whitespace"), ("../../grants", "not hexadecimal")):
        refused = drawbridge("approvals", "approve", not_an_id, "--url", url)
        assert refused.returncode == 2 and why in refused.stderr, refused.stderr
        assert "HTTP" not in refused.stderr
    assert live.call(plane.engine.store.get(pending.id)).pending and plane.entries("grant_created") == []
    done = drawbridge("approvals", "deny", pending.short_id, "--by", "marc", "--url", url)
    assert done.returncode == 0, done.stderr
    assert waiting.result(scaled(10)).kind is SettlementKind.DENY


def test_approvals_watch_asks_and_approves(live: LiveServer, url: str, plane: Plane) -> None:
    waiting = live.submit(plane.engine.settle(make_call(), NEEDS_PERSON, elicitation_supported=False))
    pending = wait_pending(live, plane)
    closed = drawbridge("approvals", "watch", "--url", url, stdin="")
    assert closed.returncode == 0, closed.stderr
    assert "input closed; stopped watching" in closed.stdout
    assert not waiting.done()
    done = drawbridge("approvals", "watch", "--once", "--by", "ana", "--url", url, stdin="a\n")
    assert done.returncode == 0, done.stderr
    assert "[a]pprove / [d]eny / [s]kip ?" in done.stdout
    assert f"approved {pending.id}" in done.stdout
    settlement = waiting.result(scaled(10))
    assert (settlement.kind, settlement.resolved_by) == (SettlementKind.ALLOW, "ana")


def test_grants_create_list_revoke(url: str, plane: Plane) -> None:
    grant = ok_json("grants", "create", "--agent", "claude", "--tools", "github.*", "--for", "30m", "--by", "marc",
                    "--url", url)
    assert (grant["agent"], grant["tools"], grant["granted_by"]) == ("claude", "github.*", "marc")
    assert [g["id"] for g in ok_json("grants", "list", "--url", url)] == [grant["id"]]
    revoked = drawbridge("grants", "revoke", grant["id"][:8], "--url", url)
    assert revoked.returncode == 0, revoked.stderr
    assert f"revoked {grant['id']}" in revoked.stdout
    assert ok_json("grants", "list", "--url", url) == []
    again = drawbridge("grants", "revoke", grant["id"], "--url", url)
    assert again.returncode == 1 and "already revoked" in again.stderr

    typo = drawbridge("grants", "create", "--agent", "claude", "--tools", "github.*", "--for", "30", "--url", url)
    assert typo.returncode == 2 and "missing unit" in typo.stderr
    # The spelling it suggests is one the gateway accepts (86400m would be 60 days, over its 24h).
    seconds = drawbridge("grants", "create", "--agent", "claude", "--tools", "github.*", "--for", "86400", "--url", url)
    assert seconds.returncode == 2 and "(e.g. 86400s)" in seconds.stderr, seconds.stderr
    too_long = drawbridge("grants", "create", "--agent", "claude", "--tools", "github.*", "--for", "48h", "--url", url)
    assert too_long.returncode == 2, too_long.stderr  # the gateway's 24 h bound, checked before any request
    assert "above the maximum of 24h" in too_long.stderr and "HTTP" not in too_long.stderr
    assert len(plane.entries("grant_created")) == 1


def test_wrong_missing_token_and_unreachable_gateway(url: str) -> None:
    wrong = "dbt-admin-WRONG-0000000000000000000000"
    refused = drawbridge("tools", "list", "--url", url, token=wrong)
    assert refused.returncode == 1
    assert "control plane requires admin authorization" in refused.stderr
    assert "DRAWBRIDGE_ADMIN_TOKEN was refused" in refused.stderr
    assert wrong not in refused.stderr and wrong not in refused.stdout

    missing = drawbridge("approvals", "list", "--url", url, token=None)
    assert missing.returncode == 1
    assert "set DRAWBRIDGE_ADMIN_TOKEN" in missing.stderr

    unsafe = drawbridge("tools", "list", "--url", url, token="two words")
    assert unsafe.returncode == 2
    assert "two words" not in unsafe.stderr

    closed = url.rsplit(":", 1)[0] + ":1"
    unreachable = drawbridge("grants", "list", "--url", closed)
    assert unreachable.returncode == 2
    assert "cannot reach the drawbridge control plane" in unreachable.stderr


def test_policy_set_decides_every_call_and_keeps_hand_written_rules(url: str, plane: Plane) -> None:
    path = plane.policy_dir / "claude.yaml"
    original = path.read_text()
    # A conditional rule for the tool came first: the edit goes before it, so that every call gets
    # the action the answer reports (first match wins), and the answer tells the paths before/after.
    result = ok_json("policy", "set", "claude", "github.add_deploy_key", "deny", "--by", "marc", "--url", url)
    assert (result["action_before"], result["action_after"], result["placement"]) == (
        "human_approval", "deny", "before_conditional_rule")
    assert [c["action"] for c in result["before"]["conditional"]] == ["allow"]
    assert result["after"]["conditional"] == []
    assert plane.policy_store.evaluate("claude", "github.add_deploy_key", {"repo": "staging-x"}).action == "deny"
    back = drawbridge("policy", "set", "claude", "github.add_deploy_key", "inherit", "--by", "marc", "--url", url)
    assert back.returncode == 0, back.stderr
    assert "allow if repo starts_with (claude #1)" in back.stdout
    assert path.read_text() == original

    # A hand-written rule is never rewritten: the console rule stands before it, and inherit
    # removes only that, so the hand-written rule decides again.
    result = ok_json("policy", "set", "claude", "slack.post_message", "allow", "--by", "marc", "--url", url)
    assert (result["action_before"], result["action_after"]) == ("deny", "allow")
    assert "  # never post to chat as claude (hand-written)\n  - tools: [\"slack.post_message\"]\n    action: deny\n" \
        in path.read_text()
    result = ok_json("policy", "set", "claude", "slack.post_message", "inherit", "--by", "marc", "--url", url)
    assert (result["action_before"], result["action_after"]) == ("allow", "deny")
    assert path.read_text() == original


def test_policy_set_refuses_a_tool_the_gateway_does_not_serve_and_a_line_break(url: str, plane: Plane) -> None:
    path = plane.policy_dir / "claude.yaml"
    original = path.read_text()
    for tool in ("nonexistent.tool", 'github.list_repos"]'):
        done = drawbridge("policy", "set", "claude", tool, "allow", "--by", "marc", "--url", url)
        assert done.returncode == 1, done.stderr
        assert "the gateway serves no tool named" in done.stderr and "(HTTP 404)" in done.stderr
    assert path.read_text() == original
    written = ok_json("policy", "set", "claude", "later.tool", "deny", "--by", "marc", "--unserved", "--url", url)
    assert written["action_after"] == "deny"
    assert ok_json("policy", "set", "claude", "later.tool", "inherit", "--by", "marc", "--url", url)["changed"]
    assert path.read_text() == original

    for tool in ("github.list_repos\nx", "github.list_repos\tx"):
        done = drawbridge("policy", "set", "claude", tool, "deny", "--by", "marc", "--url", url)
        assert done.returncode == 2, done.stderr
        assert "contains a control or format character" in done.stderr
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    for encoded in ("%0A", "%0D", "%09"):
        answer = httpx.put(f"{url}/policies/claude/tools/github.list_repos{encoded}x",
                           json={"action": "deny", "by": "marc"}, headers=headers)
        assert answer.status_code == 400, answer.text
        assert answer.json() == {"error": "the tool name contains a control character or a line break"}
    assert path.read_text() == original

    # A glob character is refused before the served tools are looked up (400, not "send unserved"),
    # and the names are shown as written: `git.*` and the literal `git.\*`, not a JSON-escaped "git.\\*".
    for extra in ((), ("--unserved",)):
        done = drawbridge("policy", "set", "claude", "git.*", "allow", "--by", "marc", *extra, "--url", url)
        assert done.returncode == 2 and "(HTTP 400)" in done.stderr, done.stderr
        assert "the tool name `git.*` holds glob characters" in done.stderr
        assert "the tool literally named `git.\\*`," in done.stderr and "\\\\" not in done.stderr
        assert "unserved" not in done.stderr
    assert path.read_text() == original


def test_approvals_show_names_what_held_a_call_no_rule_asked_for(live: LiveServer, url: str, plane: Plane) -> None:
    floor = Verdict(
        Action.HUMAN_APPROVAL,
        "catalogue floor on github.list_repos: its definition changed since it was pinned",
        Provenance(GATEWAY_POLICY), person_only=True,
    )
    waiting = live.submit(plane.engine.settle(make_call("github.list_repos"), floor, elicitation_supported=False))
    pending = wait_pending(live, plane)
    shown = drawbridge("approvals", "show", pending.short_id, "--url", url)
    assert shown.returncode == 0, shown.stderr
    assert "None" not in shown.stdout, shown.stdout
    assert "none: held by the gateway (drawbridge), see why" in shown.stdout
    assert "catalogue floor on" in shown.stdout
    assert drawbridge("approvals", "deny", pending.id, "--url", url).returncode == 0
    assert waiting.result(scaled(10)).kind is SettlementKind.DENY


def test_an_impossible_agent_id_and_a_url_with_credentials_are_refused(url: str) -> None:
    for agent in ("a\nb", "a b", "a\tb"):
        done = drawbridge("tools", "decisions", "--agent", agent, "--url", url)
        assert done.returncode == 2, done.stdout
        assert "is not an agent id" in done.stderr and "(HTTP 400)" in done.stderr
    assert ok_json("tools", "decisions", "--agent", "*", "--url", url)

    host = url.removeprefix("http://")
    for bad, problem in [
        (f"http://user:pass-SECRETU@{host}", "must not hold a user name or password"),
        (f"http://{host}/?token=SECRETU", "must not have a query or a fragment"),
        (f"http://{host}/#SECRETU", "must not have a query or a fragment"),
        ("ftp://SECRETU@example.org", "must be an http:// or https:// URL with a host"),
        (f"http://{host}/sub", "must not have a path"),
        (f"http://{host}/SECRETU/", "must not have a path"),
    ]:
        done = drawbridge("tools", "list", "--url", bad)
        assert done.returncode == 2, done.stderr
        assert problem in done.stderr and "refused" not in done.stderr
        assert "SECRETU" not in done.stderr + done.stdout


def test_a_url_whose_host_cannot_be_looked_up_or_padded_is_refused_up_front() -> None:
    long_label = "a" * 64
    for command in (("approvals", "list"), ("console", "--no-open"), ("grants", "list")):
        for bad in ("http://a..b:1", f"http://{long_label}.example:1", f"http://SECRETU:x@{long_label}.example:1"):
            done = drawbridge(*command, "--url", bad)
            assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
            assert "has a host name that cannot be looked up" in done.stderr or "user name" in done.stderr
            assert "SECRETU" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    env = child_env()
    env["DRAWBRIDGE_URL"] = " http://127.0.0.1:1"
    padded = subprocess.run([PYTHON, "-m", "drawbridge", "approvals", "list"], env=env, capture_output=True, text=True,
                            timeout=scaled(60))
    assert padded.returncode == 2 and "begins or ends with whitespace" in padded.stderr, padded.stderr


def test_watch_interval_is_bounded() -> None:
    done = drawbridge("approvals", "watch", "--interval", "1e300", "--url", "http://127.0.0.1:1")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "1e+300 is not in the range 0.2<=x<=3600" in done.stderr


def test_empty_and_dot_ids_and_impossible_agents_are_refused_before_any_request(tmp_path: Path) -> None:
    closed = "http://127.0.0.1:1"  # nothing answers there: a request sent would say "cannot reach"
    refused = [
        (("grants", "revoke", ""), "the grant id is empty"),
        (("grants", "revoke", "."), "grant id '.' is not hexadecimal"),
        (("grants", "revoke", ".."), "grant id '..' is not hexadecimal"),
        (("policy", "set", "..", "..", "allow", "--by", "me"), "AGENT '..' is not an agent id"),
        (("policy", "set", ".", "echo", "allow", "--by", "me"), "AGENT '.' is not an agent id"),
        (("policy", "set", "", "echo", "allow", "--by", "me"), "AGENT '' is not an agent id"),
        (("policy", "set", "bad agent", "echo", "allow", "--by", "me"), "AGENT 'bad agent' is not an agent id"),
        (("policy", "set", "claude", "..", "allow", "--by", "me"), "TOOL: tool name is a dot segment"),
        (("policy", "set", "claude", "", "allow", "--by", "me"), "TOOL: tool name is empty"),
    ]
    for args, problem in refused:
        done = drawbridge(*args, "--url", closed)
        assert done.returncode == 2 and problem in done.stderr, (args, done.stderr)
        assert "cannot reach" not in done.stderr, args
    policy = tmp_path / "p.yaml"
    policy.write_text("name: p\nagent: '*'\nrules:\n  - tools: ['*']\n    action: allow\n")
    for agent in ("a b", ""):
        explained = drawbridge("policy", "explain", "echo", "--agent", agent, "--policy", str(policy))
        assert explained.returncode == 2 and "an agent id uses only" in explained.stderr, explained.stderr
        assert "action:" not in explained.stdout
    listed = drawbridge("approvals", "list", "--agent", "a b", "--url", closed)
    assert listed.returncode == 2 and "an agent id uses only" in listed.stderr and "cannot reach" not in listed.stderr
    drafted = drawbridge("discover", "--generate-policy", "--agent", "bad agent", "--openapi", str(tmp_path / "x.json"))
    assert drafted.returncode == 2 and "is not an agent glob a policy accepts" in drafted.stderr, drafted.stderr


def test_messages_say_what_to_do(tmp_path: Path) -> None:
    from serve_support import GITHUB, write_config

    config = write_config(tmp_path, [GITHUB], auth={"admin": {"token_sha256": ADMIN_SHA256}})
    hashed = drawbridge("tools", "list", "--config", str(config), "--url", "http://127.0.0.1:1", token=None)
    assert hashed.returncode == 2, hashed.stderr
    assert "names the admin token, only by its hash (token_sha256), which cannot be sent" in hashed.stderr
    assert "no variable does not" not in hashed.stderr and "--config" not in hashed.stderr.split(":", 2)[-1]
    table = tmp_path / "t.yaml"
    table.write_text("cases:\n  - {agent: a, tool: echo, expect: allow}\n")
    untabled = drawbridge("policy", "test", str(table))
    assert untabled.returncode == 2 and "the table has no `policy:` key" in untabled.stderr, untabled.stderr
    assert "--config" not in untabled.stderr
    long = drawbridge("grants", "create", "--agent", "a", "--tools", "x.*", "--for", "25h", "--url", "http://127.0.0.1:1")
    assert long.returncode == 2 and "duration 25h is above the maximum of 24h" in long.stderr, long.stderr
