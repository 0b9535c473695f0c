"""The arguments a tool's input schema declares, at every depth, for the classifier (pure).

Invariant: an argument name the schema declares anywhere a call's arguments can reach is found, or
the reading says it stopped short (``Arguments.not_followed``), never a silent partial answer. The
classifier (``catalogue.classify``) turns stopping short into the generic family: an argument it
could not see may carry the effect. A FastMCP/pydantic tool declares ``{"params": {"$ref":
"#/$defs/P"}}`` with ``sql`` inside ``P``; reading only the top-level ``properties`` called it a
named read and the draft allowed ``{"params": {"sql": "DROP TABLE users"}}``.

Theory of operation. ``read_arguments`` walks the schema from its root through ``properties`` (each
key is an argument name, at any depth), ``patternProperties``, ``additionalProperties``, ``items``,
``prefixItems``, ``allOf``/``anyOf``/``oneOf``, ``if``/``then``/``else``, ``dependentSchemas`` and the
``unevaluated*`` keywords, and follows a ``$ref`` that is a JSON pointer into the same document
(``#/$defs/P``, ``#/definitions/P``, ``#``). Each reference is followed once, so a cycle ends and
shared definitions cost nothing twice. It stops short at a reference that is not local (another
document, an anchor ``#name``), a pointer that does not resolve, a dynamic reference
(``$dynamicRef``, ``$recursiveRef``), or nesting deeper than ``MAX_SCHEMA_DEPTH``. ``not`` is not
walked: it declares what arguments must not be. ``may_be_string`` answers, for one argument's schema,
whether it admits a string, following local references the same way; in doubt it says yes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import unquote

MAX_SCHEMA_DEPTH: Final = 32

_SCHEMA_VALUED: Final = (
    "additionalProperties", "unevaluatedProperties", "items", "unevaluatedItems", "contains",
    "if", "then", "else",
)
_SCHEMA_LISTS: Final = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SCHEMA_MAPS: Final = ("patternProperties", "dependentSchemas")
_DYNAMIC_REFS: Final = ("$dynamicRef", "$recursiveRef")


class _Unresolved:
    """A reference that cannot be followed, and why (fixed words only: it goes into a reason)."""

    def __init__(self, why: str) -> None:
        self.why = why


OUTSIDE: Final = _Unresolved("a $ref outside the schema")
DANGLING: Final = _Unresolved("a $ref that does not resolve")
DYNAMIC: Final = _Unresolved("a dynamic $ref")
TOO_DEEP: Final = _Unresolved(f"nested deeper than {MAX_SCHEMA_DEPTH}")


def resolve(root: Any, ref: Any) -> Any:
    """The subschema a local ``$ref`` points at, or an ``_Unresolved`` saying why not."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        return OUTSIDE
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return OUTSIDE  # an anchor: its target depends on $anchor/$id, not read here
    node = root
    for token in ref[2:].split("/"):
        part = unquote(token).replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return DANGLING
    return node


@dataclass(slots=True)
class Arguments:
    """Every argument name declared in a schema (lowercased), each with the schemas it may have."""

    root: Any
    by_name: dict[str, list[Any]] = field(default_factory=dict)
    not_followed: str | None = None
    """Why the reading stopped short (the first reason met), or None when it read everything."""
    _followed: set[str] = field(default_factory=set)
    _string_memo: dict[str, bool] = field(default_factory=dict)

    def _stop(self, unresolved: _Unresolved) -> None:
        if self.not_followed is None:
            self.not_followed = unresolved.why

    def walk(self, schema: Any, depth: int = 0) -> None:
        """Collect the argument names under ``schema`` (booleans and non-objects declare none)."""
        if not isinstance(schema, Mapping):
            return
        if depth > MAX_SCHEMA_DEPTH:
            self._stop(TOO_DEEP)
            return
        if any(key in schema for key in _DYNAMIC_REFS):
            self._stop(DYNAMIC)
        if "$ref" in schema:
            self._follow(schema["$ref"], depth)
        properties = schema.get("properties")
        if isinstance(properties, Mapping):
            for key, sub in properties.items():
                if isinstance(key, str):
                    self.by_name.setdefault(key.lower(), []).append(sub)
                self.walk(sub, depth + 1)
        for key in _SCHEMA_VALUED:
            if isinstance(schema.get(key), Mapping):
                self.walk(schema[key], depth + 1)
        for key in _SCHEMA_LISTS:
            if isinstance(schema.get(key), list):
                for sub in schema[key]:
                    self.walk(sub, depth + 1)
        for key in _SCHEMA_MAPS:
            if isinstance(schema.get(key), Mapping):
                for sub in schema[key].values():
                    self.walk(sub, depth + 1)

    def _follow(self, ref: Any, depth: int) -> None:
        target = resolve(self.root, ref)
        if isinstance(target, _Unresolved):
            self._stop(target)
        elif ref not in self._followed:
            self._followed.add(ref)
            self.walk(target, depth + 1)

    def may_be_string(self, schema: Any, depth: int = 0) -> bool:
        """Whether an argument's schema admits a string. When in doubt, yes (the restrictive side)."""
        if schema is False:
            return False
        if not isinstance(schema, Mapping) or depth > MAX_SCHEMA_DEPTH:
            return True
        if "$ref" in schema and not self._ref_may_be_string(schema["$ref"], depth):
            return False
        all_of = schema.get("allOf")
        if isinstance(all_of, list) and not all(self.may_be_string(branch, depth + 1) for branch in all_of):
            return False
        declared = schema.get("type")
        if isinstance(declared, str):
            return declared == "string"
        if isinstance(declared, list):
            return "string" in declared or not all(isinstance(item, str) for item in declared)
        if declared is not None:
            return True
        branches = [
            branch
            for key in ("anyOf", "oneOf")
            if isinstance(schema.get(key), list)
            for branch in schema[key]
        ]
        if branches:
            return any(self.may_be_string(branch, depth + 1) for branch in branches)
        if "const" in schema:
            return isinstance(schema["const"], str)
        if isinstance(schema.get("enum"), list):
            return any(isinstance(item, str) for item in schema["enum"])
        return True

    def _ref_may_be_string(self, ref: Any, depth: int) -> bool:
        """Memoised per reference (a reference met again on its own path counts as yes): a schema of
        shared definitions is read once, not once per path to it."""
        if not isinstance(ref, str):
            return True
        if ref not in self._string_memo:
            self._string_memo[ref] = True
            target = resolve(self.root, ref)
            answer = True if isinstance(target, _Unresolved) else self.may_be_string(target, depth + 1)
            self._string_memo[ref] = answer
        return self._string_memo[ref]


def read_arguments(input_schema: Any) -> Arguments:
    """The arguments of a tool whose ``inputSchema`` is ``input_schema`` (module docstring)."""
    arguments = Arguments(input_schema)
    arguments.walk(input_schema)
    return arguments


def may_be_string(schema: Any, depth: int = 0) -> bool:
    """Whether one schema, read on its own (its ``$ref`` cannot be followed), admits a string."""
    return Arguments(None).may_be_string(schema, depth)


__all__ = ["MAX_SCHEMA_DEPTH", "Arguments", "may_be_string", "read_arguments", "resolve"]
