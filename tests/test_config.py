"""The gateway configuration: strict keys, located errors, no secrets held."""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from drawbridge.config import ConfigError, load_config, parse_config

BASE = """\
upstreams:
  - name: github
    transport: stdio
    command: python
    args: [server.py]
    env: {LOG_LEVEL: debug}
  - name: time
    transport: streamable_http
    url: http://127.0.0.1:9000/mcp
    headers_env: {Authorization: TIME_AUTH}
    protocol: "2026-07-28"
policy_dir: ./policies
listen: {host: 127.0.0.1, port: 8899}
auth:
  admin: {token_env: ADMIN_TOKEN}
  agents:
    - agent: ci-bot
      token_env: CI_TOKEN
    - agent: reviewer
      token_sha256: "%s"
limits: {max_message_bytes: 2048, call_timeout_seconds: 5}
tool_decision_truth: {out: evidence/carriers.ndjson}
pin_tools: true
hide_denied_tools: true
approval: {timeout_seconds: 30}
""" % hashlib.sha256(b"reviewer-token").hexdigest()

ENV = {"ADMIN_TOKEN": "admin-secret-0123456789", "CI_TOKEN": "ci-secret-0123456789"}


def test_full_example_loads(tmp_path):
    cfg = parse_config(BASE, str(tmp_path / "drawbridge.yaml"), ENV)
    assert [u.name for u in cfg.upstreams] == ["github", "time"]
    assert cfg.upstreams[0].args == ("server.py",)
    assert cfg.upstreams[1].headers_env == {"Authorization": "TIME_AUTH"}
    assert [u.protocol for u in cfg.upstreams] == ["2025-11-25", "2026-07-28"]  # the handshake era by default
    assert cfg.policy_dir == str(tmp_path / "policies")
    assert cfg.tool_decision_truth_out == str(tmp_path / "evidence" / "carriers.ndjson")
    assert cfg.listen_port == 8899 and cfg.max_message_bytes == 2048 and cfg.call_timeout_seconds == 5.0
    assert cfg.pin_tools and cfg.hide_denied_tools and cfg.approval_timeout_seconds == 30.0
    # Tokens are held as digests only.
    assert cfg.admin_token_sha256 == hashlib.sha256(b"admin-secret-0123456789").hexdigest()
    assert {a.agent: a.token_sha256 for a in cfg.agents} == {
        "ci-bot": hashlib.sha256(b"ci-secret-0123456789").hexdigest(),
        "reviewer": hashlib.sha256(b"reviewer-token").hexdigest(),
    }
    assert "ci-secret" not in repr(cfg) and "admin-secret" not in repr(cfg)


@pytest.mark.parametrize(
    ("edit", "line", "fragment"),
    [
        (lambda t: t + "surprise: 1\n", 26, "unknown key 'surprise'"),
        (lambda t: t.replace("    env: {LOG_LEVEL", "    enviro: {LOG_LEVEL"), 6, "unknown key 'enviro' in upstreams[0]"),
        (lambda t: t.replace("transport: stdio", "transport: sse"), 3, "unknown transport 'sse'"),
        (lambda t: t.replace("name: time", "name: github"), 1, "duplicate upstream name 'github'"),
        (lambda t: t.replace("name: time", "name: ti.me"), 7, "must match"),
        (lambda t: t.replace("port: 8899", "port: 99999"), 13, "out of range"),
        (lambda t: t.replace("port: 8899", "port: true"), 13, "must be a number"),
        (lambda t: t.replace("token_env: CI_TOKEN", "token_env: MISSING_VAR"), 18, "MISSING_VAR is missing"),
        (lambda t: t.replace("policy_dir: ./policies\n", ""), None, "set policy_dir"),
        (lambda t: t.replace("max_message_bytes: 2048", "max_message_bytes: 10"), 21, "at least 1024"),
        (lambda t: t.replace("max_message_bytes: 2048", "max_message_bytes: 2048, header_read_seconds: 0"), 21,
         "limits.header_read_seconds must be more than 0 and at most 3600"),
        (lambda t: t.replace("max_message_bytes: 2048", "max_message_bytes: 2048, header_read_seconds: .nan"), 21,
         "limits.header_read_seconds must be more than 0"),
        (lambda t: t.replace("max_message_bytes: 2048", "max_message_bytes: 2048, body_read_seconds: 3601"), 21,
         "limits.body_read_seconds must be more than 0 and at most 3600"),
        (lambda t: t.replace("max_message_bytes: 2048", "max_message_bytes: 2048, body_read_seconds: -1"), 21,
         "limits.body_read_seconds must be more than 0"),
        (lambda t: t.replace("max_message_bytes: 2048", "max_message_bytes: 2048, max_connections: 0"), 21,
         "limits.max_connections must be at least 1"),
        (lambda t: t.replace("url: http://127", "url: ftp://127"), 9, "http:// or https://"),
        (lambda t: t.replace("url: http://127.0.0.1:9000/mcp", 'url: "http://[::1/mcp"'), 9, "not a valid URL"),
        (lambda t: t.replace("url: http://127.0.0.1:9000/mcp", "url: http://127.0.0.1:90x/mcp"), 9, "not a valid URL"),
        (lambda t: t.replace("url: http://127.0.0.1:9000/mcp", "url: http:///mcp"), 9, "names no host"),
        (lambda t: t.replace('protocol: "2026-07-28"', 'protocol: "2024-11-05"'), 11, "not one the gateway speaks"),
    ],
)
def test_bad_configs_name_line_and_problem(tmp_path, edit, line, fragment):
    path = str(tmp_path / "drawbridge.yaml")
    with pytest.raises(ConfigError) as info:
        parse_config(edit(BASE), path, ENV)
    assert fragment in str(info.value)
    assert info.value.file == path
    if line is not None:
        assert info.value.line == line


