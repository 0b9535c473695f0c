"""The verdict gate: one observed tool decision against the declared policy (evidence-formats.md 2.7, 2.8).

Invariant: the lattice is ``match < incomplete < mismatch < invalid``, every
verdict is the lattice maximum of its parts, and the rule that carries the
weight is the conservative one: a declared constraint that applies but cannot
be evaluated from the evidence given is ``incomplete``, never ``match``. A
malformed declaration is ``invalid``, never an exception and never "no evidence".
Any string outside the vocabulary ranks as ``invalid``.

Theory of operation. ``decision_verdict`` reads the policy through
``normalize_assay_policy`` -- the view the declared digest binds -- and folds
seven axes (``decision_axes`` returns them by name, in this order):

=========  ===================================================================
tool       a ``deny`` pattern matches -> mismatch; else a non-empty ``allow`` ->
           match iff a pattern matches; else the unconstrained mode
           (deny -> mismatch, allow -> match, warn -> incomplete). An empty
           ``allow`` list and the class lists play no part here.
args       not captured -> incomplete; no schema for the tool (or the tool is
           named ``$defs``) -> the unconstrained mode; valid -> match;
           invalid -> mismatch; malformed schema -> invalid
identity   present/absent -> match; required_missing -> incomplete; else invalid
class      no deny/allow classes declared -> match; declared but no observed
           classes -> incomplete; an observed class denied -> mismatch; allow
           classes declared and none observed among them -> mismatch; else match
approval,  applicability: a name pattern matches -> applicable; else no class
scope,     list -> not applicable; else no observed classes -> undeterminable;
redaction  else applicable iff an observed class is listed. Then not applicable
           -> match, undeterminable -> incomplete, applicable -> match / mismatch
           / incomplete for satisfied true / false / not observed
=========  ===================================================================

The schema check prepares the tool's schema with the policy's shared
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

A producer that judges every call against one declared contract reads it once:
``prepare_policy`` keeps the normalized view and each tool's compiled schema, and
``prepared_decision_verdict`` folds the same axes over them, so its verdict is
``decision_verdict``'s without re-reading the policy per call.
"""

from __future__ import annotations

import enum
import functools
import json
from collections.abc import Iterable, Mapping
from typing import Any

import referencing.jsonschema as _specs
from jsonschema import (
    Draft4Validator,
    Draft6Validator,
    Draft7Validator,
    Draft201909Validator,
    Draft202012Validator,
)
from jsonschema_specifications import REGISTRY as _META_SCHEMAS
from referencing import Registry

from drawbridge.evidence.truth.assay_policy import normalize_assay_policy
from drawbridge.evidence.truth.evidence import Evidence
from drawbridge.evidence.truth.patterns import matches_tool_pattern

__all__ = [
    "AXES",
    "IDENTITY_STATES",
    "JSON_NULL",
    "VERDICTS",
    "ArgsCheck",
    "PreparedPolicy",
    "check_tool_args",
    "decision_axes",
    "decision_verdict",
    "lattice_max",
    "prepare_policy",
    "prepared_decision_verdict",
    "run_verdict",
    "verdict_rank",
]

#: The verdict vocabulary in lattice order; the index is the rank.
VERDICTS: tuple[str, ...] = ("match", "incomplete", "mismatch", "invalid")
#: The seven axes of ``decision_axes``, in evaluation order.
AXES: tuple[str, ...] = ("tool", "args", "identity", "class", "approval", "scope", "redaction")
#: Identity states a carrier may record (anything else is ``invalid`` on the identity axis).
IDENTITY_STATES: tuple[str, ...] = ("present", "absent", "required_missing", "invalid")

_RANK = {verdict: rank for rank, verdict in enumerate(VERDICTS)}
_MATCH, _INCOMPLETE, _MISMATCH, _INVALID = VERDICTS
_ENFORCEMENT = {"deny": _MISMATCH, "allow": _MATCH, "warn": _INCOMPLETE}


