"""Classification: every signal of the signal table, whole words, the restrictive rule, reasons."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drawbridge.catalogue import (
    Access,
    Classification,
    Family,
    Reason,
    ReasonCode,
    classify_tool,
    is_dispatcher_name,
    name_words,
)
from drawbridge.catalogue.classify import SIGNALS, Effect


def tool(name: str, properties: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    item: dict[str, Any] = {"name": name, "inputSchema": {"type": "object", "properties": properties or {}}}
    item.update(extra)
    return item


def reasons(c: Classification) -> list[tuple[str, str | None, str]]:
    return [(r.code.value, r.subject, r.text) for r in c.reasons]


# ------------------------------------------------------------------------------------ whole words


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("list_repos", ("list", "repos")),
        ("get-env", ("get", "env")),
        ("listRepos", ("list", "repos")),
        ("HTTPGetRequest", ("http", "get", "request")),
        ("git.show", ("git", "show")),
        ("terraform.__dispatch", ("terraform", "dispatch")),
        ("s3_put_object2", ("s3", "put", "object2")),
        ("target", ("target",)),
        ("SEND", ("send",)),
    ],
)
def test_name_words(name: str, words: tuple[str, ...]) -> None:
    assert name_words(name) == words


@pytest.mark.parametrize(
    "name", ["target_info", "running_jobs", "budget", "forgetful", "listing", "sender", "rerunnable"]
)
def test_a_verb_inside_a_word_is_not_a_signal(name: str) -> None:
    c = classify_tool(tool(name))
    assert (c.family, c.access) == (Family.NAMED, Access.UNKNOWN)
    assert reasons(c) == [("no_signal", None, "no signal")]


# ------------------------------------------------------------------------------- each signal alone


def test_read_verb() -> None:
    c = classify_tool(tool("gmail_list_emails"))
    assert (c.family, c.access) == (Family.NAMED, Access.READ)
    assert reasons(c) == [("name_verb_read", "list", 'name verb "list"')]


def test_write_verb_in_the_shape_of_the_page() -> None:
    c = classify_tool(tool("gmail_send_email"))
    assert c.as_dict() == {"family": "named", "access": "write", "reasons": ['name verb "send"']}


def test_camel_case_verb() -> None:
    c = classify_tool(tool("deleteMessage"))
    assert c.access is Access.WRITE
    assert c.codes == (ReasonCode.NAME_VERB_WRITE,)


def test_repeated_verb_is_one_reason() -> None:
    c = classify_tool(tool("get_or_get"))
    assert reasons(c) == [("name_verb_read", "get", 'name verb "get"')]


@pytest.mark.parametrize(
    ("annotations", "access", "expected"),
    [
        (
            {"readOnlyHint": True},
            Access.READ,
            [("annotation_read_only", "readOnlyHint", "annotation readOnlyHint: true")],
        ),
        (
            {"readOnlyHint": False},
            Access.WRITE,
            [("annotation_not_read_only", "readOnlyHint", "annotation readOnlyHint: false")],
        ),
        (
            {"destructiveHint": True},
            Access.WRITE,
            [("annotation_destructive", "destructiveHint", "annotation destructiveHint: true")],
        ),
        ({"destructiveHint": False, "idempotentHint": True, "openWorldHint": True}, Access.UNKNOWN, None),
        ({"readOnlyHint": "true"}, Access.UNKNOWN, None),
        ({"readOnlyHint": 1}, Access.UNKNOWN, None),
    ],
)
def test_annotations(annotations: dict[str, Any], access: Access, expected: list[Any] | None) -> None:
    c = classify_tool(tool("echo", annotations=annotations))
    assert c.access is access
    assert c.family is Family.NAMED
    assert reasons(c) == (expected or [("no_signal", None, "no signal")])


def test_annotations_that_are_not_an_object_are_no_signal() -> None:
    assert classify_tool(tool("echo", annotations=["readOnlyHint"])).access is Access.UNKNOWN


def test_spec_default_destructive_hint_makes_a_claimed_read_a_write() -> None:
    """Servers that send the specification's defaults on every tool classify as writes (the page says so)."""
    c = classify_tool(tool("list_things", annotations={"readOnlyHint": True, "destructiveHint": True}))
    assert c.access is Access.WRITE
    assert {r.effect for r in c.reasons} >= {Effect.READ, Effect.WRITE}  # both fired; write won
    assert c.codes == (
        ReasonCode.ANNOTATION_READ_ONLY,
        ReasonCode.ANNOTATION_DESTRUCTIVE,
        ReasonCode.NAME_VERB_READ,
    )


