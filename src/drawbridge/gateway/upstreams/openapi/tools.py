"""OpenAPI operations as MCP tools: one tool per operation, named, described and typed from the spec.

Invariant: what an agent and a reviewer read about a tool is what a call does. Its ``inputSchema``
has exactly one property per parameter the call sends (path, query, header) and ``body`` for a JSON
request body, with no other property allowed; every call's arguments are checked against it before
anything is sent, as a policy's argument schema is (``policy.schemas.bounded_schema``): its regexes
checked at load (an operation with a ``pattern`` that could backtrack too much, ``(a+)+$``, is not
served, named with why), every ``pattern`` run bounded and charged to one regex budget per call, so
no argument stalls the gateway. A reference in it that does not resolve inside it (a ``$dynamicRef``
to an anchor no bundled schema declares) is a ``SpecError``: the spec does not load. Its description
ends with the method and the URL template the call goes to, so a changed backend or path is a changed
tool (and a changed pin). ``readOnlyHint`` is set for GET and HEAD, and the classification reads the
method (``catalogue.classify``).

Headers the gateway owns are no arguments. A header parameter named (in any case) like a header the
entry configures (``headers:``, the gateway's credentials) or like a header of the transport
(``TRANSPORT_HEADERS``: ``Host``, ``Content-Length``, ``Transfer-Encoding``, ``Connection`` and the
other hop-by-hop headers) is left out of the tool, as ``Authorization`` is (``spec.IGNORED_HEADERS``):
no argument can replace a configured credential or steer where and how the request goes.

Names. ``operationId`` in snake case (``listItems`` -> ``list_items``), else the method and the path
(``GET /items/{id}`` -> ``get_items_id``). Two operations of one spec with the same name are both
refused by the merged catalogue (``catalogue.merged``), never one of them picked.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final

from drawbridge.catalogue.classify import name_words
from drawbridge.gateway.upstreams.openapi.spec import Operation, Spec
from drawbridge.gateway.upstreams.openapi.spec_text import SpecError
from drawbridge.policy.globs import compile_glob

if TYPE_CHECKING:
    from drawbridge.policy.schemas import BoundedSchema

READ_ONLY_METHODS = frozenset({"GET", "HEAD"})
TRANSPORT_HEADERS: Final = frozenset({
    "host", "content-length", "transfer-encoding", "connection", "keep-alive", "proxy-connection", "te",
    "trailer", "upgrade", "expect", "proxy-authorization", "accept-encoding", "cookie",
})
"""Header parameters the HTTP client sets or owns (lower case): never taken from an agent's arguments.
``cookie`` is among them: the client's cookie handling is the gateway's, not the agent's."""


@dataclass(frozen=True)
class OperationTool:
    """One served operation: the tools/list item, the operation, the compiled argument check."""

    name: str
    item: Mapping[str, Any]
    operation: Operation
    validator: BoundedSchema


def tool_name(operation: Operation) -> str:
    if operation.operation_id is not None:
        words = name_words(operation.operation_id)
        if words:
            return "_".join(words)
    return "_".join((operation.method.lower(), *name_words(operation.path)))


def _described(schema: Any, description: str | None) -> Any:
    if description and isinstance(schema, Mapping) and "description" not in schema:
        return {**schema, "description": description}
    return schema


def without_owned_headers(operation: Operation, configured: Iterable[str]) -> Operation:
    """The operation without the header parameters the gateway owns (module docstring)."""
    owned = TRANSPORT_HEADERS | {name.lower() for name in configured}
    kept = tuple(p for p in operation.parameters if p.location != "header" or p.name.lower() not in owned)
    return operation if len(kept) == len(operation.parameters) else replace(operation, parameters=kept)


def input_schema(operation: Operation) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    required: list[str] = []
    for parameter in operation.parameters:
        properties[parameter.name] = _described(parameter.schema, parameter.description)
        if parameter.required:
            required.append(parameter.name)
    if operation.has_body:
        properties["body"] = _described(operation.body_schema, operation.body_description or "The JSON request body.")
        if operation.body_required:
            required.append("body")
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = required
    if operation.defs:
        schema["$defs"] = dict(operation.defs)
    return schema


