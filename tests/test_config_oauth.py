"""``auth.oauth`` in the configuration: what loads, and the one-line errors for what must not."""

from __future__ import annotations

import re

import pytest

from drawbridge.config import ConfigError, parse_config

BASE = """\
upstreams:
  - {name: files, transport: stdio, command: x}
policy_dir: ./policies
auth:
  oauth:
    resource: https://gateway.example.com/mcp
    authorization_servers:
      - issuer: https://login.example.com/tenant
      - {issuer: https://other.example.com, jwks_uri: "https://other.example.com/keys/v2"}
    agent_claim: azp
    agents: {client-123: ci-bot}
    scopes: [mcp]
    tool_scopes:
      "files:write": ["files.write_*", "files.delete"]
    algorithms: [ES256]
    leeway_seconds: 5
"""


def test_the_full_section_loads(tmp_path):
    oauth = parse_config(BASE, str(tmp_path / "c.yaml"), {}).oauth
    assert oauth is not None
    assert [i.issuer for i in oauth.issuers] == ["https://login.example.com/tenant", "https://other.example.com"]
    assert oauth.issuers[1].jwks_uri == "https://other.example.com/keys/v2"
    assert oauth.resource == "https://gateway.example.com/mcp"
    assert (oauth.agent_claim, dict(oauth.agent_map or {})) == ("azp", {"client-123": "ci-bot"})
    assert oauth.scopes_supported == ("mcp", "files:write")
    assert oauth.scopes_for_tool("files.write_all") == ("files:write",)
    assert oauth.scopes_for_tool("files.read") == ()
    assert (oauth.algorithms, oauth.leeway_seconds, oauth.jwks_min_refresh_seconds) == (("ES256",), 5.0, 30.0)


def test_without_the_section_there_is_no_oauth(tmp_path):
    text = BASE.split("auth:")[0]
    assert parse_config(text, str(tmp_path / "c.yaml"), {}).oauth is None


@pytest.mark.parametrize(
    ("old", "new", "fragment"),
    [
        ("https://login.example.com/tenant", "http://login.example.com", "plain http on a host that is not loopback"),
        ("https://login.example.com/tenant", "https://u:p@login.example.com", "must not hold a user name or password"),
        ("https://gateway.example.com/mcp", "https://gateway.example.com/mcp#x", "must not have a fragment"),
        ("[ES256]", "[HS256]", "HS256 not among"),
        ("[ES256]", "[none]", "none not among"),
        ("[ES256]", "[]", "auth.oauth.algorithms is empty"),
        ("jwks_uri: \"https://other.example.com/keys/v2\"", "jwks_uri: \"https://a..b/keys\"", "its host is not a name"),
        ("agent_claim: azp", "agent_claim: azp\n    audience: x", "unknown key 'audience'"),
        ("files.delete", "files.[", "tool_scopes.files:write"),
        ("leeway_seconds: 5", "leeway_seconds: -1", "from 0 to 86400"),
        ("{client-123: ci-bot}", "{client-123: 'ci bot'}", "agent ids"),
        ("      - issuer: https://login.example.com/tenant\n", "", None),
    ],
)
def test_bad_sections_are_one_line_errors(tmp_path, old, new, fragment):
    text = BASE.replace(old, new)
    if fragment is None:  # dropping one issuer still loads; an empty list does not
        assert parse_config(text, str(tmp_path / "c.yaml"), {}).oauth is not None
        text = text.replace("authorization_servers:\n      - {issuer: https://other.example.com, jwks_uri: \"https://other.example.com/keys/v2\"}", "authorization_servers: []")
        fragment = "authorization_servers is empty"
    with pytest.raises(ConfigError) as err:
        parse_config(text, str(tmp_path / "c.yaml"), {})
    assert fragment in str(err.value) and "c.yaml:" in str(err.value)