@pytest.mark.parametrize(
    ("method", "access", "code", "text"),
    [
        ("GET", Access.READ, "http_method_read", "HTTP method GET"),
        ("head", Access.READ, "http_method_read", "HTTP method HEAD"),
        ("Options", Access.READ, "http_method_read", "HTTP method OPTIONS"),
        ("POST", Access.WRITE, "http_method_write", "HTTP method POST"),
        ("put", Access.WRITE, "http_method_write", "HTTP method PUT"),
        ("PATCH", Access.WRITE, "http_method_write", "HTTP method PATCH"),
        ("DELETE", Access.WRITE, "http_method_write", "HTTP method DELETE"),
        ("BREW", Access.WRITE, "http_method_write", "HTTP method BREW"),
        ("G\u0435T", Access.WRITE, "http_method_write", "HTTP method (not a plain method name)"),
        ("GET; rm -rf /", Access.WRITE, "http_method_write", "HTTP method (not a plain method name)"),
        ("opt\u0131ons", Access.WRITE, "http_method_write", "HTTP method (not a plain method name)"),
        ("", Access.WRITE, "http_method_write", "HTTP method (not a plain method name)"),
    ],
)
def test_openapi_method(method: str, access: Access, code: str, text: str) -> None:
    c = classify_tool(tool("pets_handler"), source="openapi", openapi_method=method)
    assert c.access is access
    assert [(r.code.value, r.text) for r in c.reasons] == [(code, text)]


def test_get_method_loses_to_a_write_verb_in_the_name() -> None:
    c = classify_tool(tool("delete_pet"), source="openapi", openapi_method="GET")
    assert c.access is Access.WRITE
    assert c.codes == (ReasonCode.HTTP_METHOD_READ, ReasonCode.NAME_VERB_WRITE)


@pytest.mark.parametrize(
    "argument", ["code", "script", "sql", "command", "cmd", "statement", "program", "expression"]
)
def test_generic_argument_names(argument: str) -> None:
    c = classify_tool(tool("do_it", {argument: {"type": "string"}}))
    assert c.family is Family.GENERIC
    assert c.access is Access.UNKNOWN
    assert reasons(c) == [("generic_argument", argument, f'string argument "{argument}"')]


@pytest.mark.parametrize(
    ("name", "schema", "generic"),
    [
        ("SQL", {"type": "string"}, True),
        ("Code", {"type": "string"}, True),
        ("code", {}, True),
        ("code", True, True),
        ("code", {"type": ["string", "null"]}, True),
        ("code", {"anyOf": [{"type": "integer"}, {"type": "string"}]}, True),
        ("code", {"oneOf": [{"type": "integer"}, {"$ref": "#/$defs/x"}]}, True),
        ("code", {"enum": [1, "a"]}, True),
        ("code", {"const": "x"}, True),
        ("code", {"type": "integer"}, False),
        ("code", {"type": ["integer", "null"]}, False),
        ("code", {"anyOf": [{"type": "integer"}, {"type": "null"}]}, False),
        ("code", {"enum": [1, 2]}, False),
        ("code", {"const": 7}, False),
        ("code", False, False),
        ("zip_code", {"type": "string"}, False),
        ("source_code_url", {"type": "string"}, False),
        ("commands", {"type": "string"}, False),
    ],
)
def test_generic_argument_must_be_the_whole_name_and_may_be_a_string(
    name: str, schema: Any, generic: bool
) -> None:
    c = classify_tool(tool("handle", {name: schema}))
    assert (c.family is Family.GENERIC) is generic


def test_generic_argument_with_unreadable_schema_nesting_stays_generic() -> None:
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(100):
        schema = {"anyOf": [schema]}
    assert classify_tool(tool("handle", {"code": schema})).family is Family.GENERIC


@pytest.mark.parametrize(
    ("name", "generic", "subject"),
    [
        ("run_query", True, "run"),
        ("execute_sql", True, "execute"),
        ("sql", True, "sql"),
        ("db.exec", True, "exec"),
        ("search", False, None),
        ("rerun_report", False, None),
    ],
)
def test_query_argument_on_an_executor(name: str, generic: bool, subject: str | None) -> None:
    c = classify_tool(tool(name, {"query": {"type": "string"}}))
    assert (c.family is Family.GENERIC) is generic
    found = [r for r in c.reasons if r.code is ReasonCode.QUERY_ON_EXECUTOR]
    if generic:
        text = f'argument "query" on a tool whose name says "{subject}"'
        assert [(r.subject, r.text) for r in found] == [(subject, text)]
    else:
        assert found == []


