"""How an OpenAPI spec is loaded, on real files and real ``serve`` / ``discover`` processes: the files
its ``$ref``s may read, the backend URLs it may name, the schema loops, YAML bounds and the schema
checks it is held to. Each refusal is one line that names the place and never a value it read."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import PYTHON, child_env, scaled
from serve_support import background, free_port, serve_argv, wait_for_port, write_config

from drawbridge.gateway.upstreams.openapi.spec import read_spec
from drawbridge.gateway.upstreams.openapi.tools import operation_tools

SECRET = "supersecret-token-value"
HEAD = "openapi: 3.0.3\ninfo: {title: t, version: '1'}\nservers: [{url: https://api.example.com/v1}]\n"


def _spec(directory: Path, schema_ref: str, name: str = "spec.yaml") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(
        HEAD + "paths:\n  /a:\n    get:\n      operationId: readA\n"
        f"      parameters: [{{name: q, in: query, schema: {{$ref: {json.dumps(schema_ref)}}}}}]\n",
        encoding="utf-8",
    )
    return path


def _discover(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "drawbridge", "discover", "--timeout", "20", "--format", "json", *args],
        capture_output=True, text=True, env=child_env({"COLUMNS": "250"}), timeout=scaled(60), stdin=subprocess.DEVNULL,
    )


def _serve(tmp_path: Path, entry: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    config = write_config(
        tmp_path, [], openapi=[entry], evidence_dir=str(tmp_path / "evidence"), state_path=str(tmp_path / "state.db"),
        auth={"anonymous_agent": "guest"},
    )
    return subprocess.run(
        serve_argv(config), capture_output=True, text=True, timeout=scaled(60), stdin=subprocess.DEVNULL,
        env=child_env(),
    )


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


# ------------------------------------------------------------------------------------------ references


def test_references_leaving_the_specs_directory_are_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "dotenv").write_text(f"TOKEN={SECRET}\n", encoding="utf-8")
    (tmp_path / "private").mkdir()
    (tmp_path / "private" / "creds.json").write_text(json.dumps({"type": "string", "enum": [SECRET]}), encoding="utf-8")
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "linked.json").symlink_to(tmp_path / "private" / "creds.json")
    cases = {
        "absolute": (str(tmp_path / "private" / "creds.json"), str(tmp_path / "private" / "creds.json")),
        "dotdot": ("../dotenv", str(tmp_path / "dotenv")),
        "symlink": ("./linked.json", str(tmp_path / "private" / "creds.json")),
        "nested": ("./sub/../../dotenv", str(tmp_path / "dotenv")),
    }
    for case, (ref, named) in cases.items():
        spec = _spec(specs, ref, f"{case}.yaml")
        result = _discover("--openapi", str(spec))
        assert result.returncode == 1, result.stderr
        unavailable = json.loads(result.stdout)["unavailable"]
        assert len(unavailable) == 1 and f"a reference to {named} leaves the spec's directory" in unavailable[0], case
        assert SECRET not in result.stdout + result.stderr, case
    # serve: the same refusal is a one-line startup error.
    line = _one_line(_serve(tmp_path, {"name": "o", "file": str(specs / "dotdot.yaml")}))
    assert f"a reference to {tmp_path / 'dotenv'} leaves the spec's directory {specs}" in line
    assert SECRET not in line


def test_files_in_the_specs_directory_and_below_are_read(tmp_path: Path) -> None:
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "thing.yaml").write_text("type: object\nproperties: {id: {type: integer}}\n")
    by_relative = _spec(tmp_path, "./schemas/thing.yaml", "relative.yaml")
    by_absolute = _spec(tmp_path, str(tmp_path / "schemas" / "thing.yaml"), "absolute.yaml")
    for spec in (by_relative, by_absolute):
        result = _discover("--openapi", str(spec))
        assert result.returncode == 0, result.stderr
        tools = {tool["name"]: tool for tool in json.loads(result.stdout)["tools"]}
        assert "openapi.read_a" in tools


def test_an_invalid_schema_from_a_file_is_named_by_place_not_quoted(tmp_path: Path) -> None:
    (tmp_path / "dotenv").write_text(f"TOKEN={SECRET}\n", encoding="utf-8")
    spec = _spec(tmp_path, "./dotenv")
    result = _discover("--openapi", str(spec))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["not_served"] == [
        "upstream 'openapi': GET /a: its parameters' schemas are invalid (at $defs/schema (breaks 'type'))"
    ]
    assert SECRET not in result.stdout + result.stderr
    # A file beside the spec that is not YAML as it should be is named by its line, never quoted.
    for text in (f"token: {SECRET}\ntoken: {SECRET}2\n", f"token: !!int {SECRET}\n", f"token: [{SECRET}\n"):
        (tmp_path / "dotenv").write_text(text, encoding="utf-8")
        unreadable = _discover("--openapi", str(spec))
        assert f"{tmp_path / 'dotenv'}:" in json.loads(unreadable.stdout)["unavailable"][0], text
        assert SECRET not in unreadable.stdout + unreadable.stderr, text


# ------------------------------------------------------------------------------------------ backends


@pytest.mark.parametrize(
    ("backend", "said"),
    [
        (f"https://user:{SECRET}@api.example.com/v1", "holds credentials (user:password@)"),
        (f"https://api.example.com/v1?apikey={SECRET}", "has a query (?...)"),
        (f"https://api.example.com/v1#{SECRET}", "has a fragment (#...)"),
    ],
)
def test_a_backend_url_with_credentials_a_query_or_a_fragment_is_refused(
    tmp_path: Path, backend: str, said: str
) -> None:
    spec = _spec(tmp_path, "#/components/schemas/S")
    spec.write_text(spec.read_text() + "components: {schemas: {S: {type: string}}}\n")
    configured = _one_line(_serve(tmp_path, {"name": "o", "file": str(spec), "backend_url": backend}))
    assert f"openapi 'o': backend_url {said}" in configured and SECRET not in configured
    if "@" in backend:
        assert "headers read from the environment" in configured
    flag = _one_line(_discover("--openapi", str(spec), "--backend", backend))
    assert said in flag and SECRET not in flag
    # The spec's first server, used when backend_url is not set, is held to the same rule.
    spec.write_text(spec.read_text().replace("https://api.example.com/v1", backend))
    served = _one_line(_serve(tmp_path, {"name": "o", "file": str(spec)}))
    assert f"the spec's first server {said}" in served and SECRET not in served


# ------------------------------------------------------------------------------------------ loops


def test_a_schema_that_refers_to_itself_through_references_alone_is_a_load_error(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "#/components/schemas/S")
    spec.write_text(
        spec.read_text() + "components:\n  schemas:\n    S: {$ref: '#/components/schemas/S2'}\n"
        "    S2: {anyOf: [{type: string}, {allOf: [{$ref: '#/components/schemas/S'}]}]}\n"
        "    Tree: {type: object, properties: {kids: {type: array, items: {$ref: '#/components/schemas/Tree'}}}}\n"
    )
    line = _one_line(_serve(tmp_path, {"name": "l", "file": str(spec)}))
    assert "openapi 'l': paths[/a].get: schema references loop (S -> S2 -> S)" in line
    # A schema that refers to itself through a part of the value (a tree) is no loop.
    tree = _spec(tmp_path / "tree", "#/components/schemas/Tree")
    tree.write_text(tree.read_text() + "components:\n  schemas:\n"
                    "    Tree: {type: object, properties: {kids: {type: array, items: {$ref: '#/components/schemas/Tree'}}}}\n")
    assert _discover("--openapi", str(tree)).returncode == 0


# ------------------------------------------------------------------------------------------ bounds


def _bomb(levels: int) -> str:
    lines = [HEAD, "x-bomb:\n  l0: &l0 {type: string}\n"]
    lines += [f"  l{i}: &l{i} {{allOf: [*l{i - 1}, *l{i - 1}]}}\n" for i in range(1, levels + 1)]
    lines.append(f"paths:\n  /a:\n    get:\n      operationId: bomb\n"
                 f"      parameters: [{{name: q, in: query, schema: *l{levels}}}]\n")
    return "".join(lines)


def test_an_alias_bomb_is_refused_from_a_file_and_from_a_url(tmp_path: Path) -> None:
    (tmp_path / "bomb.yaml").write_text(_bomb(24), encoding="utf-8")
    by_file = _discover("--openapi", str(tmp_path / "bomb.yaml"))
    assert by_file.returncode == 1, by_file.stderr
    assert "the file holds more than 100,000 values" in json.loads(by_file.stdout)["unavailable"][0]
    port = free_port()
    argv = [PYTHON, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)]
    with background(argv):
        wait_for_port(port)
        by_url = _discover("--openapi", f"http://127.0.0.1:{port}/bomb.yaml", "--allow-private")
    assert by_url.returncode == 1, by_url.stderr
    assert "the file holds more than 100,000 values" in json.loads(by_url.stdout)["unavailable"][0]
    line = _one_line(_serve(tmp_path, {"name": "b", "file": str(tmp_path / "bomb.yaml")}))
    assert "bomb.yaml:" in line and "more than 100,000 values" in line


def test_a_spec_nested_deeper_than_the_bound_is_refused(tmp_path: Path) -> None:
    deep = "{a: " * 70 + "1" + "}" * 70
    (tmp_path / "deep.yaml").write_text(HEAD + f"x-deep: {deep}\npaths: {{}}\n", encoding="utf-8")
    result = _discover("--openapi", str(tmp_path / "deep.yaml"))
    assert "nests too deeply (more than 64 levels" in json.loads(result.stdout)["unavailable"][0]


def test_each_distinct_schema_is_checked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """2,000 operations sharing one schema of 100 alike properties: checking each tool's whole schema
    against the meta-schema took about 20 s; each distinct schema is checked once. Counted, not timed
    (the times are a benchmark's): a check per tool fails this at once."""
    from jsonschema import Draft202012Validator

    big = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "d" * 50} for i in range(100)}}
    paths = {
        f"/r{i}": {"post": {"operationId": f"post{i}",
                            "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Big"}}}}}}
        for i in range(2000)
    }
    document = {"openapi": "3.1.0", "info": {"title": "big", "version": "1"}, "paths": paths,
                "components": {"schemas": {"Big": big}}}
    spec = read_spec(document, "https://e.test/s", from_file=False)
    checked: list[object] = []
    iter_errors = Draft202012Validator.iter_errors

    def counting(self: Draft202012Validator, instance: object, *args: object, **kwargs: object) -> object:
        checked.append(instance)
        return iter_errors(self, instance, *args, **kwargs)

    monkeypatch.setattr(Draft202012Validator, "iter_errors", counting)
    tools, skipped = operation_tools(spec, "https://b.test")
    assert (len(tools), skipped) == (2000, [])
    # Each tool is {"body": {"$ref": "#/$defs/Big"}} with $defs/Big: two distinct pieces, each checked once.
    assert len(checked) == 2 and big in checked