@pytest.mark.parametrize("variable", ["ADMIN_TOKEN", "CI_TOKEN"])
@pytest.mark.parametrize("value", ["x", "abc", "fifteen-chars-x", "a token with spaces", "tok\u00e9n-0123456789ab", "t" * 513,
                                   "line-one-0123456789\nline-two"])
def test_a_token_variable_that_holds_no_token_is_refused_by_name_never_by_value(tmp_path, variable, value):
    """The rule the CLI holds an admin token to (``TOKEN_RULE``), for every token serve reads."""
    with pytest.raises(ConfigError) as info:
        parse_config(BASE, str(tmp_path / "drawbridge.yaml"), {**ENV, variable: value})
    message = str(info.value)
    assert f"environment variable {variable} does not hold a token (one line of 16 to 512 printable ASCII" in message
    assert len(value) < 4 or value not in message  # ("x" is a letter of any message)
    assert parse_config(BASE, str(tmp_path / "drawbridge.yaml"), {**ENV, variable: "t" * 16}).agents


def test_shared_token_and_bad_digest_refused(tmp_path):
    path = str(tmp_path / "c.yaml")
    shared = BASE.replace("token_env: CI_TOKEN", "token_sha256: \"%s\"" % hashlib.sha256(b"reviewer-token").hexdigest())
    with pytest.raises(ConfigError, match="share one bearer token"):
        parse_config(shared, path, ENV)
    with pytest.raises(ConfigError, match="64 lowercase hex"):
        parse_config(BASE.replace('token_sha256: "', 'token_sha256: "Z'), path, ENV)


@pytest.mark.parametrize(
    ("admin", "env"),
    [
        ("{token_env: CI_TOKEN}", ENV),  # one variable named twice
        ("{token_env: ADMIN_TOKEN}", {**ENV, "ADMIN_TOKEN": ENV["CI_TOKEN"]}),  # two variables, one value
        ('{token_sha256: "%s"}' % hashlib.sha256(ENV["CI_TOKEN"].encode()).hexdigest(), ENV),
    ],
)
def test_an_agent_token_that_is_the_admin_token_is_refused_naming_both_uses_never_the_value(tmp_path, admin, env):
    """An agent holding the control plane's token could approve its own calls."""
    text = BASE.replace("admin: {token_env: ADMIN_TOKEN}", f"admin: {admin}")
    with pytest.raises(ConfigError) as info:
        parse_config(text, str(tmp_path / "c.yaml"), env)
    message = str(info.value)
    assert "auth.admin (the control plane) and auth.agents[0] (agent ci-bot) hold one bearer token" in message
    assert info.value.line == 17 and "\n" not in message
    assert ENV["CI_TOKEN"] not in message and hashlib.sha256(ENV["CI_TOKEN"].encode()).hexdigest() not in message