def test_execute_sql_lists_every_signal() -> None:
    c = classify_tool(tool("execute_sql", {"sql": {"type": "string"}, "query": {"type": "string"}}))
    assert (c.family, c.access) == (Family.GENERIC, Access.WRITE)
    assert c.codes == (ReasonCode.GENERIC_ARGUMENT, ReasonCode.QUERY_ON_EXECUTOR, ReasonCode.NAME_VERB_WRITE)


def test_generic_read_is_still_generic() -> None:
    """A read-only SQL tool is a generic read: its argument still carries the meaning."""
    c = classify_tool(tool("query_db", {"sql": {"type": "string"}}, annotations={"readOnlyHint": True}))
    assert (c.family, c.access) == (Family.GENERIC, Access.READ)
    assert not c.is_named_read


def test_composite_tool_classifies_as_named() -> None:
    properties = {"origin": {"type": "string"}, "destination": {"type": "string"}}
    c = classify_tool(tool("analyze_commute", properties))
    assert (c.family, c.access) == (Family.NAMED, Access.UNKNOWN)


# ------------------------------------------------------------------- arguments at every depth

FASTMCP_REPORT: dict[str, Any] = {
    # the shape FastMCP/pydantic lists for `def get_report(params: P)`
    "type": "object",
    "properties": {"params": {"$ref": "#/$defs/P"}},
    "required": ["params"],
    "$defs": {"P": {"type": "object", "properties": {"sql": {"type": "string"}}, "title": "P"}},
}


@pytest.mark.parametrize(
    ("schema", "argument"),
    [
        (FASTMCP_REPORT, "sql"),
        ({"properties": {"p": {"$ref": "#/definitions/P"}},
          "definitions": {"P": {"properties": {"code": {"type": "string"}}}}}, "code"),
        ({"type": "object", "allOf": [{"properties": {"code": {"type": "string"}}}]}, "code"),
        ({"anyOf": [{"properties": {"x": {}}}, {"properties": {"script": {"type": "string"}}}]}, "script"),
        ({"properties": {"p": {"oneOf": [{"type": "null"}, {"$ref": "#/$defs/P"}]}},
          "$defs": {"P": {"properties": {"command": {"type": "string"}}}}}, "command"),
        ({"properties": {"outer": {"type": "object", "properties": {"inner": {"properties": {"cmd": {}}}}}}}, "cmd"),
        ({"properties": {"batch": {"type": "array", "items": {"properties": {"statement": {"type": "string"}}}}}},
         "statement"),
        ({"properties": {"p": {"$ref": "#/$defs/a~1b%20c"}},
          "$defs": {"a/b c": {"properties": {"program": {"type": "string"}}}}}, "program"),
        ({"properties": {"code": {"$ref": "#/$defs/Code"}}, "$defs": {"Code": {"type": "string"}}}, "code"),
        ({"$ref": "#/$defs/Root", "$defs": {"Root": {"properties": {"expression": {"type": "string"}}}}}, "expression"),
    ],
    ids=["fastmcp-defs", "definitions", "allOf", "anyOf", "oneOf-ref", "nested", "items", "escaped-pointer",
         "ref-to-string", "root-ref"],
)
def test_a_generic_argument_is_found_at_any_depth(schema: dict[str, Any], argument: str) -> None:
    c = classify_tool({"name": "get_report", "inputSchema": schema, "annotations": {"readOnlyHint": True}})
    assert (c.family, c.access) == (Family.GENERIC, Access.READ)
    assert reasons(c)[0] == ("generic_argument", argument, f'string argument "{argument}"')
    assert not c.is_named_read