class _JsonNull:
    """Captured arguments that were JSON ``null`` (as opposed to not captured)."""

    _instance: _JsonNull | None = None

    def __new__(cls) -> _JsonNull:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "JSON_NULL"


#: Pass as ``args`` when the arguments *were* captured and were JSON ``null``;
#: ``None`` means "not captured" (which makes the args axis ``incomplete``).
JSON_NULL = _JsonNull()


def verdict_rank(verdict: object) -> int:
    """Lattice rank 0..3; anything outside the vocabulary ranks as ``invalid`` (3)."""
    return _RANK.get(verdict, 3) if isinstance(verdict, str) else 3


def lattice_max(*verdicts: Any) -> str:
    """The most severe of the verdicts (``match`` when there are none); unknown strings are ``invalid``.

    Takes the verdicts as arguments (``lattice_max("match", "mismatch")``) or as
    one iterable of them (``lattice_max(["match", "mismatch"])``).
    """
    items: Iterable[Any] = verdicts
    if len(verdicts) == 1 and not isinstance(verdicts[0], str):
        items = verdicts[0]
    worst = 0
    for verdict in items:
        worst = max(worst, verdict_rank(verdict))
    return VERDICTS[worst]


# --- schema check ---------------------------------------------------------------------------


class ArgsCheck(enum.Enum):
    """Outcome of checking arguments against the declared per-tool schema."""

    NO_SCHEMA = "no_schema"
    VALID = "valid"
    INVALID = "invalid"
    MALFORMED = "malformed"


class _Malformed(Exception):
    pass


_DIALECTS: dict[str, tuple[type, Any]] = {}
for _cls, _spec, _uris in (
    (Draft202012Validator, _specs.DRAFT202012, ("https://json-schema.org/draft/2020-12/schema",)),
    (Draft201909Validator, _specs.DRAFT201909, ("https://json-schema.org/draft/2019-09/schema",)),
    (Draft7Validator, _specs.DRAFT7, ("https://json-schema.org/draft-07/schema",)),
    (Draft6Validator, _specs.DRAFT6, ("https://json-schema.org/draft-06/schema",)),
    (Draft4Validator, _specs.DRAFT4, ("https://json-schema.org/draft-04/schema",)),
):
    for _uri in _uris:
        _DIALECTS[_uri] = (_cls, _spec)
        _DIALECTS["http://" + _uri.removeprefix("https://")] = (_cls, _spec)
_FORMATS_ASSERT = (Draft4Validator, Draft6Validator, Draft7Validator)


def _dialect(schema: Any) -> tuple[type, Any]:
    if isinstance(schema, dict) and isinstance(schema.get("$schema"), str):
        found = _DIALECTS.get(schema["$schema"].rstrip("#"))
        if found is None:
            raise _Malformed("unknown $schema dialect")
        return found
    # A non-string $schema keeps the default dialect and fails the meta-schema check.
    return _DIALECTS["https://json-schema.org/draft/2020-12/schema"]


def _resolve_every_reference(schema: Any, specification: Any) -> None:
    """Resolve each $ref/$dynamicRef in every subschema, as a compile-time resolver would."""
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
    schema = json.loads(schema_key)
    try:
        cls, specification = _dialect(schema)
        cls.check_schema(schema)
        _resolve_every_reference(schema, specification)
        format_checker = cls.FORMAT_CHECKER if cls in _FORMATS_ASSERT else None
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


