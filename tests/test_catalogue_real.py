"""Classification of real catalogues: the tools/list of published servers and of our fixture servers.

Each server is started for real and listed with the mcp SDK's ``ClientSession`` over stdio; the
expected family and access of every tool is written here by hand, from reading the tool. A server
release that adds, removes or renames a tool fails the name check, so no tool goes unjudged.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import GITHUB_LIKE, PYTHON, ROOT, SLACK_LIKE, child_env, scaled
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from drawbridge.catalogue import (
    Access,
    DraftTool,
    Family,
    PinStatus,
    ReasonCode,
    accept,
    classify_tool,
    compare,
    generate_draft,
    origin_label,
)
from drawbridge.catalogue.classify import Effect
from drawbridge.policy import Action, evaluate, load_policy_text

N, G = Family.NAMED, Family.GENERIC
R, W, U = Access.READ, Access.WRITE, Access.UNKNOWN

EXPECTED: dict[str, dict[str, tuple[Family, Access]]] = {
    "everything": {
        "echo": (N, R),  # readOnlyHint only: "echo" is no verb
        "get-annotated-message": (N, R),
        "get-env": (N, R),
        "get-resource-links": (N, R),
        "get-resource-reference": (N, R),
        "get-structured-content": (N, R),
        "get-sum": (N, R),
        "get-tiny-image": (N, R),
        "gzip-file-as-resource": (N, W),  # readOnlyHint: false
        "toggle-simulated-logging": (N, W),
        "toggle-subscriber-updates": (N, W),
        "trigger-long-running-operation": (N, W),  # claims readOnlyHint: true, but "trigger" is a write verb
        "simulate-research-query": (N, W),  # readOnlyHint: false
    },
    "filesystem": {
        "read_file": (N, R),
        "read_text_file": (N, R),
        "read_media_file": (N, R),
        "read_multiple_files": (N, R),
        "write_file": (N, W),
        "edit_file": (N, W),
        "create_directory": (N, W),
        "list_directory": (N, R),
        "list_directory_with_sizes": (N, R),
        "directory_tree": (N, R),  # readOnlyHint only
        "move_file": (N, W),
        "search_files": (N, R),
        "get_file_info": (N, R),
        "list_allowed_directories": (N, R),
    },
    "git": {
        "git_status": (N, R),
        "git_diff_unstaged": (N, R),
        "git_diff_staged": (N, R),
        "git_diff": (N, R),
        "git_commit": (N, W),  # readOnlyHint: false ("commit" is not in the verb list)
        "git_add": (N, W),
        "git_reset": (N, W),
        "git_log": (N, R),
        "git_create_branch": (N, W),
        "git_checkout": (N, W),
        "git_show": (N, R),
        "git_branch": (N, R),
    },
    "time": {
        "get_current_time": (N, R),
        "convert_time": (N, R),
    },
    "github": {
        "list_repos": (N, R),
        "get_repo": (N, R),
        "add_deploy_key": (N, W),
        "delete_repo": (N, W),
    },
    "slack": {
        "list_channels": (N, R),
        "invite": (N, W),
        "add_member": (N, W),
    },
}

# A few reason lists checked in full, including the conflict the page warns about.
EXPECTED_CODES: dict[tuple[str, str], list[ReasonCode]] = {
    ("everything", "echo"): [ReasonCode.ANNOTATION_READ_ONLY],
    ("everything", "trigger-long-running-operation"): [
        ReasonCode.ANNOTATION_READ_ONLY,
        ReasonCode.NAME_VERB_WRITE,
    ],
    ("filesystem", "write_file"): [
        ReasonCode.ANNOTATION_NOT_READ_ONLY,
        ReasonCode.ANNOTATION_DESTRUCTIVE,
        ReasonCode.NAME_VERB_WRITE,
    ],
    ("git", "git_commit"): [ReasonCode.ANNOTATION_NOT_READ_ONLY],
    ("github", "delete_repo"): [
        ReasonCode.ANNOTATION_NOT_READ_ONLY,
        ReasonCode.ANNOTATION_DESTRUCTIVE,
        ReasonCode.NAME_VERB_WRITE,
    ],
    ("slack", "invite"): [ReasonCode.ANNOTATION_NOT_READ_ONLY, ReasonCode.NAME_VERB_WRITE],
}


def _binary(path: Path) -> str:
    if not path.exists():
        pytest.fail(f"{path} is missing: run scripts/test (it installs the published servers)", pytrace=False)
    return str(path)


def _servers(tmp: Path) -> dict[str, list[str]]:
    node_bin = ROOT / ".node" / "node_modules" / ".bin"
    venv_bin = Path(PYTHON).parent
    files = tmp / "files"
    files.mkdir()
    repo = tmp / "repo"
    subprocess.run(["git", "init", "--quiet", str(repo)], check=True)
    return {
        "everything": [_binary(node_bin / "mcp-server-everything"), "stdio"],
        "filesystem": [_binary(node_bin / "mcp-server-filesystem"), str(files)],
        "git": [_binary(venv_bin / "mcp-server-git"), "--repository", str(repo)],
        "time": [_binary(venv_bin / "mcp-server-time"), "--local-timezone", "UTC"],
        "github": GITHUB_LIKE,
        "slack": SLACK_LIKE,
    }


async def _list_tools(argv: list[str]) -> list[dict[str, Any]]:
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=child_env())
    with anyio.fail_after(scaled(60)):
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            result = await session.list_tools()
    assert result.next_cursor is None
    return [item.model_dump(by_alias=True, exclude_none=True, mode="json") for item in result.tools]


@pytest.fixture(scope="module")
def catalogues(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Every server's tools/list, the servers started side by side."""
    servers = _servers(tmp_path_factory.mktemp("servers"))
    listed: dict[str, list[dict[str, Any]]] = {}

    async def one(name: str, argv: list[str]) -> None:
        listed[name] = await _list_tools(argv)

    async def main() -> None:
        async with anyio.create_task_group() as group:
            for name, argv in servers.items():
                group.start_soon(one, name, argv)

    anyio.run(main)
    return listed