def test_two_agents_in_two_variables_of_one_value_are_refused(tmp_path):
    text = BASE.replace("token_sha256: \"%s\"" % hashlib.sha256(b"reviewer-token").hexdigest(), "token_env: REVIEW_TOKEN")
    with pytest.raises(ConfigError) as info:
        parse_config(text, str(tmp_path / "c.yaml"), {**ENV, "REVIEW_TOKEN": ENV["CI_TOKEN"]})
    assert "two agents share one bearer token: auth.agents[0] (agent ci-bot) and auth.agents[1] (agent reviewer)" in str(info.value)
    assert info.value.line == 19 and ENV["CI_TOKEN"] not in str(info.value)


def test_unreadable_and_invalid_yaml(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("upstreams: [\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(bad)


APPROVAL_FULL = """\
approval:
  timeout_seconds: 12.5
  non_blocking: true
  elicitation: false
  memory:
    enabled: true
    min_approvals: 5
    count_client_answers: false
"""


def test_approval_section_defaults_and_every_key(tmp_path):
    path = str(tmp_path / "drawbridge.yaml")
    plain = parse_config(BASE.replace("approval: {timeout_seconds: 30}\n", ""), path, ENV)
    assert (plain.approval_timeout_seconds, plain.approval_non_blocking, plain.approval_elicitation) == (300.0, False, True)
    # Approval memory is off unless configured, and then counts only operators' approvals.
    assert (plain.approval_memory_enabled, plain.approval_memory_min_approvals) == (False, 3)
    assert plain.approval_memory_count_client_answers is False
    on = parse_config(BASE.replace("{timeout_seconds: 30}", "{memory: {min_approvals: 2}}"), path, ENV)
    assert (on.approval_memory_enabled, on.approval_memory_min_approvals, on.approval_memory_count_client_answers) == (
        True, 2, False)
    full = parse_config(BASE.replace("approval: {timeout_seconds: 30}\n", APPROVAL_FULL), path, ENV)
    assert full.approval_timeout_seconds == 12.5 and full.approval_non_blocking and not full.approval_elicitation
    assert full.approval_memory_min_approvals == 5 and not full.approval_memory_count_client_answers
    off = parse_config(BASE.replace("{timeout_seconds: 30}", "{memory: {enabled: false}}"), path, ENV)
    assert off.approval_memory_enabled is False


@pytest.mark.parametrize(
    ("section", "fragment"),
    [
        ("{timeout_seconds: 0}", "positive"),
        ("{timeout_seconds: .inf}", "finite"),
        ("{timeout_seconds: .nan}", "positive"),
        ("{non_blocking: 'yes'}", "approval.non_blocking must be true or false"),
        ("{elicitation: 1}", "approval.elicitation must be true or false"),
        ("{channel: queue}", "unknown key 'channel' in approval"),
        ("{memory: {min_approvals: 0}}", "at least 1"),
        ("{memory: {min_approvals: 2.5}}", "approval.memory.min_approvals must be an integer"),
        ("{memory: {min_approvals: true}}", "must be a number, not a boolean"),
        ("{memory: {url: 'http://mem7'}}", "unknown key 'url' in approval.memory"),
        ("{memory: [3]}", "approval.memory must be a mapping"),
    ],
)
def test_approval_section_is_strict(tmp_path, section, fragment):
    with pytest.raises(ConfigError) as info:
        parse_config(BASE.replace("{timeout_seconds: 30}", section), str(tmp_path / "c.yaml"), ENV)
    assert fragment in str(info.value)
    assert info.value.line == 25


def test_listen_allowed_hosts_are_normalized_and_default_to_none(tmp_path):
    path = str(tmp_path / "drawbridge.yaml")
    assert parse_config(BASE, path, ENV).allowed_hosts is None  # the loopback names, with the bound port
    listed = "listen: {host: 0.0.0.0, port: 8899, allowed_hosts: [MCP.Example.COM, 'gw.internal:8443', '[0:0::1]:*', 10.0.0.5, 'a.b:08443', mcp.example.com]}"
    cfg = parse_config(BASE.replace("listen: {host: 127.0.0.1, port: 8899}", listed), path, ENV)
    assert cfg.listen_host == "0.0.0.0"
    assert cfg.allowed_hosts == ("mcp.example.com", "gw.internal:8443", "[::1]:*", "10.0.0.5", "a.b:8443")


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "::1", "LocalHost"])
def test_a_loopback_listener_needs_no_allowed_hosts(tmp_path, host):
    text = BASE.replace("listen: {host: 127.0.0.1, port: 8899}", f"listen: {{host: '{host}', port: 8899}}")
    assert parse_config(text, str(tmp_path / "c.yaml"), ENV).allowed_hosts is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "gateway.example.com", "128.0.0.1"])
