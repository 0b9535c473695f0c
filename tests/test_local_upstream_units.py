"""The parts of the OpenAPI and CLI upstreams that need no process: reading specs (``$ref``s by
``referencing``), the tools made of them, CLI argument vectors, the SSRF guard's address rule, and the
``openapi:`` / ``cli_tools:`` configuration, whose errors are located as file:line."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import httpx
import pytest
from conftest import scaled

from drawbridge.config import ConfigError, parse_config
from drawbridge.config_local import parse_duration, private_address_problem
from drawbridge.gateway.upstreams.cli_tools.argv import ArgvRefused, build_invocation
from drawbridge.gateway.upstreams.openapi.spec import read_spec
from drawbridge.gateway.upstreams.openapi.spec_text import SpecError, parse_text
from drawbridge.gateway.upstreams.openapi.tools import operation_tools, tool_name
from drawbridge.gateway.upstreams.ssrf import http_client, refusal


def _spec(paths: dict[str, object], version: str = "3.1.0", **more: object) -> dict[str, object]:
    return {"openapi": version, "info": {"title": "t", "version": "1"}, "paths": paths, **more}


def _tools(document: dict[str, object]) -> dict[str, dict[str, object]]:
    tools, _ = operation_tools(read_spec(document, "https://example.test/spec.json", from_file=False), "https://b.test")
    return {tool.name: dict(tool.item) for tool in tools}


def test_a_recursive_schema_is_bundled_once_and_refers_to_itself() -> None:
    node = {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/components/schemas/Node"}}}}
    document = _spec(
        {"/trees": {"post": {"operationId": "plantTree", "requestBody": {
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Node"}}}}}}},
        components={"schemas": {"Node": node}},
    )
    schema = _tools(document)["plant_tree"]["inputSchema"]
    assert schema["properties"]["body"]["$ref"] == "#/$defs/Node"  # type: ignore[index]
    assert schema["$defs"]["Node"]["properties"]["children"]["items"] == {"$ref": "#/$defs/Node"}  # type: ignore[index]


def test_openapi_30_schemas_become_json_schema() -> None:
    document = _spec({"/x/{n}": {"get": {"parameters": [
        {"name": "n", "in": "path", "required": True,
         "schema": {"type": "integer", "minimum": 0, "exclusiveMinimum": True, "nullable": True}}]}}}, "3.0.3")
    tool = _tools(document)["get_x_n"]
    assert tool["inputSchema"]["properties"]["n"] == {"type": ["integer", "null"], "exclusiveMinimum": 0}  # type: ignore[index]


@pytest.mark.parametrize(
    ("document", "said"),
    [
        (_spec({}, "2.0"), "not OpenAPI 3.0 or 3.1"),
        ({"swagger": "2.0", "paths": {}}, "not OpenAPI 3.0 or 3.1"),
        (_spec({"/a": {"get": {"parameters": [{"$ref": "#/components/parameters/Gone"}]}}}),
         "'#/components/parameters/Gone' cannot be resolved"),
        (_spec({"/a": {"get": {"parameters": [{"$ref": "other.yaml#/P"}]}}}), "may only refer inside itself"),
        (_spec({"/a": {"$ref": "#/paths/~1a"}}), "references loop"),
        (_spec({"a": {}}), "does not start with /"),
    ],
)
def test_a_spec_that_cannot_be_read_one_way_is_refused(document: dict[str, object], said: str) -> None:
    with pytest.raises(SpecError, match=None) as caught:
        read_spec(document, "https://example.test/spec.json", from_file=False)
    assert said in str(caught.value)


def test_a_key_given_twice_is_refused_in_json_and_yaml() -> None:
    with pytest.raises(SpecError, match="given twice"):
        parse_text('{"openapi": "3.1.0", "openapi": "3.0.0"}', "spec.json")
    with pytest.raises(SpecError, match="spec.yaml:2: the key 'openapi' is given twice") as caught:
        parse_text("openapi: 3.1.0\nopenapi: 3.0.0\n", "spec.yaml")
    assert "3.0.0" not in str(caught.value) and "3.1.0" not in str(caught.value)  # named by key, values unquoted


def test_operations_that_cannot_be_called_as_declared_are_left_out_and_named() -> None:
    document = _spec({
        "/upload": {"post": {"operationId": "upload", "requestBody": {"required": True,
                                                                      "content": {"multipart/form-data": {}}}}},
        "/twice": {"get": {"operationId": "twice", "parameters": [
            {"name": "q", "in": "query"}, {"name": "q", "in": "header"}]}},
        "/undeclared/{id}": {"get": {"operationId": "undeclared"}},
        "/a": {"get": {"operationId": "same"}}, "/b": {"get": {"operationId": "same"}},
    })
    tools, skipped = operation_tools(read_spec(document, "https://e.test/s", from_file=False), "https://b.test")
    assert tools == []
    assert skipped == [
        "POST /upload: the request body is not JSON",
        "GET /twice: two parameters would share the argument name 'q'",
        "GET /undeclared/{id}: the path parameter 'id' is not declared",
        "GET /a: another operation has the same tool name 'same'",
        "GET /b: another operation has the same tool name 'same'",
    ]


def test_tool_names_and_include_globs() -> None:
    document = _spec({"/pets/{petId}": {"parameters": [{"name": "petId", "in": "path", "required": True}],
                                         "get": {"operationId": "getPetByID"}, "delete": {}}})
    spec = read_spec(document, "https://e.test/s", from_file=False)
    assert [tool_name(op) for op in spec.operations] == ["get_pet_by_id", "delete_pets_pet_id"]
    tools, _ = operation_tools(spec, "https://b.test", ["get_*"])
    assert [tool.name for tool in tools] == ["get_pet_by_id"]


def test_cli_vectors_are_exact_and_refusals_name_what() -> None:
    vector = build_invocation("/usr/bin/git", "log", {"args": ["HEAD"], "flags": {"oneline": True, "n": 3, "x": False}},
                              ["--oneline", "-n"])
    assert vector.argv == ("/usr/bin/git", "log", "HEAD", "-n", "3", "--oneline")
    with pytest.raises(ArgvRefused, match="the flag -n is not allowed here"):
        build_invocation("/usr/bin/git", "log", {"args": ["-n=3"]}, [])
    with pytest.raises(ArgvRefused, match="not a plain name"):
        build_invocation("/usr/bin/git", "log", {"flags": {"a=b": True}}, None)
    with pytest.raises(ArgvRefused, match="metacharacter '`'"):
        build_invocation("/usr/bin/git", None, {"args": ["`id`"]}, None)
    assert build_invocation("/bin/cat", None, {"stdin": "a; b | c"}, None).stdin == b"a; b | c"


def test_the_address_rule() -> None:
    refused = ["127.0.0.1", "localhost", "api.localhost", "10.1.2.3", "192.168.0.1", "172.16.5.4", "169.254.169.254",
               "::1", "[::1]", "fe80::1", "fd00::1", "0.0.0.0", "::ffff:127.0.0.1", "100.64.0.1", "224.0.0.1"]
    for host in refused:
        assert private_address_problem(host) is not None, host
    for host in ["93.184.216.34", "2606:4700::1111", "api.example.com"]:
        assert private_address_problem(host) is None, host


def test_the_guard_refuses_names_that_resolve_to_loopback() -> None:
    async def attempt(url: str) -> str:
        async with http_client(allow_private=False, timeout=scaled(5)) as client:
            try:
                await client.get(url)
            except httpx.HTTPError as exc:
                found = refusal(exc)
                return str(found) if found is not None else f"not refused: {exc}"
        return "connected"

    # Spellings of 127.0.0.1 that are not address literals to Python's parser; only resolution tells.
    for host in ("127.1", "2130706433", "0x7f000001"):
        said = anyio.run(attempt, f"http://{host}:9/")
        assert said == f"the SSRF guard refuses {host}: it resolves to 127.0.0.1 is a loopback address", said


def test_durations() -> None:
    assert [parse_duration(v) for v in ("30s", "2m", "1m30s", "500ms", 5, 2.5)] == [30.0, 120.0, 90.0, 0.5, 5.0, 2.5]
    assert [parse_duration(v) for v in ("30", "s", "1x", True, "", "1m 30s")] == [None] * 6


BASE = {"policy_dir": "./p"}


def _text(**top: object) -> str:
    return json.dumps({**BASE, **top}, indent=1)


def _load(tmp_path: Path, **top: object) -> object:
    return parse_config(_text(**top), str(tmp_path / "drawbridge.yaml"), {})


def _line_of(text: str, anchor: str) -> int:
    """The line of the first key ``anchor`` (``{name}``: the line of the mapping that holds it; empty:
    the document)."""
    if not anchor:
        return 1
    lines = text.splitlines()
    if anchor.startswith("{"):
        return next(i for i, line in enumerate(lines, 1) if f'"name": "{anchor[1:-1]}"' in line) - 1
    return next(i for i, line in enumerate(lines, 1) if f'"{anchor}"' in line)


@pytest.mark.parametrize(
    ("top", "anchor", "said"),
    [
        ({"openapi": [{"name": "a", "file": "s.yaml", "verbose": True}]}, "verbose", "unknown key 'verbose' in openapi[0]"),
        ({"openapi": [{"name": "a", "file": "s.yaml", "url": "https://x.test/s"}]}, "{a}", "exactly one of them"),
        ({"openapi": [{"name": "a", "url": "ftp://x.test/s"}]}, "url", "http:// or https:// URL"),
        ({"openapi": [{"name": "a", "url": "http://10.0.0.1/s"}]}, "url", "refused by the SSRF guard"),
        ({"openapi": [{"name": "a", "file": "s", "operations": ["[a"]}]}, "operations", "operations glob '[a' is malformed"),
        ({"cli_tools": [{"name": "g", "bin": "git", "typo": 1}]}, "typo", "unknown key 'typo' in cli_tools[0]"),
        ({"cli_tools": [{"name": "g", "bin": "git", "default_action": "maybe"}]}, "default_action", "default_action must be one of"),
        ({"cli_tools": [{"name": "g", "bin": "git", "strict": True}]}, "strict", "strict needs at least one command"),
        ({"cli_tools": [{"name": "g", "bin": "git", "bare": {}, "commands": {"log": None}}]}, "bare",
         "bare runs the binary without subcommands"),
        ({"cli_tools": [{"name": "g", "bin": "git", "bare": {}, "strict": True}]}, "strict", "bare and strict exclude"),
        ({"cli_tools": [{"name": "g", "bin": "git", "commands": {"log;rm": None}}]}, "log;rm", "must be one word"),
        ({"cli_tools": [{"name": "g", "bin": "git", "commands": {"log": {"allowed_args": ["x"]}}}]}, "allowed_args",
         "holds flags such as --verbose"),
        ({"cli_tools": [{"name": "g", "bin": "git", "commands": {"log": {"timeout": "soon"}}}]}, "timeout",
         "positive number of seconds or a duration"),
        ({"cli_tools": [{"name": "g", "bin": "git", "commands": {"log": {"timeout": "10m"}}}]}, "timeout",
         "longer than limits.call_timeout_seconds"),
        ({"cli_tools": [{"name": "g", "bin": "git", "env": {"BAD=NAME": "v"}}]}, "BAD=NAME",
         "a name given is not an environment variable name"),
        ({"cli_tools": [{"name": "g", "bin": "git", "env": {"OK": "1", "": "v"}}]}, "env",
         "a name given is not an environment variable name"),
        ({"cli_tools": [{"name": "g", "bin": "git", "env": {"OK": "s3cr3t\0inside"}}]}, "OK",
         "cli_tools[0].env.OK: the value holds a NUL character"),
        ({"upstreams": [{"name": "u", "transport": "stdio", "command": "x", "env": {"A=B": "v"}}]}, "A=B",
         "upstreams[0].env: a name given is not an environment variable name"),
        ({"cli_tools": [{"name": "a", "bin": "git"}], "openapi": [{"name": "a", "file": "s"}]}, "cli_tools",
         "duplicate upstream name 'a'"),
        ({}, "", "list at least one upstream"),
    ],
)
def test_configuration_errors_are_located(tmp_path: Path, top: dict[str, object], anchor: str, said: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, **top)
    assert said in caught.value.problem, caught.value.problem
    assert "s3cr3t" not in str(caught.value)  # a value may be a secret: never shown
    assert caught.value.line == _line_of(_text(**top), anchor), str(caught.value)


def test_the_entries_load_with_their_defaults(tmp_path: Path) -> None:
    config = _load(
        tmp_path,
        openapi=[{"name": "pets", "url": "https://api.example.com/openapi.json", "headers": {"X-Key": "PETS_KEY"},
                  "timeout": "10s"}],
        cli_tools=[{"name": "tf", "bin": "./bin/terraform", "commands": {"plan": {"allowed_args": []}}}],
    )
    pets, = config.openapi  # type: ignore[attr-defined]
    assert (pets.headers_env, pets.timeout_seconds, pets.allow_private) == ({"X-Key": "PETS_KEY"}, 10.0, False)
    tf, = config.cli_tools  # type: ignore[attr-defined]
    assert tf.bin == str(tmp_path / "bin" / "terraform") and tf.default_action == "human_approval" and tf.dispatcher
    assert tf.commands["plan"].allowed_args == () and tf.commands["plan"].timeout_seconds == 30.0
    assert config.upstream_names == ("pets", "tf")  # type: ignore[attr-defined]
