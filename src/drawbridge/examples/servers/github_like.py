"""A GitHub-like MCP server for tests: repositories in memory, reads and writes, rich tool metadata.

Run: ``python -m drawbridge.examples.servers.github_like``. It speaks both protocol eras over stdio (the mcp SDK's dual-era loop).
Writes really change its state, so a test can prove that a refused call had no effect.
Tool metadata carries everything a lossy proxy tends to drop: title, annotations, ``_meta``,
``outputSchema``.
"""

from __future__ import annotations

import warnings
from typing import Annotated

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations
from pydantic import BaseModel, Field

server = MCPServer("github-like", version="1.0.0", instructions="A pretend GitHub for gateway tests.")

_REPOS: dict[str, dict[str, dict[str, object]]] = {
    "acme": {
        "rocket": {"description": "Rockets, mostly", "private": False, "stars": 42},
        "anvil": {"description": "Heavy", "private": True, "stars": 7},
    },
    "octo": {"hello": {"description": "Hello world", "private": False, "stars": 1}},
}
_DEPLOY_KEYS: dict[str, list[str]] = {}


class Repo(BaseModel):
    owner: str
    name: str
    description: str
    private: bool
    stars: int


@server.tool(
    title="List repositories",
    annotations=ToolAnnotations(readOnlyHint=True, openWorldHint=False),
    meta={"example.com/cost": "cheap", "example.com/tags": ["read", "list"]},
)
async def list_repos(owner: Annotated[str, Field(description="Account that owns the repositories")], ctx: Context) -> list[str]:
    """List the names of an owner's repositories."""
    names = sorted(_REPOS.get(owner, {}))
    for index, _ in enumerate(names, start=1):
        await ctx.report_progress(index, len(names), f"listed {index} of {len(names)}")
    await ctx.info(f"listed {len(names)} repositories")
    return names


@server.tool(title="Get a repository", annotations=ToolAnnotations(readOnlyHint=True))
def get_repo(owner: str, name: str) -> Repo:
    """Details of one repository."""
    repo = _REPOS.get(owner, {}).get(name)
    if repo is None:
        raise ValueError(f"no repository {owner}/{name}")
    return Repo(owner=owner, name=name, **repo)  # type: ignore[arg-type]


@server.tool(
    title="Add a deploy key",
    annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False, idempotentHint=False),
)
def add_deploy_key(owner: str, repo: str, title: str, key: str, read_only: bool = True) -> str:
    """Add an SSH deploy key to a repository."""
    if repo not in _REPOS.get(owner, {}):
        raise ValueError(f"no repository {owner}/{repo}")
    _DEPLOY_KEYS.setdefault(f"{owner}/{repo}", []).append(title)
    return f"deploy key {title!r} added to {owner}/{repo} ({'read-only' if read_only else 'read-write'})"


@server.tool(
    title="Delete a repository",
    annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True, idempotentHint=True, openWorldHint=False),
)
def delete_repo(owner: str, name: str) -> str:
    """Delete a repository for good."""
    if _REPOS.get(owner, {}).pop(name, None) is None:
        raise ValueError(f"no repository {owner}/{name}")
    return f"deleted {owner}/{name}"


@server.resource("github://repos/{owner}/{name}/readme", title="README", mime_type="text/markdown")
def readme(owner: str, name: str) -> str:
    """A repository's README."""
    repo = _REPOS.get(owner, {}).get(name)
    if repo is None:
        raise ValueError(f"no repository {owner}/{name}")
    return f"# {name}\n\n{repo['description']}\n"


@server.resource("github://rate-limit", mime_type="application/json")
def rate_limit() -> str:
    """The remaining API budget."""
    return '{"remaining": 4999, "limit": 5000}'


@server.prompt(title="Review a pull request")
def review_pr(repo: str, number: str) -> str:
    """Ask for a careful review of a pull request."""
    return f"Please review pull request #{number} of {repo}. Look for security problems first."


if __name__ == "__main__":
    # The demo's progress and log notifications use the 2025-era logging capability on purpose.
    warnings.filterwarnings("ignore", message="The logging capability is deprecated")
    server.run("stdio")