def test_a_listener_beyond_loopback_without_allowed_hosts_is_refused(tmp_path, host):
    text = BASE.replace("listen: {host: 127.0.0.1, port: 8899}", f"listen: {{host: '{host}', port: 8899}}")
    with pytest.raises(ConfigError) as info:
        parse_config(text, str(tmp_path / "c.yaml"), ENV)
    assert info.value.line == 13
    assert f"listen.host {host} is not a loopback address" in str(info.value)
    assert "listen.allowed_hosts" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("[]", "is empty"),
        ("['*']", "'*' is not HOST, HOST:PORT or HOST:*"),
        ("['*.example.com']", "'*.example.com' is not HOST"),
        ("['http://mcp.example.com']", "'http://mcp.example.com' is not HOST"),
        ("['mcp.example.com/mcp']", "is not HOST"),
        ("['mcp.example.com:0']", "is not HOST"),
        ("['mcp.example.com:65536']", "is not HOST"),
        ("['mcp.example.com:']", "is not HOST"),
        ("['user@mcp.example.com']", "is not HOST"),
        ("['[::1']", "is not HOST"),
        ("['[fe80::1%eth0]']", "is not HOST"),
        ("['::1']", "is not HOST"),
        ("['']", "is not HOST"),
        ("mcp.example.com", "must be a list of strings"),
        ("[8080]", "must be a list of strings"),
    ],
)
def test_listen_allowed_hosts_is_strict(tmp_path, value, fragment):
    text = BASE.replace("listen: {host: 127.0.0.1, port: 8899}", f"listen: {{host: 127.0.0.1, port: 8899, allowed_hosts: {value}}}")
    with pytest.raises(ConfigError) as info:
        parse_config(text, str(tmp_path / "c.yaml"), ENV)
    assert fragment in str(info.value)
    assert info.value.line == 13


def test_session_limits_default_and_are_checked(tmp_path):
    path = str(tmp_path / "c.yaml")
    plain = parse_config(BASE, path, ENV)
    assert (plain.max_sessions_per_agent, plain.max_sessions) == (64, 1024)
    limits = "limits: {max_message_bytes: 2048, call_timeout_seconds: 5"
    set_ = parse_config(BASE.replace(limits, limits + ", max_sessions_per_agent: 8, max_sessions: 100"), path, ENV)
    assert (set_.max_sessions_per_agent, set_.max_sessions) == (8, 100)
    for extra, fragment in (
        (", max_sessions_per_agent: 0", "limits.max_sessions_per_agent must be at least 1"),
        (", max_sessions_per_agent: 65, max_sessions: 64", "limits.max_sessions must be at least limits.max_sessions_per_agent (65)"),
        (", max_sessions: 10", "limits.max_sessions must be at least limits.max_sessions_per_agent (64)"),
        (", max_sessions: true", "must be a number, not a boolean"),
        (", max_sessions_per_agent: 2.5", "limits.max_sessions_per_agent must be an integer"),
    ):
        with pytest.raises(ConfigError) as info:
            parse_config(BASE.replace(limits, limits + extra), path, ENV)
        assert fragment in str(info.value), extra
        assert info.value.line == 21


def test_checkpoints_section_defaults_and_every_key(tmp_path):
    plain = parse_config(BASE, str(tmp_path / "drawbridge.yaml"), ENV)
    assert (plain.checkpoint_every_lines, plain.checkpoint_every_seconds, plain.keys_dir, plain.origin) == (
        1000, 10.0, None, None)
    text = BASE + "checkpoints: {every_lines: 50, every_seconds: 2.5, keys_dir: ./keys, origin: example.com/gw/1}\n"
    cfg = parse_config(text, str(tmp_path / "drawbridge.yaml"), ENV)
    assert (cfg.checkpoint_every_lines, cfg.checkpoint_every_seconds) == (50, 2.5)
    assert cfg.keys_dir == str(tmp_path / "keys") and cfg.origin == "example.com/gw/1"