# ------------------------------------------------------------------------------------------ one reading

SERVER = "http://127.0.0.1:9"


def _document(paths: dict[str, Any], servers: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"openapi": "3.1.0", "info": {"title": "t", "version": "1"},
            "servers": servers if servers is not None else [{"url": SERVER}], "paths": paths}


@pytest.mark.parametrize(("name", "text", "where"), [
    ("nan.json", '{"openapi":"3.1.0","info":{"title":"t","version":"1"},"paths":{"/a":{"get":{'
     '"parameters":[{"name":"q","in":"query","schema":{"type":"integer","maximum":1e400,"example":NaN}}]}}}}',
     "/paths/~1a/get/parameters/0/schema/"),
    ("inf.yaml", HEAD + "paths: {/a: {get: {parameters: [{name: q, in: query, schema: {maximum: .inf}}]}}}\n",
     "/paths/~1a/get/parameters/0/schema/maximum"),
])
def test_a_number_json_cannot_carry_is_a_load_error(tmp_path: Path, name: str, text: str, where: str) -> None:
    """NaN or 1e400 loaded silently made every tools/list (every upstream's) fail to encode."""
    (tmp_path / name).write_text(text, encoding="utf-8")
    entry = {"name": "n", "file": str(tmp_path / name), "backend_url": SERVER, "allow_private": True}
    line = _one_line(_serve(tmp_path, entry))
    assert f"openapi 'n': {tmp_path / name}: the number at {where}" in line
    assert "is not a finite double (NaN, Infinity, or too large)" in line


