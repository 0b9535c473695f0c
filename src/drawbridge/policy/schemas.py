"""Argument contracts: JSON Schema (Draft 2020-12) per tool, compiled at load.

Invariant: a schema that is not a valid Draft 2020-12 schema, or that refers
to anything outside itself, is a load error; at run time a call whose
arguments violate a schema is denied, and the reason names the failing
location (a JSON Pointer into the arguments) and keyword, never a value.

Theory of operation. ``compile_schema`` checks the schema against the
2020-12 metaschema, refuses a ``$schema`` that names another draft, refuses
``$ref``/``$dynamicRef`` that leave the document (drawbridge never fetches a
schema) and local references that point nowhere, checks every ``pattern``
and ``patternProperties`` regex with ``regexes.check_regex`` (the regexes of one
``patternProperties`` also joined with ``|``, as jsonschema's ``additionalProperties``
runs them: a global ``(?i)`` past the start would fail there at run time), then builds one
validator with an empty registry. That validator's ``pattern`` keyword
refuses a string longer than ``MAX_PATTERN_SUBJECT`` instead of running the
regex on it, and property names that long are refused before validation when
the schema matches names against regexes: no regex ever runs on more input
than it was checked for. Every run is charged to the call's regex budget
(``regexes.call_budget``): a ``pattern`` run it no longer covers fails, and
property names are charged before validation (jsonschema matches them with
``re`` itself, in up to three places), so the number of strings in the
arguments cannot multiply a pattern's worst case. ``check_arguments`` runs
the fast ``is_valid`` first and only on failure asks, under a budget of its
own, for the most relevant error, which it reduces to
(pointer, keyword). ``format`` is an annotation, as the draft says: it is not
asserted. The walk reads the members of ``properties``, ``$defs`` and the
other maps of schemas as schemas whatever their names (a property named
``default`` holds a schema, not a value). A pattern that should still reach a
run unchecked is costed before it runs all the same: one the bound refuses
fails the call, never runs.

The same bounded checking serves every schema the gateway checks arguments
against on the call path, not only a policy's: ``bounded_schema`` compiles a
schema already known valid (an OpenAPI operation's ``inputSchema``) with its
regexes checked, and ``argument_problems`` lists where arguments fail it, under
one regex budget per call.

jsonschema and referencing are imported when the first schema is compiled: a policy without
argument schemas (and a gateway serving it) never loads them, and they weigh about 10 MiB.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import cache
from typing import Any

from drawbridge.policy.model import ToolSchema
from drawbridge.policy.regexes import RegexBudget, RegexError, call_budget, check_regex, current_budget

DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"
_BASE_URI = "urn:drawbridge:policy-schema"
_VALUE_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
_SCHEMA_MAPS = frozenset({"properties", "$defs", "definitions", "dependentSchemas"})
"""Keywords whose value maps names (any names, ``default`` too) to schemas."""
_MAX_POINTER_CHARS = 200

#: Longest string (or property name) a schema regex is run on; longer fails ``pattern``.
MAX_PATTERN_SUBJECT = 4096


#: ``pattern`` runs of one call that its regex budget no longer covers fail with this message.
_BUDGET_SPENT = "the call's strings are too long, together, for the schema's patterns to be checked"
#: A ``pattern`` that reached a run without passing ``check_regex`` and whose bound refuses it.
_UNCHECKABLE = "the schema's pattern could backtrack too much to be checked"
#: Places a Draft 2020-12 validator matches a property name against ``patternProperties``
#: (``patternProperties``, ``additionalProperties``, ``unevaluatedProperties``): each is charged.
_NAME_SITES = 3


def _bounded_pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "string"):
        return
    budget = current_budget()
    if len(instance) > MAX_PATTERN_SUBJECT:
        yield ValidationError(f"string longer than {MAX_PATTERN_SUBJECT} characters is not checked")
        return
    try:
        within = budget is None or budget.spend(pattern, len(instance), True)
    except (RegexError, re.error):
        yield ValidationError(_UNCHECKABLE)
        return
    if not within:
        yield ValidationError(_BUDGET_SPENT)
    elif not re.search(pattern, instance):
        yield ValidationError("does not match the pattern")


@cache
def _validator_class() -> Any:
    """Draft 2020-12 with the bounded ``pattern`` keyword (built once, on the first schema)."""
    from jsonschema import Draft202012Validator
    from jsonschema.validators import extend

    return extend(Draft202012Validator, {"pattern": _bounded_pattern})


class SchemaLoadError(ValueError):
    """A schema that cannot be used; the message names the problem (and where in the schema)."""


class ReferenceLoadError(SchemaLoadError):
    """A reference of the schema that leaves it or points nowhere."""


@dataclass(frozen=True, slots=True)
class Violation:
    """Where the arguments fail a schema: a JSON Pointer and the failing keyword."""

    pointer: str
    keyword: str
    detail: str = ""

    def describe(self) -> str:
        where = f"at {self.pointer}" if self.pointer else "at the top level"
        extra = f" ({self.detail})" if self.detail else ""
        return f"`{self.keyword}` fails {where}{extra}"


def _clean(text: str) -> str:
    """Control characters become U+FFFD, so a key cannot forge lines in a log or a reason."""
    if text.isprintable():
        return text
    return "".join("\ufffd" if unicodedata.category(c) == "Cc" else c for c in text)


def pointer_of(parts: Any) -> str:
    text = _clean("".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts))
    if len(text) > _MAX_POINTER_CHARS:
        text = text[:_MAX_POINTER_CHARS] + "..."
    return text


@dataclass
class _Found:
    refs: list[tuple[str, str]]
    regexes: list[tuple[str, str]]
    name_regexes: set[str]
    joined: list[tuple[str, str]]


def _walk(node: Any, at: list[Any], root: bool, found: _Found) -> None:
    """Collect references and regexes in schema positions; refuse nested ``$id``."""
    if isinstance(node, dict):
        for key, value in node.items():
            where = pointer_of([*at, key])
            if key in ("$ref", "$dynamicRef") and isinstance(value, str):
                found.refs.append((value, where))
            elif key == "$id" and not root and isinstance(value, str):
                raise SchemaLoadError(f"nested $id at {where} is not supported")
            elif key in _SCHEMA_MAPS and isinstance(value, dict):
                for name, sub in value.items():
                    _walk(sub, [*at, key, name], False, found)
            elif key in _VALUE_KEYWORDS:
                continue
            elif key == "pattern" and isinstance(value, str):
                found.regexes.append((value, where))
            elif key == "patternProperties" and isinstance(value, dict):
                found.name_regexes.update(value)
                if len(value) > 1:  # jsonschema's additionalProperties runs them joined with "|"
                    found.joined.append(("|".join(value), pointer_of([*at, key])))
                for name, sub in value.items():
                    found.regexes.append((name, pointer_of([*at, key, name])))
                    _walk(sub, [*at, key, name], False, found)
            else:
                _walk(value, [*at, key], False, found)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            _walk(item, [*at, i], False, found)


def compile_schema(tool: str, schema: Any, line: int) -> ToolSchema:
    """Check and compile one tool's schema; raise SchemaLoadError with a precise message."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    if not isinstance(schema, (dict, bool)):
        raise SchemaLoadError("a schema must be a mapping (or true/false)")
    if isinstance(schema, dict) and "$schema" in schema and schema["$schema"] not in (
        DRAFT_2020_12,
        DRAFT_2020_12 + "#",
    ):
        raise SchemaLoadError(f"$schema must be {DRAFT_2020_12!r} (Draft 2020-12)")
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise SchemaLoadError(
            f"not a valid Draft 2020-12 schema: {exc.message} (at {pointer_of(exc.path) or 'the top level'})"
        ) from None
    return ToolSchema(tool, schema, line, bounded_schema(schema))