@pytest.mark.parametrize(
    "section, fragment",
    [
        ("{every_lines: 0}", "every_lines must be at least 1"),
        ("{every_seconds: 0}", "every_seconds must be positive"),
        ("{origin: 'has space'}", "checkpoints.origin"),
        ("{origin: 'a+b'}", "checkpoints.origin"),
        ("{sign: always}", "unknown key 'sign'"),
    ],
)
def test_checkpoints_section_is_strict(tmp_path, section, fragment):
    with pytest.raises(ConfigError, match=fragment):
        parse_config(BASE + f"checkpoints: {section}\n", str(tmp_path / "drawbridge.yaml"), ENV)


def test_telemetry_section(tmp_path):
    plain = parse_config(BASE, str(tmp_path / "drawbridge.yaml"), ENV)
    assert plain.telemetry_endpoint is None
    text = BASE + ("telemetry: {endpoint: 'http://127.0.0.1:4318', protocol: grpc, service_name: gw1,"
                   " headers_env: {Authorization: OTEL_AUTH}}\n")
    cfg = parse_config(text, str(tmp_path / "drawbridge.yaml"), {**ENV, "OTEL_AUTH": "Bearer x"})
    assert (cfg.telemetry_endpoint, cfg.telemetry_protocol, cfg.telemetry_service_name) == (
        "http://127.0.0.1:4318", "grpc", "gw1")
    assert cfg.telemetry_headers_env == {"Authorization": "OTEL_AUTH"} and "Bearer x" not in repr(cfg)
    with pytest.raises(ConfigError, match="OTEL_AUTH, which is missing"):
        parse_config(text, str(tmp_path / "drawbridge.yaml"), ENV)
    with pytest.raises(ConfigError, match="http:// or https://"):
        parse_config(BASE + "telemetry: {endpoint: 'collector:4317'}\n", str(tmp_path / "drawbridge.yaml"), ENV)
    with pytest.raises(ConfigError, match="http/protobuf or grpc"):
        parse_config(BASE + "telemetry: {endpoint: 'http://c:4318', protocol: thrift}\n", str(tmp_path / "d.yaml"), ENV)
    for blank in ("''", "'  '"):
        with pytest.raises(ConfigError, match="service_name: the telemetry's service name must not be empty"):
            parse_config(BASE + f"telemetry: {{endpoint: 'http://c:4318', service_name: {blank}}}\n",
                         str(tmp_path / "d.yaml"), ENV)


@pytest.mark.parametrize("name", ["Bad Header", "X-Token\\r\\nX-Injected", "X:Y", "", "Caf\\u00e9"])
def test_a_header_name_that_is_not_an_http_token_is_refused_where_it_is_written(tmp_path, name):
    path = str(tmp_path / "drawbridge.yaml")
    quoted = f'"{name}"'
    upstream = BASE.replace("headers_env: {Authorization: TIME_AUTH}", f"headers_env:\n      {quoted}: TIME_AUTH")
    openapi = BASE + f"openapi:\n  - name: pets\n    file: pets.yaml\n    headers:\n      {quoted}: PETS_KEY\n"
    telemetry = BASE + f"telemetry:\n  endpoint: 'http://127.0.0.1:4318'\n  headers_env:\n    {quoted}: OTEL_AUTH\n"
    for text in (upstream, openapi, telemetry):
        with pytest.raises(ConfigError, match="is not an HTTP header name") as info:
            parse_config(text, path, {**ENV, "OTEL_AUTH": "Bearer x"})
        assert info.value.line == next(i for i, row in enumerate(text.splitlines(), 1) if quoted in row)


@pytest.mark.parametrize("value", ["Bearer x\r\nX-Injected: 1", "Bearer x\x00", "Bearer \x7f", "Bearer x ", "Bearer \u00e9"])
def test_a_telemetry_header_value_that_cannot_be_sent_is_refused_without_showing_it(tmp_path, value):
    text = BASE + "telemetry: {endpoint: 'http://127.0.0.1:4318', headers_env: {Authorization: OTEL_AUTH}}\n"
    with pytest.raises(ConfigError, match="environment variable OTEL_AUTH, which is not a valid header value") as info:
        parse_config(text, str(tmp_path / "drawbridge.yaml"), {**ENV, "OTEL_AUTH": value})
    assert "Bearer" not in str(info.value) and "telemetry header Authorization" in str(info.value)