def _check_args(
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


def check_tool_args(policy: Mapping[str, Any], tool_name: str, args: Any) -> ArgsCheck:
    """Check captured ``args`` against the declared schema of ``tool_name`` in a raw Assay policy.

    Here ``args`` is always captured: ``None`` and ``JSON_NULL`` both mean JSON ``null``.
    """
    schemas = normalize_assay_policy(policy)["schemas"]
    return _check_args(schemas, tool_name, None if args is JSON_NULL else args)


# --- the seven axes -------------------------------------------------------------------------


def _tool_axis(tools: Mapping[str, Any], mode: str, tool_name: str) -> str:
    if any(matches_tool_pattern(p, tool_name) for p in tools.get("deny") or ()):
        return _MISMATCH
    allow = tools.get("allow") or ()
    if allow:
        return _MATCH if any(matches_tool_pattern(p, tool_name) for p in allow) else _MISMATCH
    return _ENFORCEMENT[mode]


def _args_axis(
    schemas: Mapping[str, Any], mode: str, tool_name: str, args: Any, validators: dict[str, Any] | None = None
) -> str:
    if args is None:
        return _INCOMPLETE
    outcome = _check_args(schemas, tool_name, None if args is JSON_NULL else args, validators)
    if outcome is ArgsCheck.NO_SCHEMA:
        return _ENFORCEMENT[mode]
    return {ArgsCheck.VALID: _MATCH, ArgsCheck.INVALID: _MISMATCH, ArgsCheck.MALFORMED: _INVALID}[outcome]


def _identity_axis(identity_state: object) -> str:
    if identity_state in ("present", "absent"):
        return _MATCH
    if identity_state == "required_missing":
        return _INCOMPLETE
    return _INVALID


def _class_axis(tools: Mapping[str, Any], observed: tuple[str, ...] | None) -> str:
    deny = tools.get("deny_classes") or ()
    allow = tools.get("allow_classes") or ()
    if not deny and not allow:
        return _MATCH
    if observed is None:
        return _INCOMPLETE
    if any(c in deny for c in observed):
        return _MISMATCH
    if allow and not any(c in allow for c in observed):
        return _MISMATCH
    return _MATCH


def _obligation_axis(
    names: Iterable[str],
    classes: Iterable[str],
    tool_name: str,
    observed: tuple[str, ...] | None,
    satisfied: bool | None,
) -> str:
    classes = tuple(classes)
    if any(matches_tool_pattern(p, tool_name) for p in names):
        applicable = True
    elif not classes:
        return _MATCH  # not applicable
    elif observed is None:
        return _INCOMPLETE  # cannot tell whether it applies
    else:
        applicable = any(c in classes for c in observed)
    if not applicable:
        return _MATCH
    if satisfied is None:
        return _INCOMPLETE
    return _MATCH if satisfied else _MISMATCH


def decision_axes(
    policy: Mapping[str, Any],
    tool_name: str,
    args: Any | None,
    identity_state: str,
    evidence: Evidence | None = None,
) -> dict[str, str]:
    """Each axis's verdict by name (see ``AXES``): the explanation behind ``decision_verdict``."""
    if not isinstance(tool_name, str):
        raise TypeError("tool_name must be a string")
    return _axes(normalize_assay_policy(policy), None, tool_name, args, identity_state, evidence)


def _axes(
    view: Mapping[str, Any],
    validators: dict[str, Any] | None,
    tool_name: str,
    args: Any | None,
    identity_state: str,
    evidence: Evidence | None,
) -> dict[str, str]:
    evidence = Evidence() if evidence is None else evidence
    tools = view["tools"]
    mode = view["enforcement"]["unconstrained_tools"]
    observed = evidence.tool_classes

    def obligation(names_key: str, satisfied: bool | None) -> str:
        names = tools.get(names_key) or ()
        classes = tools.get(names_key + "_classes") or ()
        return _obligation_axis(names, classes, tool_name, observed, satisfied)

    return {
        "tool": _tool_axis(tools, mode, tool_name),
        "args": _args_axis(view["schemas"], mode, tool_name, args, validators),
        "identity": _identity_axis(identity_state),
        "class": _class_axis(tools, observed),
        "approval": obligation("approval_required", evidence.approval_obtained),
        "scope": obligation("restrict_scope", evidence.scope_satisfied),
        "redaction": obligation("redact_args", evidence.redaction_applied),
    }


def decision_verdict(
    policy: Mapping[str, Any],
    tool_name: str,
    args: Any | None,
    identity_state: str,
    evidence: Evidence | None = None,
) -> str:
    """The verdict for one observed decision against a raw parsed Assay policy.

    ``args`` is the captured ``params.arguments`` value; ``None`` means the
    arguments were not captured, and ``JSON_NULL`` means they were captured and
    were JSON ``null``. ``evidence`` ``None`` is the same as ``Evidence()``.
    A policy that cannot be read raises ``AssayPolicyError``: there is nothing to compare against.
    """
    return lattice_max(decision_axes(policy, tool_name, args, identity_state, evidence).values())


_FIXED_MAX = 1024


class PreparedPolicy:
    """A policy read once for many verdicts: its normalized view and each tool's compiled schema.

    ``decision_verdict`` reads the policy (``normalize_assay_policy``) and prepares the tool's
    schema on every call; a producer that judges every call against the same declared contract
    prepares it once here and calls ``prepared_decision_verdict``, which gives the same verdict.
    The view is a private copy, never handed out, so what was prepared cannot change afterwards.
    A policy that cannot be read raises ``AssayPolicyError`` here, as ``decision_verdict`` would.
    """

    __slots__ = ("_fixed", "_validators", "_view")

    def __init__(self, policy: Mapping[str, Any]) -> None:
        self._view = normalize_assay_policy(policy)
        self._validators: dict[str, Any] = {}
        self._fixed: dict[Any, tuple[dict[str, str], str]] = {}

    def verdict(self, tool_name: str, args: Any | None, identity_state: str, evidence: Evidence | None) -> str:
        """The lattice maximum of the axes."""
        return self._judged(tool_name, args, identity_state, evidence)[1]

    def axes(
        self, tool_name: str, args: Any | None, identity_state: str, evidence: Evidence | None = None
    ) -> dict[str, str]:
        return dict(self._judged(tool_name, args, identity_state, evidence)[0])

    def _judged(
        self, tool_name: str, args: Any | None, identity_state: str, evidence: Evidence | None
    ) -> tuple[dict[str, str], str]:
        """The axes and their lattice maximum; kept per (tool, captured or not, identity, evidence)
        for a tool without a schema, whose arguments then count only as captured or not (the args
        axis is ``incomplete`` or the unconstrained mode). The axes dict is shared: callers copy it
        before handing it out."""
        if not isinstance(tool_name, str):
            raise TypeError("tool_name must be a string")
        if tool_name != "$defs" and tool_name in self._view["schemas"]:
            return self._judge(tool_name, args, identity_state, evidence)
        key = (tool_name, args is None, identity_state, evidence)
        try:
            found = self._fixed.get(key)
        except TypeError:  # an unhashable identity state or evidence: nothing to keep
            return self._judge(tool_name, args, identity_state, evidence)
        if found is None:
            found = self._judge(tool_name, args, identity_state, evidence)
            if len(self._fixed) >= _FIXED_MAX:
                self._fixed.clear()
            self._fixed[key] = found
        return found

    def _judge(
        self, tool_name: str, args: Any | None, identity_state: str, evidence: Evidence | None
    ) -> tuple[dict[str, str], str]:
        axes = _axes(self._view, self._validators, tool_name, args, identity_state, evidence)
        return axes, lattice_max(axes.values())


def prepare_policy(policy: Mapping[str, Any]) -> PreparedPolicy:
    """Read ``policy`` once for ``prepared_decision_verdict``."""
    return PreparedPolicy(policy)


def prepared_decision_verdict(
    prepared: PreparedPolicy,
    tool_name: str,
    args: Any | None,
    identity_state: str,
    evidence: Evidence | None = None,
) -> str:
    """``decision_verdict`` against a policy prepared by ``prepare_policy``: the same verdict."""
    return prepared.verdict(tool_name, args, identity_state, evidence)


def run_verdict(verdicts: list[str], orders: list[int]) -> str:
    """The run's verdict: ``invalid`` if the lengths differ or an order repeats (or is not an
    integer), else the lattice maximum over the decisions (``match`` for an empty run)."""
    if len(verdicts) != len(orders):
        return _INVALID
    seen: set[int] = set()
    for order in orders:
        if isinstance(order, bool) or not isinstance(order, int) or order in seen:
            return _INVALID
        seen.add(order)
    return lattice_max(list(verdicts))
