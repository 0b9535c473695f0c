"""CLI upstreams behind ``drawbridge serve``: real binaries (git, ls, date, sleep, timeout, printenv) run
for calls decided by the one pipeline. No shell, refused metacharacters and flags, a capped output that
says so, a timeout that kills the whole process group, the declared-command rule, and the dispatcher
floor that no allow rule and no grant relaxes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest
from approval_support import answered_by_operator, cli, decisions, text_of, trace
from conftest import scaled
from serve_support import http_client, http_gateway, write_config

pytestmark = pytest.mark.anyio

ALLOW_ALL = {"allow.yaml": "name: allow-all\nagent: '*'\nrules:\n  - tools: ['*']\n    action: allow\n"}
MARK = "4242.125"
"""The argument of the sleep a timed-out call leaves behind if its group is not killed."""
ESCAPED = ("4242.250", "4242.375")
"""The arguments of the sleeps a program starts in sessions of their own (``setsid``)."""
ESCAPING = """#!/bin/sh
# Starts two sleeps that leave the process group (setsid), then exits or, given `wait`, outlives its timeout.
setsid sleep "$1" >/dev/null 2>&1 </dev/null &
setsid sh -c "sleep $2" >/dev/null 2>&1 </dev/null &
echo started
if [ "$3" = wait ]; then sleep 30; fi
"""


def _git(repo: Path, *args: str) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@e"}
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, env=env)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("repo")
    _git(path, "init", "-q", "-b", "main")
    (path / "a.txt").write_text("a\n")
    _git(path, "add", "a.txt")
    _git(path, "commit", "-q", "-m", "first commit")
    (path / "b.txt").write_text("b\n")
    _git(path, "add", "b.txt")
    _git(path, "commit", "-q", "-m", "second commit")
    return path


def cli_tools(repo: Path, listing: Path, escaping: Path) -> list[dict[str, Any]]:
    return [
        {"name": "git", "bin": "git", "working_dir": str(repo),
         "commands": {"log": {"allowed_args": ["--oneline", "-n", "--format"]}, "status": None}},
        {"name": "vault", "bin": "git", "working_dir": str(repo), "default_action": "deny",
         "commands": {"status": None}},
        {"name": "ls", "bin": "ls", "bare": {"allowed_args": ["-1", "-a"]}, "max_output_bytes": 64,
         "working_dir": str(listing)},
        {"name": "date", "bin": "date", "bare": {}},
        {"name": "sleep", "bin": "sleep", "bare": {"timeout": "1s"}},
        {"name": "slow", "bin": "timeout", "bare": {"timeout": 1}},
        {"name": "env", "bin": "printenv", "bare": {}, "env": {"GREETING": "hello"}},
        {"name": "escape", "bin": str(escaping), "bare": {"timeout": "1s"}},
    ]


@pytest.fixture
def config(tmp_path: Path, repo: Path) -> Path:
    listing = tmp_path / "listing"
    listing.mkdir()
    for index in range(40):
        (listing / f"file-{index:02d}.txt").write_text("x")
    escaping = tmp_path / "escaping"
    escaping.write_text(ESCAPING)
    escaping.chmod(0o755)
    return write_config(
        tmp_path, [], policies=ALLOW_ALL, cli_tools=cli_tools(repo, listing, escaping),
        evidence_dir=str(tmp_path / "evidence"), state_path=str(tmp_path / "state.db"),
        auth={"anonymous_agent": "guest"}, approval={"timeout_seconds": 30, "elicitation": False},
        hide_denied_tools=True,
    )


def _structured(result: types.CallToolResult) -> dict[str, Any]:
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def _texts(result: types.CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))


def _processes_with(token: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if token.encode() in cmdline.split(b"\0"):
                found.append(int(entry))
    return found


@pytest.fixture
def gateway(config: Path) -> Iterator[Any]:
    with http_gateway(config, env={"DRAWBRIDGE_TEST_SECRET": "s3cret", "SOME_TOKEN": "t0ken"}) as running:
        yield running


async def test_declared_commands_run_real_binaries_without_a_shell(gateway: Any, tmp_path: Path) -> None:
    async with http_client(gateway.url) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        # vault.__dispatch is left out: its deny floor leaves every path through the policy at deny.
        assert names == {"git.log", "git.status", "git.__dispatch", "vault.status", "ls.run",
                         "date.run", "sleep.run", "slow.run", "env.run", "escape.run"}
        log = await client.call_tool("git.log", {"flags": {"n": 1, "oneline": True}})
        assert not log.is_error and "second commit" in text_of(log) and "first commit" not in text_of(log)
        assert _structured(log)["exit_code"] == 0
        year = await client.call_tool("date.run", {"args": ["-u", "-d", "@0", "+%Y"]})
        assert text_of(year).strip() == "1970"
        # The child's environment: PATH, HOME, LANG and the entry's env; nothing of the gateway's.
        env = await client.call_tool("env.run", {})
        names_seen = {line.split("=", 1)[0] for line in text_of(env).splitlines()}
        assert names_seen <= {"PATH", "HOME", "LANG", "GREETING"} and "GREETING=hello" in text_of(env)
        assert "s3cret" not in text_of(env) and "t0ken" not in text_of(env)
        # stdin is data, not an argument: no shell reads it.
        stdin = await client.call_tool("ls.run", {"args": ["-1", "file-00.txt"], "stdin": "$(id); rm -rf /"})
        assert not stdin.is_error and text_of(stdin).strip() == "file-00.txt"


async def test_refused_arguments_never_run(gateway: Any, tmp_path: Path) -> None:
    async with http_client(gateway.url) as client:
        for arguments, said in [
            ({"args": ["--stat"]}, "the flag --stat is not allowed here"),
            ({"args": ["--output=/tmp/x"]}, "the flag --output is not allowed here"),
            ({"flags": {"format": "--output=/tmp/x"}}, "the flag --output is not allowed here"),
            ({"args": ["HEAD; touch pwned"]}, "metacharacter ';'"),
            ({"args": ["$(touch pwned)"]}, "metacharacter '$('"),
            ({"args": ["a|b"]}, "metacharacter '|'"),
            ({"args": ["a\nb"]}, "a line break"),
            ({"args": [1]}, "input schema"),
        ]:
            refused = await client.call_tool("git.log", arguments)
            assert refused.is_error and said in text_of(refused), (arguments, text_of(refused))
            assert refused.structured_content is None  # nothing ran: no exit code
        allowed = await client.call_tool("git.log", {"args": ["--format=%s", "-n", "1"]})
        assert not allowed.is_error and text_of(allowed).strip() == "second commit"
        bare = await client.call_tool("ls.run", {"args": ["-l"]})
        assert bare.is_error and "the flag -l is not allowed here" in text_of(bare)
    assert not (tmp_path / "pwned").exists()


async def test_a_declared_command_runs_exactly_its_subcommand(gateway: Any) -> None:
    async with http_client(gateway.url) as client:
        # mesh7 ran the subcommand named by a `command` argument; here the argument is refused.
        named = await client.call_tool("git.status", {"command": "log"})
        assert named.is_error and "'additionalProperties' fails at the top level" in text_of(named)
        assert "second commit" not in _texts(named)
        status = await client.call_tool("git.status", {"args": ["--short"]})
        assert not status.is_error and "second commit" not in text_of(status)


async def test_output_is_capped_with_a_marker_and_a_failure_is_a_result(gateway: Any) -> None:
    async with http_client(gateway.url) as client:
        listed = await client.call_tool("ls.run", {"args": ["-1"]})
        assert not listed.is_error
        text = text_of(listed)
        assert text.startswith("file-00.txt\nfile-01.txt\n")
        assert "[drawbridge: stdout cut at 64 bytes (max_output_bytes); 416 more bytes were not shown]" in text
        assert _structured(listed)["stdout_truncated"] is True
        missing = await client.call_tool("ls.run", {"args": ["nofile"]})
        assert missing.is_error and text_of(missing) == "exit status 2"
        assert "cannot access" in _texts(missing) and _structured(missing)["exit_code"] == 2


async def test_the_timeout_kills_the_whole_process_group(gateway: Any) -> None:
    async with http_client(gateway.url) as client:
        with anyio.fail_after(scaled(30)):
            slept = await client.call_tool("sleep.run", {"args": ["30"]})
        assert slept.is_error and text_of(slept) == "timed out after 1 seconds; the process group was killed"
        assert _structured(slept)["timed_out"] is True
        # `timeout 60 sleep ...` runs sleep as a child of its own: killing only the program started
        # would leave that sleep running.
        with anyio.fail_after(scaled(30)):
            nested = await client.call_tool("slow.run", {"args": ["60", "sleep", MARK]})
        assert nested.is_error and "timed out" in text_of(nested)
        assert _processes_with(MARK) == []


@pytest.fixture
def escaped_sleeps() -> Iterator[None]:
    """Kill what a failed test left behind, so a sleep that escaped does not outlive the test either."""
    yield
    for pid in _processes_with(ESCAPED[0]) + _processes_with(ESCAPED[1]):
        os.kill(pid, 9)


@pytest.mark.skipif(sys.platform != "linux", reason="the subreaper that finds setsid'd processes is Linux-only")
async def test_a_process_that_left_the_group_does_not_outlive_the_call(gateway: Any, escaped_sleeps: None) -> None:
    async with http_client(gateway.url) as client:
        for mode in ("exit", "wait"):  # the program exits at once; the program outlives its timeout
            with anyio.fail_after(scaled(30)):
                ran = await client.call_tool("escape.run", {"args": [*ESCAPED, mode]})
            assert text_of(ran).strip() == "started" or "timed out" in text_of(ran)
            assert _structured(ran)["timed_out"] is (mode == "wait")
            assert _processes_with(ESCAPED[0]) == [] and _processes_with(f"sleep {ESCAPED[1]}") == []


async def _approved(client: Any, http: httpx.AsyncClient, tool: str, arguments: dict[str, Any]) -> types.CallToolResult:
    return await answered_by_operator(client, http, tool, arguments, "approve")


async def _denied(client: Any, http: httpx.AsyncClient, tool: str, arguments: dict[str, Any]) -> types.CallToolResult:
    return await answered_by_operator(client, http, tool, arguments, "deny")


async def test_the_dispatcher_floor_holds_against_an_allow_policy(gateway: Any) -> None:
    base = gateway.control()
    async with http_client(gateway.url) as client, httpx.AsyncClient(
        base_url=base, trust_env=False, headers=gateway.control_headers()
    ) as http:
        # The policy allows everything; the dispatcher's floor still asks a person.
        ran = await _approved(client, http, "git.__dispatch", {"command": "log", "args": ["--format=%s"], "flags": {"n": 1}})
        assert not ran.is_error and text_of(ran).strip() == "second commit"
        # A dispatched subcommand that is declared keeps its allowed flags; an option is no subcommand.
        # Both are refused before anyone is asked: approving them would only have them refused.
        with anyio.fail_after(scaled(20)):  # no approval is waited for
            stat = await client.call_tool("git.__dispatch", {"command": "log", "args": ["--stat"]})
            option = await client.call_tool("git.__dispatch", {"command": "--exec-path=/tmp"})
        assert stat.is_error and "the flag --stat is not allowed here" in text_of(stat)
        assert option.is_error and "the subcommand must be one plain word" in text_of(option)
        assert (await http.get("/approvals", params={"status": "pending"})).json() == []
        rows = {r["name"]: r for r in (await http.get("/tools/decisions", params={"agent": "guest"})).json()}
        tools = {t["name"]: t for t in (await http.get("/tools")).json()}
    dispatch = rows["git.__dispatch"]
    assert (dispatch["policy_action"], dispatch["action"], dispatch["by_floor"]) == ("allow", "human_approval", True)
    assert dispatch["dispatcher"] is True and rows["git.log"]["action"] == "allow"
    assert tools["git.__dispatch"]["source"] == "cli" and tools["git.__dispatch"]["server"] == "git"
    assert tools["git.__dispatch"]["classification"]["family"] == "generic"
    assert "CLI dispatcher" in tools["git.__dispatch"]["classification"]["reasons"]
    kinds = [e["kind"] for e in trace(gateway.config.parent / "evidence") if e["kind"].startswith("approval_")]
    assert kinds == ["approval_requested", "approval_resolved"]
    refused = [d for d in decisions(gateway.config.parent / "evidence", "git.__dispatch") if d["action"] == "deny"]
    assert [(d["outcome"], d["policy"]) for d in refused] == [("refused", "drawbridge")] * 2
    assert all("/tmp" not in d["reason"] for d in refused)
    listing = cli("tools", "list", "--url", base, "--token-file", str(gateway.token_file), env={"COLUMNS": "250"})
    row = next(line for line in listing.stdout.splitlines() if "git.__dispatch" in line)
    assert "generic" in row and "cli git" in row


async def test_a_deny_floor_is_lifted_by_no_grant(gateway: Any) -> None:
    base = gateway.control()
    async with http_client(gateway.url) as client, httpx.AsyncClient(
        base_url=base, trust_env=False, headers=gateway.control_headers()
    ) as http:
        grant = await http.post("/grants", json={"agent": "guest", "tools": "vault.*", "duration": "5m"})
        assert grant.status_code == 201
        denied = await client.call_tool("vault.__dispatch", {"command": "status"})
        assert denied.is_error and "catalogue floor" in text_of(denied)
        assert "CLI dispatcher whose default_action is deny" in text_of(denied)
        assert (await http.get("/approvals", params={"status": "pending"})).json() == []
        declared = await client.call_tool("vault.status", {})
        assert not declared.is_error  # the floor belongs to the dispatcher, not to declared commands
        rows = {r["name"]: r for r in (await http.get("/tools/decisions", params={"agent": "guest"})).json()}
    assert rows["vault.__dispatch"]["action"] == "deny" and rows["vault.__dispatch"]["policy_action"] == "allow"
    assert rows["vault.__dispatch"]["floor"]["reasons"] == ["CLI dispatcher whose default_action is deny"]
    assert rows["vault.__dispatch"]["hidden"] is True and rows["git.__dispatch"]["hidden"] is False



async def test_the_draft_never_allows_a_command_whose_flags_are_free(tmp_path: Path, repo: Path) -> None:
    """``git show --output=FILE`` writes a file and ``git fetch --upload-pack=CMD`` runs a program: a
    command without ``allowed_args`` is generic, so discover, the draft it writes, ``GET /tools`` and
    ``GET /tools/decisions`` all say so, and under serve with that draft the calls wait for a person
    (approval memory included)."""
    commands = {"show": {}, "fetch": {}, "describe": {}, "log": {"allowed_args": ["--oneline", "-n"]}}
    config = write_config(
        tmp_path, [], policies={}, cli_tools=[{"name": "gitcli", "bin": "git", "working_dir": str(repo),
                                               "commands": commands}],
        evidence_dir=str(tmp_path / "evidence"), state_path=str(tmp_path / "state.db"),
        auth={"anonymous_agent": "guest"},
        approval={"timeout_seconds": 30, "elicitation": False, "memory": {"min_approvals": 1}},
    )
    found = cli("discover", "--config", str(config), "--generate-policy", "--format", "json")
    assert found.returncode == 0, found.stderr
    report = json.loads(found.stdout)
    (tmp_path / "policies" / "draft.yaml").write_text(report["policy"], encoding="utf-8")
    discovered = {t["name"]: t["classification"] for t in report["tools"]}
    for name in ("gitcli.show", "gitcli.fetch", "gitcli.describe"):
        assert discovered[name]["family"] == "generic", name
        assert discovered[name]["reasons"][0] == "CLI command without allowed_args"
    assert discovered["gitcli.fetch"]["access"] == "write"  # fetching stores what it brought
    assert discovered["gitcli.log"]["family"] == "named"  # its flags are listed
    written, touched = tmp_path / "written", tmp_path / "touched"
    with http_gateway(config) as gateway:
        async with http_client(gateway.url) as client, httpx.AsyncClient(
            base_url=gateway.control(), trust_env=False, headers=gateway.control_headers()
        ) as http:
            show = await _denied(client, http, "gitcli.show", {"args": [f"--output={written}", "HEAD"]})
            fetch = await _denied(client, http, "gitcli.fetch", {"args": [f"--upload-pack=touch {touched} #", "."]})
            # Approval memory never answers for a generic tool: one approval of a shape is not the next.
            described = await _approved(client, http, "gitcli.describe", {"args": ["--always"]})
            assert not described.is_error
            again = await _denied(client, http, "gitcli.describe", {"args": ["--always", "--dirty"]})
            assert again.is_error
            tools = {t["name"]: t["classification"] for t in (await http.get("/tools")).json()}
            rows = {r["name"]: r for r in (await http.get("/tools/decisions", params={"agent": "guest"})).json()}
    assert show.is_error and fetch.is_error
    assert not written.exists() and not touched.exists()
    assert tools == discovered
    for name in ("gitcli.show", "gitcli.fetch", "gitcli.describe", "gitcli.log"):
        assert (rows[name]["policy_action"], rows[name]["action"]) == ("human_approval", "human_approval"), name


def test_an_argument_check_that_raises_denies_the_call() -> None:
    """The route's check of what its upstream could run fails closed: a deny naming the exception's
    type, never the call forwarded and never the exception's text (it may quote an argument)."""
    from drawbridge.gateway.pipeline.floors import Route, refused_arguments
    from drawbridge.policy.model import Action

    def broken(arguments: Any) -> str | None:
        raise KeyError(f"no {arguments['command']}")

    verdict = refused_arguments(Route("git", "__dispatch", refusal=broken), "git.__dispatch", {"command": "s3cr3t"})
    assert verdict is not None and verdict.action is Action.DENY
    assert "KeyError" in verdict.reason and "s3cr3t" not in verdict.reason