@pytest.mark.parametrize("agent", ["bad agent!", "guest\nadmin", ""])
def test_the_anonymous_agent_is_an_agent_id_like_any_other(tmp_path, agent):
    path = str(tmp_path / "drawbridge.yaml")
    quoted = json.dumps(agent)  # a YAML double-quoted scalar
    text = BASE.replace("auth:\n", f"auth:\n  anonymous_agent: {quoted}\n")
    with pytest.raises(ConfigError, match=r"auth.anonymous_agent .* has characters outside \[A-Za-z0-9._:@/-\]") as info:
        parse_config(text, path, ENV)
    assert info.value.line == 15
    assert parse_config(BASE.replace("auth:\n", "auth:\n  anonymous_agent: ci.bot@example/x-1\n"), path, ENV).anonymous_agent == "ci.bot@example/x-1"


def test_the_listeners_read_limits_have_defaults_and_load(tmp_path):
    cfg = parse_config(BASE, str(tmp_path / "drawbridge.yaml"), ENV)
    assert (cfg.header_read_seconds, cfg.body_read_seconds, cfg.max_connections) == (10.0, 30.0, 1024)
    text = BASE.replace("call_timeout_seconds: 5}", "call_timeout_seconds: 5, header_read_seconds: 2.5, "
                        "body_read_seconds: 60, max_connections: 8}")
    cfg = parse_config(text, str(tmp_path / "drawbridge.yaml"), ENV)
    assert (cfg.header_read_seconds, cfg.body_read_seconds, cfg.max_connections) == (2.5, 60.0, 8)
    assert (cfg.max_message_bytes, cfg.call_timeout_seconds) == (2048, 5.0)


@pytest.mark.parametrize("key", ["call_timeout_seconds", "header_read_seconds", "body_read_seconds"])
@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", "0"])
def test_a_limit_in_seconds_that_is_not_a_positive_finite_number_is_refused(tmp_path, key, value):
    with pytest.raises(ConfigError, match=f"limits.{key} must be"):
        text = BASE.replace("call_timeout_seconds: 5}", f"call_timeout_seconds: 5, {key}: {value}}}")
        parse_config(text.replace("call_timeout_seconds: 5, call_timeout_seconds", "call_timeout_seconds"),
                     str(tmp_path / "drawbridge.yaml"), ENV)


SECRET_IN_PLACE = "Bearer HDRSECRETVALUE"
"""A credential written where its variable's name goes: refused, and never repeated."""


@pytest.mark.parametrize(("text", "said"), [
    (BASE + f"telemetry: {{endpoint: 'http://127.0.0.1:4318', headers_env: {{Authorization: '{SECRET_IN_PLACE}'}}}}\n",
     "telemetry.headers_env.Authorization: the value given is not an environment variable name"),
    (BASE + f"telemetry: {{endpoint: 'http://127.0.0.1:4318', headers_env: {{'Authorization: {SECRET_IN_PLACE}': A}}}}\n",
     "telemetry.headers_env: a header's name is not an HTTP header name"),
    (BASE.replace("headers_env: {Authorization: TIME_AUTH}", f"headers_env: {{Authorization: '{SECRET_IN_PLACE}'}}"),
     "upstreams[1].headers_env.Authorization: the value given is not an environment variable name"),
    (BASE + f"openapi:\n  - name: pets\n    file: pets.yaml\n    headers: {{X-Key: '{SECRET_IN_PLACE}'}}\n",
     "openapi[0].headers.X-Key: the value given is not an environment variable name"),
    (BASE.replace("token_env: ADMIN_TOKEN", f"token_env: '{SECRET_IN_PLACE}'"),
     "auth.admin: token_env is not an environment variable name"),
    (BASE + f"state: {{url_env: 'postgresql://u:{SECRET_IN_PLACE}@db/x'}}\n",
     "state.url_env is not an environment variable name"),
    (BASE.replace("env: {LOG_LEVEL: debug}", f"env: {{'TOKEN={SECRET_IN_PLACE}': x}}"),
     "upstreams[0].env: a name given is not an environment variable name"),
])
def test_a_credential_written_where_a_variable_name_goes_is_refused_without_repeating_it(tmp_path, text, said):
    with pytest.raises(ConfigError) as info:
        parse_config(text, str(tmp_path / "drawbridge.yaml"), ENV)
    assert said in str(info.value) and info.value.line is not None, str(info.value)
    assert "HDRSECRET" not in str(info.value), str(info.value)
