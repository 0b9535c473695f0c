"""A tool's declared argument schema, compiled and checked as the reference does (evidence-formats.md §2.7).

Invariant: arguments are ``VALID`` or ``INVALID`` only against a schema compiled the way the
reference's ``jsonschema`` crate compiles it; a schema it would not compile -- or that only fails
while validating -- is ``MALFORMED``, never a verdict on the arguments.

Theory of operation. The schema check prepares the tool's schema with the policy's shared
``schemas["$defs"]`` (not a mapping -> malformed; copied into a schema without
``$defs``; merged into a local ``$defs`` mapping, where an overlapping name or a
non-mapping local ``$defs`` is malformed; for a boolean schema the shared
definitions must compile on their own), then compiles it as the reference's
``jsonschema`` crate does: dialect from ``$schema`` (2020-12 when absent; an
unknown dialect is malformed), the schema checked against its meta-schema, no
retrieval at all (an empty ``referencing.Registry``), and every ``$ref`` /
``$dynamicRef`` in the schema resolved *before* validation, because the
reference resolves them at compile time: a remote or unresolvable reference is
malformed even where the arguments never reach it. (We resolve references in
every subschema, including unreferenced ``$defs`` entries, which the reference
may skip for local references: where the two differ we say ``invalid``, the
fail-closed side.) Formats assert for drafts 4/6/7 only, as in the reference.
Regex dialects differ between Python's ``re`` and the reference's engine beyond
the committed vectors (7.1); a pattern Python cannot compile is malformed.

Compiled validators are kept by the schema's sorted JSON text (a bounded cache), so equal
schemas compile once; ``check_args`` takes a per-policy memo of validators by tool as well.
jsonschema is imported with the first schema compiled (a gateway whose policies declare none never
loads it).
"""

from __future__ import annotations

import enum
import functools
import json
from collections.abc import Mapping
from typing import Any

__all__ = ["ArgsCheck", "check_args"]


class ArgsCheck(enum.Enum):
    """Outcome of checking arguments against the declared per-tool schema."""

    NO_SCHEMA = "no_schema"
    VALID = "valid"
    INVALID = "invalid"
    MALFORMED = "malformed"


class _Malformed(Exception):
    pass


@functools.cache
def _dialects() -> tuple[dict[str, tuple[type, Any]], tuple[type, ...]]:
    """The validator class and referencing specification of each ``$schema`` URI; the classes whose
    formats assert."""
    import referencing.jsonschema as specs
    from jsonschema import (
        Draft4Validator,
        Draft6Validator,
        Draft7Validator,
        Draft201909Validator,
        Draft202012Validator,
    )

    dialects: dict[str, tuple[type, Any]] = {}
    for cls, spec, uris in (
        (Draft202012Validator, specs.DRAFT202012, ("https://json-schema.org/draft/2020-12/schema",)),
        (Draft201909Validator, specs.DRAFT201909, ("https://json-schema.org/draft/2019-09/schema",)),
        (Draft7Validator, specs.DRAFT7, ("https://json-schema.org/draft-07/schema",)),
        (Draft6Validator, specs.DRAFT6, ("https://json-schema.org/draft-06/schema",)),
        (Draft4Validator, specs.DRAFT4, ("https://json-schema.org/draft-04/schema",)),
    ):
        for uri in uris:
            dialects[uri] = (cls, spec)
            dialects["http://" + uri.removeprefix("https://")] = (cls, spec)
    return dialects, (Draft4Validator, Draft6Validator, Draft7Validator)


def _dialect(schema: Any) -> tuple[type, Any]:
    if isinstance(schema, dict) and isinstance(schema.get("$schema"), str):
        found = _dialects()[0].get(schema["$schema"].rstrip("#"))
        if found is None:
            raise _Malformed("unknown $schema dialect")
        return found
    # A non-string $schema keeps the default dialect and fails the meta-schema check.
    return _dialects()[0]["https://json-schema.org/draft/2020-12/schema"]


def _resolve_every_reference(schema: Any, specification: Any) -> None:
    """Resolve each $ref/$dynamicRef in every subschema, as a compile-time resolver would."""
    from jsonschema_specifications import REGISTRY as _META_SCHEMAS

    root = specification.create_resource(schema)
    stack = [(_META_SCHEMAS.resolver_with_root(root), root)]
    while stack:
        resolver, resource = stack.pop()
        resolver = resolver.in_subresource(resource)
        contents = resource.contents
        if isinstance(contents, dict):
            for keyword in ("$ref", "$dynamicRef"):
                reference = contents.get(keyword)
                if isinstance(reference, str):
                    resolver.lookup(reference)  # raises Unresolvable
        stack.extend((resolver, sub) for sub in resource.subresources())


@functools.lru_cache(maxsize=512)
def _compiled(schema_key: str) -> Any:
    """A validator for the schema spelled by ``schema_key``, or ``None`` if it is malformed."""
    from referencing import Registry

    schema = json.loads(schema_key)
    try:
        cls, specification = _dialect(schema)
        cls.check_schema(schema)
        _resolve_every_reference(schema, specification)
        format_checker = cls.FORMAT_CHECKER if cls in _dialects()[1] else None
        return cls(schema, registry=Registry(), format_checker=format_checker)
    except Exception:  # any failure to compile is a malformed declaration
        return None


def _json_text(value: Any, *, sort_keys: bool = False) -> str:
    try:
        return json.dumps(value, sort_keys=sort_keys, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:  # not a JSON value: cannot be a schema
        raise _Malformed("schema is not a JSON value") from exc


def _json_copy(value: Any) -> Any:
    return json.loads(_json_text(value))


def _compile(schema: Any) -> Any:
    validator = _compiled(_json_text(schema, sort_keys=True))
    if validator is None:
        raise _Malformed("schema does not compile")
    return validator


def _prepare(schemas: Mapping[str, Any], tool_name: str) -> Any:
    schema = _json_copy(schemas[tool_name])  # a private copy to merge into
    if "$defs" not in schemas:
        return schema
    shared = schemas["$defs"]
    if not isinstance(shared, dict):
        raise _Malformed("shared $defs must be a mapping")
    if isinstance(schema, dict):
        if "$defs" not in schema:
            schema["$defs"] = _json_copy(shared)
            return schema
        local = schema["$defs"]
        if not isinstance(local, dict):
            raise _Malformed("tool-local $defs must be a mapping")
        for name, definition in shared.items():
            if name in local:
                raise _Malformed("shared and tool-local $defs entries must not overlap")
            local[name] = _json_copy(definition)
    elif isinstance(schema, bool):
        _compile({"$defs": shared})
    return schema


def _validator_for(schemas: Mapping[str, Any], tool_name: str) -> Any:
    """The compiled validator of ``tool_name``'s schema (present, not ``$defs``), or None if malformed."""
    try:
        return _compile(_prepare(schemas, tool_name))
    except _Malformed:
        return None


def check_args(
    schemas: Mapping[str, Any], tool_name: str, instance: Any, validators: dict[str, Any] | None = None
) -> ArgsCheck:
    if tool_name == "$defs" or tool_name not in schemas:
        return ArgsCheck.NO_SCHEMA
    if validators is None:
        validator = _validator_for(schemas, tool_name)
    elif tool_name in validators:
        validator = validators[tool_name]
    else:
        validator = validators[tool_name] = _validator_for(schemas, tool_name)
    if validator is None:
        return ArgsCheck.MALFORMED
    try:
        return ArgsCheck.VALID if validator.is_valid(instance) else ArgsCheck.INVALID
    except Exception:  # a reference that only fails while validating is still a malformed schema
        return ArgsCheck.MALFORMED