@pytest.mark.parametrize(("paths", "servers", "said"), [
    ({"/a": {"get": {"parameters": [{"$ref": "http://[::1"}]}}}, None,
     "the reference 'http://[::1' is not a valid URL (Invalid IPv6 URL)"),
    ({"/a": {"get": {}}}, [{"url": SERVER}, {"url": "http://[v1/"}],
     "servers[1]: the url is not a valid URL (Invalid IPv6 URL)"),
    ({"/a?admin=1": {"get": {}}}, None, "paths: '/a?admin=1' holds a query or a fragment"),
    ({"/a#x": {"get": {}}}, None, "paths: '/a#x' holds a query or a fragment"),
])
def test_a_malformed_url_or_a_path_with_a_query_is_a_located_load_error(
    tmp_path: Path, paths: dict[str, Any], servers: list[dict[str, Any]] | None, said: str
) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(_document(paths, servers)), encoding="utf-8")
    line = _one_line(_serve(tmp_path, {"name": "u", "file": str(spec), "backend_url": SERVER, "allow_private": True}))
    assert f"openapi 'u': {said}" in line
    found = _discover("--openapi", str(spec), "--allow-private")
    assert found.returncode == 1 and "Traceback" not in found.stderr, found.stderr
    assert said in json.loads(found.stdout)["unavailable"][0]