def description(operation: Operation, backend_url: str) -> str:
    parts = [text for text in (operation.summary, operation.description) if text]
    parts.append(f"{operation.method} {backend_url.rstrip('/')}{operation.path}")
    return "\n\n".join(parts)


class _SchemaChecks:
    """Where an ``inputSchema`` breaks the JSON Schema meta-schema. Each property and each ``$defs``
    entry is checked on its own (the meta-schema applies to them as to a whole schema), and each
    distinct one once: a spec's tools share most of their schemas, and checking every tool's whole
    schema made a spec of 6,000 operations take a minute to load. A problem names the place and the
    rule broken, never a value: a schema may come from a file beside the spec."""

    def __init__(self) -> None:
        from jsonschema import Draft202012Validator

        self._meta = Draft202012Validator(
            Draft202012Validator.META_SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER
        )
        self._seen: dict[str, str | None] = {}

    def problem(self, schema: Mapping[str, Any]) -> str | None:
        from jsonschema.exceptions import best_match

        for section in ("properties", "$defs"):
            for member, piece in schema.get(section, {}).items():
                key = json.dumps(piece, sort_keys=True, default=str)
                if key not in self._seen:
                    error = best_match(self._meta.iter_errors(piece))
                    self._seen[key] = None if error is None else "".join(
                        [*(f"/{part}" for part in error.absolute_path), f" (breaks {error.validator!r})"]
                    )
                if self._seen[key] is not None:
                    return f"{section}/{member}{self._seen[key]}"
        return None


def operation_tools(
    spec: Spec, backend_url: str, include: Sequence[str] = (), configured_headers: Iterable[str] = ()
) -> tuple[list[OperationTool], list[str]]:
    """The tools of a spec (only those whose name matches an ``include`` glob, when given), and the
    operations left out with why. ``configured_headers``: the names of the headers the entry sends.
    Raises ``SpecError`` for a reference that resolves nowhere in a tool's ``inputSchema``."""
    # imported where the tools are built: only serve with openapi needs jsonschema
    from drawbridge.policy.schemas import ReferenceLoadError, SchemaLoadError, bounded_schema

    globs = [compile_glob(pattern) for pattern in include]
    tools: list[OperationTool] = []
    skipped = list(spec.skipped)
    checks = _SchemaChecks()
    names = [tool_name(operation) for operation in spec.operations]
    configured = tuple(configured_headers)
    for declared, name in zip(spec.operations, names, strict=True):
        operation = without_owned_headers(declared, configured)
        if globs and not any(glob.matches(name) for glob in globs):
            continue
        if names.count(name) > 1:
            skipped.append(f"{operation.method} {operation.path}: another operation has the same tool name {name!r}")
            continue
        schema = input_schema(operation)
        problem = checks.problem(schema)
        if problem is not None:
            skipped.append(f"{operation.method} {operation.path}: its parameters' schemas are invalid (at {problem[:200]})")
            continue
        try:
            validator = bounded_schema(schema)
        except ReferenceLoadError as exc:
            where = f"paths[{operation.path}].{operation.method.lower()}"
            raise SpecError(f"{where}: the input schema's {exc}") from None
        except SchemaLoadError as exc:
            skipped.append(
                f"{operation.method} {operation.path}: its arguments cannot be checked safely ({exc})"
            )
            continue
        item: dict[str, Any] = {
            "name": name,
            "description": description(operation, backend_url),
            "inputSchema": schema,
        }
        if operation.method in READ_ONLY_METHODS:
            item["annotations"] = {"readOnlyHint": True}
        tools.append(OperationTool(name, item, operation, validator))
    return tools, skipped


__all__ = [
    "READ_ONLY_METHODS",
    "TRANSPORT_HEADERS",
    "OperationTool",
    "description",
    "input_schema",
    "operation_tools",
    "tool_name",
    "without_owned_headers",
]