def _checked_regexes(schema: dict[str, Any]) -> _Found:
    """The schema's references and regexes, every regex checked (``SchemaLoadError`` naming the first
    that could backtrack too much, or that is not valid)."""
    found = _Found([], [], set(), [])
    _walk(schema, [], True, found)
    for regex, where in found.regexes:
        try:
            check_regex(regex, subject_max=MAX_PATTERN_SUBJECT, search=True)
        except RegexError as exc:
            raise SchemaLoadError(f"regex at {where} {exc}") from None
    for regex, where in found.joined:
        try:
            check_regex(regex, subject_max=MAX_PATTERN_SUBJECT, search=True)
        except RegexError as exc:
            raise SchemaLoadError(
                f"the regexes at {where}, joined with | as a validator runs them, {exc} "
                "(a flag such as (?i) applies to one regex only when scoped: (?i:...))"
            ) from None
    return found


def _refuse_outside_references(schema: dict[str, Any], found: _Found) -> None:
    from referencing import Registry
    from referencing.exceptions import Unresolvable
    from referencing.jsonschema import DRAFT202012

    base = schema.get("$id") if isinstance(schema.get("$id"), str) else _BASE_URI
    registry: Any = Registry().with_resource(base, DRAFT202012.create_resource(schema))
    resolver = registry.resolver(base_uri=base)
    for ref, where in found.refs:
        if not ref.startswith("#"):
            raise ReferenceLoadError(
                f"reference {ref!r} at {where} leaves the schema; only '#...' is allowed"
            )
        try:
            resolver.lookup(ref)
        except Unresolvable:
            raise ReferenceLoadError(f"reference {ref!r} at {where} points nowhere") from None


@dataclass(frozen=True, slots=True)
class BoundedSchema:
    """A schema compiled so that checking arguments against it cannot stall the gateway (module
    docstring): its regexes checked at load, its ``pattern`` runs bounded and charged per call."""

    validator: Any
    name_regexes: tuple[str, ...]
    """The ``patternProperties`` regexes: every property name of the arguments may meet them."""