def test_a_query_argument_at_any_depth_on_an_executor() -> None:
    schema = {"properties": {"p": {"$ref": "#/$defs/P"}}, "$defs": {"P": {"properties": {"query": {"type": "string"}}}}}
    assert classify_tool({"name": "run_report", "inputSchema": schema}).codes[0] is ReasonCode.QUERY_ON_EXECUTOR


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        ({"properties": {"p": {"$ref": "https://example.com/p.json"}}}, "a $ref outside the schema"),
        ({"properties": {"p": {"$ref": "other.json#/P"}}}, "a $ref outside the schema"),
        ({"properties": {"p": {"$ref": "#P"}}}, "a $ref outside the schema"),
        ({"properties": {"p": {"$ref": "#/$defs/Missing"}}, "$defs": {}}, "a $ref that does not resolve"),
        ({"properties": {"p": {"$dynamicRef": "#node"}}}, "a dynamic $ref"),
        ({"allOf": [{"$ref": 7}]}, "a $ref outside the schema"),
    ],
)
def test_a_schema_that_cannot_be_followed_is_generic(schema: dict[str, Any], why: str) -> None:
    c = classify_tool({"name": "list_things", "inputSchema": schema})
    assert (c.family, c.access) == (Family.GENERIC, Access.READ)
    assert reasons(c)[0] == ("schema_not_followed", why, f"argument schema not followed: {why}")


def test_a_schema_nested_too_deep_is_generic() -> None:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(40):
        schema = {"type": "object", "properties": {"a": schema}}
    c = classify_tool({"name": "get_x", "inputSchema": schema})
    assert c.family is Family.GENERIC and c.codes[0] is ReasonCode.SCHEMA_NOT_FOLLOWED
    assert c.reason_texts[0] == "argument schema not followed: nested deeper than 32"


def test_reference_cycles_end_and_harmless_references_stay_named() -> None:
    tree = {"$defs": {"Node": {"properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
                                               "label": {"type": "string"}}}},
            "properties": {"root": {"$ref": "#/$defs/Node"}, "again": {"$ref": "#"}}}
    assert classify_tool({"name": "get_tree", "inputSchema": tree}).is_named_read
    typed = {"properties": {"code": {"$ref": "#/$defs/Zip"}}, "$defs": {"Zip": {"type": "integer"}}}
    assert classify_tool({"name": "get_city", "inputSchema": typed}).is_named_read
    # shared definitions are read once, not once per path (8**15 paths within the depth bound)
    chain = {f"D{i}": {"allOf": [{"$ref": f"#/$defs/D{i + 1}"}] * 8} for i in range(30)}
    chain["D30"] = {"type": "integer"}
    wide = {"properties": {"code": {"$ref": "#/$defs/D0"}}, "$defs": chain}
    c = classify_tool({"name": "get_y", "inputSchema": wide})
    assert c.family is Family.GENERIC  # 60 hops deep: not followed to the end, so generic


# ---------------------------------------------------------------------------------- CLI dispatcher

DISPATCH_PARAMS = {
    "command": {"type": "string"},
    "args": {"type": "array", "items": {"type": "string"}},
    "flags": {"type": "object"},
    "stdin": {"type": "string"},
}
CLI_CATALOGUE: list[tuple[dict[str, Any], bool, Family, Access, list[str]]] = [
    # (tool as the gateway lists it, declared a dispatcher, family, access, reason codes)
    (
        {"name": "terraform.__dispatch", "description": "Run terraform <command> (any subcommand)",
         "inputSchema": {"type": "object", "properties": DISPATCH_PARAMS, "required": ["command"]}},
        True, Family.GENERIC, Access.UNKNOWN, ["cli_dispatcher", "generic_argument"],
    ),
    (
        {"name": "terraform.plan", "description": "Run terraform plan",
         "inputSchema": {"type": "object",
                         "properties": {k: v for k, v in DISPATCH_PARAMS.items() if k != "command"}}},
        False, Family.NAMED, Access.UNKNOWN, ["no_signal"],
    ),
    (
        {"name": "terraform.apply", "description": "Run terraform apply",
         "inputSchema": {"type": "object", "properties": {"args": {"type": "array"}}}},
        False, Family.NAMED, Access.WRITE, ["name_verb_write"],
    ),
    (
        {"name": "kubectl.get", "description": "Run kubectl get",
         "inputSchema": {"type": "object", "properties": {}}},
        False, Family.NAMED, Access.READ, ["name_verb_read"],
    ),
    (
        {"name": "jq.run", "description": "Run jq",
         "inputSchema": {"type": "object", "properties": {"args": {"type": "array"}}}},
        False, Family.NAMED, Access.WRITE, ["name_verb_write"],
    ),
    (
        # a dispatcher under another spelling, known only from the configuration
        {"name": "gh.any", "inputSchema": {"type": "object", "properties": {"args": {"type": "array"}}}},
        True, Family.GENERIC, Access.UNKNOWN, ["cli_dispatcher"],
    ),
]


