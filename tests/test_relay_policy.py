"""``drawbridge wrap --policy``: the native policy engine decides, through the real command line."""

from __future__ import annotations

import subprocess
from pathlib import Path

import mcp_types as types
import pytest
from conftest import ERAS, GITHUB_LIKE, PYTHON, child_env, connect, wrap_params
from mcp.shared.exceptions import MCPError

POLICY = """\
name: demo
agent: "claude"
rules:
  - tools: ["list_repos", "get_repo"]
    action: allow
  - tools: ["add_deploy_key"]
    action: human_approval
  - tools: ["delete_*"]
    action: deny
schemas:
  get_repo:
    type: object
    required: [owner, name]
    properties:
      owner: {type: string, maxLength: 10}
"""


def _text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


@pytest.fixture
def policy_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "policies"
    directory.mkdir()
    (directory / "demo.yaml").write_text(POLICY, encoding="utf-8")
    return directory


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ERAS)
async def test_the_policy_decides_each_call(mode: str, policy_dir: Path) -> None:
    params = wrap_params(GITHUB_LIKE, "--policy", str(policy_dir), "--agent", "claude")
    async with connect(params, mode) as client:
        listed = await client.call_tool("list_repos", {"owner": "acme"})
        assert listed.structured_content == {"result": ["anvil", "rocket"]}
        deleted = await client.call_tool("delete_repo", {"owner": "acme", "name": "rocket"})
        assert deleted.is_error
        assert _text(deleted).startswith('drawbridge refused this call: policy "demo" rule 2: ')
        approval = await client.call_tool("add_deploy_key", {"owner": "acme", "repo": "rocket", "title": "t", "key": "k"})
        assert _text(approval).startswith('drawbridge refused this call: policy "demo" rule 1 (human_approval): ')
        assert _text(approval).endswith(": approval unavailable")
        violating = await client.call_tool("get_repo", {"owner": "a-very-long-owner-name", "name": "rocket"})
        assert violating.is_error and "maxLength" in _text(violating)
        assert "a-very-long-owner-name" not in _text(violating)
        # A name the server does not list is refused before any rule is asked (as serve does).
        with pytest.raises(MCPError, match="unknown tool: the gateway serves no tool of this name"):
            await client.call_tool("get_env", {})
        # The denied deletion never happened.
        assert (await client.call_tool("list_repos", {"owner": "acme"})).structured_content == {
            "result": ["anvil", "rocket"]
        }


@pytest.mark.anyio
async def test_another_agent_falls_to_the_default_deny(policy_dir: Path) -> None:
    params = wrap_params(GITHUB_LIKE, "--policy", str(policy_dir), "--agent", "someone-else")
    async with connect(params) as client:
        refused = await client.call_tool("list_repos", {"owner": "acme"})
        assert _text(refused) == "drawbridge refused this call: default deny: no rule matched"


def test_a_policy_that_does_not_load_stops_the_gateway(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nagent: '*'\nrules:\n  - tools: ['*']\n    action: alow\n", encoding="utf-8")
    result = subprocess.run(
        [PYTHON, "-m", "drawbridge", "wrap", "--policy", str(bad), "--", *GITHUB_LIKE],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 2
    assert f"cannot load the policy {bad}" in result.stderr
    assert "bad.yaml:5" in result.stderr
    assert result.stdout == ""


@pytest.mark.anyio
async def test_policy_edits_apply_to_the_next_call(policy_dir: Path) -> None:
    import anyio

    params = wrap_params(GITHUB_LIKE, "--policy", str(policy_dir), "--agent", "claude")
    async with connect(params) as client:
        assert not (await client.call_tool("list_repos", {"owner": "acme"})).is_error
        policy = policy_dir / "demo.yaml"
        policy.write_text(POLICY.replace('["list_repos", "get_repo"]', '["get_repo"]'), encoding="utf-8")
        with anyio.fail_after(10):
            while not (await client.call_tool("list_repos", {"owner": "acme"})).is_error:
                await anyio.sleep(0.2)
        refused = await client.call_tool("list_repos", {"owner": "acme"})
        assert _text(refused) == "drawbridge refused this call: default deny: no rule matched"
        policy.write_text("this: [is not a policy", encoding="utf-8")  # a broken edit keeps the last good set
        await anyio.sleep(1.0)
        assert not (await client.call_tool("get_repo", {"owner": "acme", "name": "rocket"})).is_error
