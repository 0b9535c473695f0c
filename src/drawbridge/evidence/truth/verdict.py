"""The verdict gate: one observed tool decision against the declared policy (evidence-formats.md §2.7, 2.8).

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

The schema check (``args_schema``) compiles the tool's schema, with the policy's shared
``schemas["$defs"]``, as the reference's ``jsonschema`` crate does; a schema that does not compile
so is malformed. A producer that judges every call against one declared contract reads it once
(``prepared``), for the same verdicts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from drawbridge.evidence.truth.args_schema import ArgsCheck, check_args
from drawbridge.evidence.truth.assay_policy import normalize_assay_policy
from drawbridge.evidence.truth.evidence import Evidence
from drawbridge.evidence.truth.patterns import matches_tool_pattern

__all__ = [
    "AXES",
    "IDENTITY_STATES",
    "JSON_NULL",
    "VERDICTS",
    "check_tool_args",
    "decision_axes",
    "decision_verdict",
    "lattice_max",
    "run_verdict",
    "verdict_rank",
    "view_axes",
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


def check_tool_args(policy: Mapping[str, Any], tool_name: str, args: Any) -> ArgsCheck:
    """Check captured ``args`` against the declared schema of ``tool_name`` in a raw Assay policy.

    Here ``args`` is always captured: ``None`` and ``JSON_NULL`` both mean JSON ``null``.
    """
    schemas = normalize_assay_policy(policy)["schemas"]
    return check_args(schemas, tool_name, None if args is JSON_NULL else args)


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
    outcome = check_args(schemas, tool_name, None if args is JSON_NULL else args, validators)
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
    return view_axes(normalize_assay_policy(policy), None, tool_name, args, identity_state, evidence)


def view_axes(
    view: Mapping[str, Any],
    validators: dict[str, Any] | None,
    tool_name: str,
    args: Any | None,
    identity_state: str,
    evidence: Evidence | None,
) -> dict[str, str]:
    """The axes over a view already normalized (``normalize_assay_policy``), with the validators
    compiled so far by tool (a prepared policy's memo, filled as tools are judged) or None."""
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