@pytest.mark.parametrize(
    ("item", "dispatcher", "family", "access", "codes"),
    CLI_CATALOGUE,
    ids=[row[0]["name"] for row in CLI_CATALOGUE],
)
def test_cli_catalogue(
    item: dict[str, Any], dispatcher: bool, family: Family, access: Access, codes: list[str]
) -> None:
    c = classify_tool(item, source="cli", cli_dispatcher=dispatcher)
    assert (c.family, c.access) == (family, access)
    assert [code.value for code in c.codes] == codes


@pytest.mark.parametrize("command", ["show", "fetch", "describe", "log"])
def test_a_cli_command_without_allowed_args_is_generic(command: str) -> None:
    """``git show --output=FILE`` writes and ``git fetch --upload-pack=CMD`` runs a program: with any flag
    allowed the arguments carry the effect, whatever the subcommand's verb says."""
    item = {"name": command, "inputSchema": {"type": "object", "properties": {"args": {"type": "array"}}}}
    free = classify_tool(item, source="cli", cli_free_arguments=True)
    assert free.family is Family.GENERIC and not free.is_named_read
    assert reasons(free)[0] == ("cli_free_arguments", None, "CLI command without allowed_args")
    listed = classify_tool(item, source="cli")
    assert listed.family is Family.NAMED and ReasonCode.CLI_FREE_ARGUMENTS not in listed.codes


def test_fetch_is_a_write_verb() -> None:
    """Fetching stores what it brought (``git fetch`` writes refs): never a read, even when claimed."""
    c = classify_tool(tool("fetch_updates", annotations={"readOnlyHint": True}))
    assert c.access is Access.WRITE
    assert reasons(c)[-1] == ("name_verb_write", "fetch", 'name verb "fetch"')


def test_dispatcher_name_is_generic_whatever_the_flag_or_source() -> None:
    assert is_dispatcher_name("terraform.__dispatch")
    assert is_dispatcher_name("__dispatch")
    assert not is_dispatcher_name("terraform.__dispatcher")
    assert not is_dispatcher_name("terraform.__dispatch.x")
    for source in ("cli", "mcp"):
        c = classify_tool({"name": "terraform.__dispatch"}, source=source)  # type: ignore[arg-type]
        assert c.family is Family.GENERIC
        assert c.reasons[0].text == "CLI dispatcher"


# --------------------------------------------------------------------------- restrictive resolution


def test_one_write_signal_outweighs_every_read_signal() -> None:
    c = classify_tool(
        tool("get_list_show_and_send", annotations={"readOnlyHint": True}),
        source="openapi",
        openapi_method="GET",
    )
    assert c.access is Access.WRITE
    assert {r.effect for r in c.reasons} >= {Effect.READ, Effect.WRITE}  # both fired; write won
    effects = [r.effect for r in c.reasons]
    assert effects.count(Effect.READ) == 5 and effects.count(Effect.WRITE) == 1


def test_no_signal_at_all() -> None:
    c = classify_tool({"name": "docker.ps"})
    assert (c.family, c.access) == (Family.NAMED, Access.UNKNOWN)
    assert c.as_dict() == {"family": "named", "access": "unknown", "reasons": ["no signal"]}
    assert [r.as_dict() for r in c.reasons] == [{"code": "no_signal", "effect": "none", "subject": None, "text": "no signal"}]


def test_summary_line() -> None:
    c = classify_tool(tool("delete_repo", annotations={"readOnlyHint": False, "destructiveHint": True}))
    assert c.summary() == (
        '[named, write] annotation readOnlyHint: false; annotation destructiveHint: true; name verb "delete"'
    )


# ------------------------------------------------------------------------------- contract of values


def test_classification_cannot_claim_what_its_reasons_do_not_say() -> None:
    write = Reason(ReasonCode.NAME_VERB_WRITE, 'name verb "send"', "send")
    read = Reason(ReasonCode.NAME_VERB_READ, 'name verb "get"', "get")
    generic = Reason(ReasonCode.CLI_DISPATCHER, "CLI dispatcher")
    Classification(Family.NAMED, Access.WRITE, (read, write))
    with pytest.raises(ValueError, match="access"):
        Classification(Family.NAMED, Access.READ, (read, write))
    with pytest.raises(ValueError, match="family"):
        Classification(Family.NAMED, Access.UNKNOWN, (generic,))
    with pytest.raises(ValueError, match="at least one reason"):
        Classification(Family.NAMED, Access.UNKNOWN, ())
    with pytest.raises(ValueError, match="no signal"):
        Classification(Family.NAMED, Access.READ, (read, Reason(ReasonCode.NO_SIGNAL, "no signal")))
    with pytest.raises(ValueError):
        Reason("name_verb_read", "x")  # type: ignore[arg-type]