@pytest.mark.parametrize(
    ("old", "new", "where", "problem"),
    [
        ("https://login.example.com/tenant", "https://user:S3cretPass@login.example.com/realms/x",
         "authorization_servers[0].issuer", "must not hold a user name or password"),
        ("https://login.example.com/tenant", "https://login.example.com/x?S3cretPass", "authorization_servers[0].issuer",
         "must not have a query"),
        ("https://other.example.com/keys/v2", "https://other.example.com/keys?api_key=S3cretPass",
         "authorization_servers[1].jwks_uri", "must not have a query"),
        ("https://other.example.com/keys/v2", "https://u:S3cretPass@other.example.com/keys",
         "authorization_servers[1].jwks_uri", "must not hold a user name or password"),
        ("https://other.example.com/keys/v2", "https://other.example.com/keys#S3cretPass",
         "authorization_servers[1].jwks_uri", "must not have a fragment"),
        ("https://other.example.com/keys/v2", "https://other.example.com:S3cretPass/keys",
         "authorization_servers[1].jwks_uri", "is not a URL"),
        ("https://gateway.example.com/mcp", "https://gateway.example.com/mcp?S3cretPass", "resource", "must not have a query"),
    ],
)
def test_a_url_with_a_secret_in_it_is_refused_by_its_place_never_repeated(tmp_path, old, new, where, problem):
    with pytest.raises(ConfigError) as err:
        parse_config(BASE.replace(old, new), str(tmp_path / "c.yaml"), {})
    assert f"auth.oauth.{where} {problem}" in str(err.value)
    assert "S3cretPass" not in str(err.value)


def test_static_agents_beside_oauth_need_the_agents_table(tmp_path):
    """Without the table a token's claim value is the agent id: a subject named like a static agent
    would act as it. Beside static agents the table is required; an empty one or an empty claim is refused."""
    static = "  agents:\n    - {agent: bob, token_sha256: \"%s\"}\n" % ("0" * 64)
    text = BASE.replace("\nauth:\n", "\nauth:\n" + static)
    assert parse_config(text, str(tmp_path / "c.yaml"), {}).oauth is not None  # mapped: loads
    without = text.replace("    agents: {client-123: ci-bot}\n", "")
    with pytest.raises(ConfigError, match="auth.oauth.agents is required beside auth.agents"):
        parse_config(without, str(tmp_path / "c.yaml"), {})
    assert parse_config(BASE.replace("    agents: {client-123: ci-bot}\n", ""), str(tmp_path / "c.yaml"), {}).oauth
    with pytest.raises(ConfigError, match="auth.oauth.agents is empty"):
        parse_config(BASE.replace("{client-123: ci-bot}", "{}"), str(tmp_path / "c.yaml"), {})
    for claim in ('""', '" "'):
        with pytest.raises(ConfigError, match="auth.oauth.agent_claim is empty"):
            parse_config(BASE.replace("agent_claim: azp", f"agent_claim: {claim}"), str(tmp_path / "c.yaml"), {})


def test_anonymous_agent_and_oauth_exclude_each_other(tmp_path):
    text = BASE.replace("\nauth:\n", "\nauth:\n  anonymous_agent: guest\n")
    with pytest.raises(ConfigError, match="cannot be used with auth.oauth"):
        parse_config(text, str(tmp_path / "c.yaml"), {})


def test_a_listener_beyond_loopback_needs_the_resource_uri(tmp_path):
    text = BASE.replace("    resource: https://gateway.example.com/mcp\n", "") + (
        "listen: {host: 0.0.0.0, allowed_hosts: [gateway.example.com]}\n"
    )
    with pytest.raises(ConfigError, match="auth.oauth.resource is required"):
        parse_config(text, str(tmp_path / "c.yaml"), {})
    local = BASE.replace("    resource: https://gateway.example.com/mcp\n", "")
    assert parse_config(local, str(tmp_path / "c.yaml"), {}).oauth.resource is None


def test_the_documented_oauth_example_is_a_valid_configuration(tmp_path):
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"```yaml oauth\n(.*?)```", text, flags=re.S)
    config = parse_config(block, str(tmp_path / "drawbridge.yaml"), {"DRAWBRIDGE_TOKEN_CI": "ci-bot-token-0123456789"})
    oauth = config.oauth
    assert oauth is not None and oauth.resource == "https://gateway.example.com/mcp"
    assert [i.issuer for i in oauth.issuers] == ["https://login.example.com/realms/agents", "https://tenant.example.org"]
    assert dict(oauth.agent_map or {}) == {"claude-connector": "claude", "6b1e0c9d-ci-client": "ci-bot"}
    assert oauth.scopes_for_tool("github.merge_pull_request") == ("github:write",)
    assert [a.agent for a in config.agents] == ["ci-bot"]
    for key in ("resource", "authorization_servers", "issuer", "jwks_uri", "agent_claim", "agents", "scopes",
                "tool_scopes", "algorithms", "leeway_seconds", "jwks_cache_seconds", "jwks_min_refresh_seconds"):
        assert f"{key}:" in block and f"`{key}`" in text