def bounded_schema(schema: Any) -> BoundedSchema:
    """Compile a valid Draft 2020-12 schema whose references stay inside it (``$ref``/``$dynamicRef``:
    '#...' that resolve, else ``SchemaLoadError`` naming where); its regexes checked as a policy's are
    (``SchemaLoadError`` naming the first refused). The caller has checked it against the meta-schema."""
    from referencing import Registry

    name_regexes: tuple[str, ...] = ()
    if isinstance(schema, dict):
        found = _checked_regexes(schema)
        _refuse_outside_references(schema, found)
        name_regexes = tuple(sorted(found.name_regexes))
    return BoundedSchema(_validator_class()(schema, registry=Registry()), name_regexes)


def argument_problems(compiled: BoundedSchema, arguments: Any, limit: int = 10) -> list[str]:
    """Where ``arguments`` fail ``compiled`` (``path: message``, at most ``limit``), all found under
    one regex budget: a call the budget does not cover fails, naming that, never runs on."""
    from referencing.exceptions import Unresolvable

    try:
        with call_budget() as budget:
            if compiled.name_regexes:
                unchecked = _names_unchecked(arguments, compiled.name_regexes, budget)
                if unchecked is not None:
                    return [f"{unchecked.pointer or '(arguments)'}: {unchecked.detail}"]
            found = compiled.validator.iter_errors(arguments)
            errors = sorted(found, key=lambda e: [str(p) for p in e.absolute_path])
    except RegexError:  # a property name's regex the bound refuses (jsonschema runs those itself)
        return [f"(arguments): {_UNCHECKABLE}"]
    except Unresolvable:
        return ["(arguments): the schema could not be evaluated (a reference points nowhere)"]
    except RecursionError:
        return ["(arguments): the arguments nest too deeply to check"]
    return [
        f"{'/'.join(str(p) for p in error.absolute_path) or '(arguments)'}: {error.message[:300]}"
        for error in errors[:limit]
    ]


def _names_unchecked(node: Any, regexes: tuple[str, ...], budget: RegexBudget) -> Violation | None:
    """Where property names cannot be matched against ``regexes``: a name too long for a regex, or
    names that are too long together for the call's budget (each charged once per regex and per place
    a validator matches names, before any runs: jsonschema runs ``re`` on them itself)."""
    stack: list[tuple[Any, list[Any]]] = [(node, [])]
    while stack:
        value, path = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if isinstance(key, str):
                    if len(key) > MAX_PATTERN_SUBJECT:
                        detail = f"a property name is longer than {MAX_PATTERN_SUBJECT} characters"
                        return Violation(pointer_of(path), "patternProperties", detail)
                    for regex in regexes:
                        if not all(budget.spend(regex, len(key), True) for _ in range(_NAME_SITES)):
                            detail = "the property names are too long, together, for the schema's patterns"
                            return Violation(pointer_of(path), "patternProperties", detail)
                stack.append((item, [*path, key]))
        elif isinstance(value, list):
            stack.extend((item, [*path, i]) for i, item in enumerate(value))
    return None


def check_arguments(schema: ToolSchema, arguments: Any) -> Violation | None:
    """None when ``arguments`` satisfy the schema, else where and which keyword fails."""
    from jsonschema.exceptions import best_match
    from referencing.exceptions import Unresolvable

    compiled: BoundedSchema = schema.validator
    instance = {} if arguments is None else arguments
    validator = compiled.validator
    try:
        with call_budget() as budget:
            if compiled.name_regexes:
                unchecked = _names_unchecked(instance, compiled.name_regexes, budget)
                if unchecked is not None:
                    return unchecked
            if validator.is_valid(instance):
                return None
        with call_budget(fresh=True):  # the second pass names the failure the first one met
            error = best_match(validator.iter_errors(instance))
    except RegexError:  # a property name's regex the bound refuses (jsonschema runs those itself)
        return Violation("", "patternProperties", _UNCHECKABLE)
    except Unresolvable:
        return Violation("", "$ref", "the schema could not be evaluated")
    except RecursionError:
        return Violation("", "schema", "the arguments nest too deeply to check")
    if error is None:  # pragma: no cover - is_valid said invalid, so there is an error
        return Violation("", "schema")
    detail = ""
    if error.validator == "required" and isinstance(error.validator_value, list) and isinstance(
        error.instance, dict
    ):
        # Names from the schema's own `required` list: policy text, not argument data.
        missing = [k for k in error.validator_value if isinstance(k, str) and k not in error.instance]
        if missing:
            detail = "missing " + ", ".join(f"`{_clean(k)}`" for k in missing)
    if error.validator == "pattern" and error.message == _BUDGET_SPENT:
        detail = _BUDGET_SPENT
    return Violation(pointer_of(error.absolute_path), str(error.validator), detail)