def test_signal_table_covers_every_code() -> None:
    assert {s.code for s in SIGNALS} == set(ReasonCode)
    assert len(SIGNALS) == len(ReasonCode)


@pytest.mark.parametrize(
    ("item", "kwargs", "match"),
    [
        ({"name": "x"}, {"source": "grpc"}, "unknown tool source"),
        ({"name": "x"}, {"source": "mcp", "openapi_method": "GET"}, "openapi_method"),
        ({"name": "x"}, {"source": "openapi", "openapi_method": 5}, "openapi_method"),
        ({"name": "x"}, {"source": "mcp", "cli_dispatcher": True}, "cli_dispatcher"),
        ({"name": "x"}, {"source": "openapi", "cli_free_arguments": True}, "cli_free_arguments"),
        ({"description": "no name"}, {}, "name"),
        ({"name": ""}, {}, "name"),
        ({"name": 3}, {}, "name"),
        (["name", "x"], {}, "JSON object"),
    ],
)
def test_caller_errors_raise(item: Any, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        classify_tool(item, **kwargs)


def test_malformed_input_schema_gives_no_argument_signal() -> None:
    schemas = (None, "object", {"properties": ["code"]}, {"properties": {"code": {"type": "integer"}, 5: {}}})
    for schema in schemas:
        c = classify_tool({"name": "handle", "inputSchema": schema})
        assert c.family is Family.NAMED


# ------------------------------------------------------------------------------------- properties

READ_WORDS = ["get", "list", "search", "read", "show"]
WRITE_WORDS = ["create", "send", "delete", "write", "execute", "run"]
FILLER = ["repo", "issue", "user", "file", "target", "running", "budget", "SECRETMARKER"]


@st.composite
def built_tools(draw: st.DrawFn) -> tuple[dict[str, Any], bool, bool, bool]:
    """A tool with known signals: (tool, has read signal, has write signal, is generic)."""
    words = draw(st.lists(st.sampled_from(READ_WORDS + WRITE_WORDS + FILLER), max_size=5))
    separator = draw(st.sampled_from(["_", "-", "."]))
    name = separator.join(words) or "SECRETMARKER"
    annotations: dict[str, Any] = {}
    read_only = draw(st.sampled_from([None, True, False]))
    destructive = draw(st.sampled_from([None, True, False]))
    if read_only is not None:
        annotations["readOnlyHint"] = read_only
    if destructive is not None:
        annotations["destructiveHint"] = destructive
    code_arg = draw(st.booleans())
    properties = {"SECRETMARKER_arg": {"type": "string", "description": "SECRETMARKER"}}
    if code_arg:
        properties["script"] = {"type": "string"}
    item = {"name": name, "description": "SECRETMARKER", "annotations": annotations,
            "inputSchema": {"type": "object", "properties": properties}}
    has_read = read_only is True or any(w in READ_WORDS for w in words)
    has_write = read_only is False or destructive is True or any(w in WRITE_WORDS for w in words)
    return item, has_read, has_write, code_arg


@settings(max_examples=300, deadline=None)
@given(built_tools())
def test_restrictive_rule_holds_for_every_mix_of_signals(
    case: tuple[dict[str, Any], bool, bool, bool],
) -> None:
    item, has_read, has_write, generic = case
    c = classify_tool(item)
    expected = Access.WRITE if has_write else Access.READ if has_read else Access.UNKNOWN
    assert c.access is expected
    assert c.family is (Family.GENERIC if generic else Family.NAMED)
    assert c.reasons
    if not (has_read or has_write or generic):
        assert c.codes == (ReasonCode.NO_SIGNAL,)
    for text in c.reason_texts:
        assert text.isascii() and text.isprintable()
        assert "SECRETMARKER" not in text.upper()


@settings(max_examples=200, deadline=None)
@given(built_tools())
def test_adding_a_write_signal_never_leaves_a_read(case: tuple[dict[str, Any], bool, bool, bool]) -> None:
    item = dict(case[0])
    item["annotations"] = {**item["annotations"], "destructiveHint": True}
    assert classify_tool(item).access is Access.WRITE


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=40))
def test_any_name_classifies_with_safe_reasons(name: str) -> None:
    c = classify_tool({"name": name})
    assert c.reasons
    for text in c.reason_texts:
        assert text.isascii() and text.isprintable()