def test_a_dynamic_reference_that_resolves_nowhere_is_a_load_error(tmp_path: Path) -> None:
    """It was served, and every call then failed inside the validator (recorded as upstream_exited)."""
    body = {"content": {"application/json": {"schema": {"$dynamicRef": "#meta"}}}}
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(_document({"/a": {"post": {"requestBody": body}}})), encoding="utf-8")
    line = _one_line(_serve(tmp_path, {"name": "d", "file": str(spec), "allow_private": True}))
    assert "openapi 'd': paths[/a].post: the input schema's reference '#meta' at /properties/body/$dynamicRef" in line
    assert "points nowhere" in line
    # One that names a place is bundled as a $ref is, and served.
    document = _document({"/a": {"post": {"requestBody": {
        "content": {"application/json": {"schema": {"$dynamicRef": "#/components/schemas/S"}}}}}}})
    document["components"] = {"schemas": {"S": {"type": "string"}}}
    tools, skipped = operation_tools(read_spec(document, "https://e.test/s", from_file=False), SERVER)
    assert skipped == [] and tools[0].item["inputSchema"]["properties"]["body"] == {
        "$dynamicRef": "#/$defs/S", "description": "The JSON request body."}


def test_a_pattern_that_could_backtrack_without_end_is_not_served(tmp_path: Path) -> None:
    """``(a+)+$`` on a query parameter: one call of 30 characters held the whole gateway for 23 s."""
    parameter = {"name": "q", "in": "query", "schema": {"type": "string", "pattern": "(a+)+$"}}
    fine = {"name": "q", "in": "query", "schema": {"type": "string", "pattern": "^a+$"}}
    document = _document({"/pat": {"get": {"operationId": "pat", "parameters": [parameter]}},
                          "/ok": {"get": {"operationId": "ok", "parameters": [fine]}}})
    tools, skipped = operation_tools(read_spec(document, "https://e.test/s", from_file=False), SERVER)
    assert [tool.name for tool in tools] == ["ok"]
    assert skipped == ["GET /pat: its arguments cannot be checked safely (regex at /properties/q/pattern nests "
                       "repetition or alternation inside an unbounded repetition)"]


def test_the_spec_url_is_shown_without_its_credentials_or_query(tmp_path: Path) -> None:
    (tmp_path / "rel.yaml").write_text(
        "openapi: 3.1.0\ninfo: {title: t, version: '1'}\nservers: [{url: /api}]\npaths: {}\n", encoding="utf-8"
    )
    port = free_port()
    argv = [PYTHON, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)]
    with background(argv):
        wait_for_port(port)
        missing = _one_line(_serve(tmp_path, {
            "name": "a", "url": f"http://user:{SECRET}@127.0.0.1:{port}/nope.yaml?token={SECRET}Q", "allow_private": True,
        }))
        relative = _one_line(_serve(tmp_path, {
            "name": "a", "url": f"http://user:{SECRET}@127.0.0.1:{port}/rel.yaml", "allow_private": True,
        }))
    assert f"fetching http://127.0.0.1:{port}/nope.yaml answered HTTP 404" in missing and SECRET not in missing
    closed = free_port()
    unreachable = _one_line(_serve(tmp_path, {
        "name": "a", "url": f"http://user:{SECRET}@127.0.0.1:{closed}/s.yaml?token={SECRET}", "allow_private": True,
    }))
    assert f"cannot fetch http://127.0.0.1:{closed}/s.yaml: " in unreachable and SECRET not in unreachable
    # A relative server takes the configured url's credentials: the refusal says where they came from.
    assert "the spec's first server, read against the configured url (whose part it takes), holds credentials" in relative
    assert SECRET not in relative