@pytest.mark.parametrize("server", sorted(EXPECTED))
def test_every_tool_has_its_expected_family_and_access(
    catalogues: Mapping[str, list[dict[str, Any]]], server: str
) -> None:
    tools = catalogues[server]
    assert sorted(item["name"] for item in tools) == sorted(EXPECTED[server])
    got = {}
    for item in tools:
        c = classify_tool(item)
        got[item["name"]] = (c.family, c.access)
        assert c.reasons
        for key, codes in EXPECTED_CODES.items():
            if key == (server, item["name"]):
                assert list(c.codes) == codes
    assert got == EXPECTED[server]


def test_the_conflicting_claim_is_visible(catalogues: Mapping[str, list[dict[str, Any]]]) -> None:
    item = next(t for t in catalogues["everything"] if t["name"] == "trigger-long-running-operation")
    assert item["annotations"]["readOnlyHint"] is True
    c = classify_tool(item)
    assert {r.effect for r in c.reasons} >= {Effect.READ, Effect.WRITE}  # both fired; write won
    assert c.reason_texts == ("annotation readOnlyHint: true", 'name verb "trigger"')


def test_draft_from_every_real_catalogue_loads_and_decides_as_classified(
    catalogues: Mapping[str, list[dict[str, Any]]],
) -> None:
    entries = [
        DraftTool(f"{server}.{item['name']}", classify_tool(item), origin_label("mcp", server))
        for server, tools in catalogues.items()
        for item in tools
    ]
    text = generate_draft(entries)
    policies = load_policy_text(text, "draft.yaml")
    for server, tools in EXPECTED.items():
        for name, (family, access) in tools.items():
            expected = Action.ALLOW if (family, access) == (N, R) else Action.HUMAN_APPROVAL
            decision = evaluate(policies, "any-agent", f"{server}.{name}", {})
            assert decision.action is expected, name
    assert '  #   github.delete_repo [named, write] annotation readOnlyHint: false; ' in text
    unknown = evaluate(policies, "any-agent", "github.transfer_repo", {})
    assert unknown.action is Action.DENY
    assert unknown.rule_index == sum(len(tools) for tools in EXPECTED.values())


def test_real_catalogues_pin_on_first_sight_and_stay_pinned(
    catalogues: Mapping[str, list[dict[str, Any]]],
) -> None:
    for server, tools in catalogues.items():
        first = compare(None, tools)
        assert first.first_sight
        assert set(first.statuses.values()) == {PinStatus.PINNED}
        again = compare(first.pins, tools)
        assert not again.first_sight and not again.removed
        assert set(again.statuses.values()) == {PinStatus.PINNED}, server
        assert len(set(first.pins.values())) == len(tools)
        assert accept(again) == dict(first.pins)
