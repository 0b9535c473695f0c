"""``drawbridge discover``: real upstream processes, the table, the JSON report, and a draft policy that
the policy loader accepts and that decides as the page says (named reads allow, the rest needs a
human, anything unlisted is denied). Expected classifications are written here by hand."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from approval_support import answered_by_operator
from conftest import PYTHON, SERVERS, child_env, scaled
from serve_support import GITHUB, SLACK, http_client, http_gateway, write_config

from drawbridge.state.policy_store import PolicyStore

EXPECTED = {
    # name: (server, family, access)
    "github.list_repos": ("github", "named", "read"),
    "github.get_repo": ("github", "named", "read"),
    "github.add_deploy_key": ("github", "named", "write"),
    "github.delete_repo": ("github", "named", "write"),
    "slack.list_channels": ("slack", "named", "read"),
    "slack.invite": ("slack", "named", "write"),
    "slack.add_member": ("slack", "named", "write"),
}


def _discover(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "drawbridge", "discover", "--config", str(config), "--timeout", "20", *args],
        capture_output=True, text=True, env=child_env({"COLUMNS": "250"}), timeout=scaled(60),
    )


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("discover")
    return write_config(directory, [GITHUB, SLACK], policies={})


def test_the_table_lists_every_tool_with_family_access_and_reasons(config: Path) -> None:
    done = _discover(config)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("│")]
    cells = {parts[1]: parts for parts in ([c.strip() for c in row.strip().strip("│").split("│")] for row in rows)}
    assert set(cells) == set(EXPECTED)
    for name, (server, family, access) in EXPECTED.items():
        assert cells[name][0] == server and cells[name][2:4] == [family, access], cells[name]
    assert 'name verb "delete"' in cells["github.delete_repo"][4]
    assert "annotation destructiveHint: true" in cells["github.delete_repo"][4]
    # Nothing of the gateway was started: no evidence, no state.
    assert not (config.parent / "evidence").exists() and not (config.parent / "drawbridge.db").exists()


def test_the_json_report_carries_the_classification_of_each_tool(config: Path) -> None:
    done = _discover(config, "--format", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    got = {t["name"]: (t["server"], t["classification"]["family"], t["classification"]["access"]) for t in report["tools"]}
    assert got == EXPECTED
    assert all(t["classification"]["reasons"] for t in report["tools"])
    assert (report["unavailable"], report["not_served"]) == ([], [])
    assert "policy" not in report


def test_the_draft_policy_loads_and_decides_as_the_page_says(config: Path, tmp_path: Path) -> None:
    done = _discover(config, "--generate-policy", "--agent", "claude")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    for name, (server, family, access) in EXPECTED.items():
        comment = re.search(rf"^  #   {re.escape(name)} \[{family}, {access}\] .+$", text, re.MULTILINE)
        assert comment is not None, name
    assert '# MCP server "github": reads through a named tool' in text
    assert '# MCP server "slack": writes, generic tools, or no signal' in text

    directory = tmp_path / "policies"
    directory.mkdir()
    (directory / "draft.yaml").write_text(text, encoding="utf-8")
    store = PolicyStore.open(directory)  # raises PolicyLoadError if the draft does not load
    for name, (_server, _family, access) in EXPECTED.items():
        decision = store.evaluate("claude", name, {})
        assert decision.action.value == ("allow" if access == "read" else "human_approval"), name
        assert decision.source_file is not None and decision.source_file.endswith("draft.yaml")
    assert store.evaluate("claude", "github.something_new", {}).action.value == "deny"
    assert store.evaluate("another-agent", "github.list_repos", {}).action.value == "deny"


def test_an_upstream_that_cannot_be_reached_is_named_and_the_others_still_listed(tmp_path: Path) -> None:
    missing: dict[str, Any] = {"name": "missing", "transport": "streamable_http", "url": "http://127.0.0.1:9/mcp"}
    config = write_config(tmp_path, [GITHUB, missing], policies={})
    done = _discover(config, "--format", "json")
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert {t["server"] for t in report["tools"]} == {"github"}
    assert len(report["unavailable"]) == 1 and "'missing'" in report["unavailable"][0]
    assert "upstream 'missing' could not be read" in done.stderr


@pytest.mark.anyio
async def test_an_argument_inside_a_model_makes_the_tool_generic_everywhere(tmp_path: Path) -> None:
    """A FastMCP tool whose ``sql`` sits in ``$defs`` behind ``{"params": {"$ref": ...}}`` is generic:
    discover, the draft, ``GET /tools`` and ``GET /tools/decisions`` agree, and under serve with the draft
    ``{"params": {"sql": "DROP TABLE users"}}`` waits for a person instead of reaching the server."""
    calls = tmp_path / "calls.ndjson"
    reports = {"name": "reports", "transport": "stdio", "command": PYTHON,
               "args": [str(SERVERS / "reports.py"), str(calls)]}
    config = write_config(
        tmp_path, [reports], policies={}, evidence_dir=str(tmp_path / "evidence"),
        state_path=str(tmp_path / "state.db"), auth={"anonymous_agent": "guest"},
        approval={"timeout_seconds": 30, "elicitation": False},
    )
    done = _discover(config, "--generate-policy", "--format", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    (tmp_path / "policies" / "draft.yaml").write_text(report["policy"], encoding="utf-8")
    discovered = {t["name"]: t["classification"] for t in report["tools"]}
    reasons = ['string argument "sql"', "annotation readOnlyHint: true", 'name verb "get"']
    assert discovered["reports.get_report"] == {"family": "generic", "access": "read", "reasons": reasons}
    summary_class = discovered["reports.get_summary"]
    assert (summary_class["family"], summary_class["access"]) == ("named", "read")
    with http_gateway(config) as gateway:
        async with http_client(gateway.url) as client, httpx.AsyncClient(
            base_url=gateway.control(), trust_env=False, headers=gateway.control_headers()
        ) as http:
            summary = await client.call_tool("reports.get_summary", {"period": {"start": "a", "end": "b"}})
            dropped = await answered_by_operator(
                client, http, "reports.get_report", {"params": {"sql": "DROP TABLE users"}}, "deny"
            )
            tools = {t["name"]: t["classification"] for t in (await http.get("/tools")).json()}
            decisions = (await http.get("/tools/decisions", params={"agent": "guest"})).json()
    rows = {r["name"]: r["action"] for r in decisions}
    assert not summary.is_error and dropped.is_error
    assert [json.loads(line)["tool"] for line in calls.read_text(encoding="utf-8").splitlines()] == ["get_summary"]
    assert tools == discovered
    assert rows == {"reports.get_report": "human_approval", "reports.get_summary": "allow"}
