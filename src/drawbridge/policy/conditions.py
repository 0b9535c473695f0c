"""Conditions on call arguments: checked and compiled at load, three-valued at run time.

Invariant: a condition that cannot be evaluated for a call (its argument is
missing, has the wrong JSON type, is too long to match safely, or the call's
regex budget is spent, ``regexes.call_budget``) is
``Truth.UNKNOWN``, never ``FALSE`` and never ``TRUE``. The evaluator resolves
UNKNOWN to the stricter of the two outcomes the rule could have led to, so an
undecidable condition can never turn into an allow.

Theory of operation. ``compile_condition`` validates the operator and the
type of ``value`` for it and returns a ``Condition`` holding a closure
specialised for that operator and value (regexes compiled, ``in`` lists turned
into per-type sets). At run time ``evaluate`` walks the argument path and
calls the closure; nothing is parsed per call.

Types are JSON types: string, number (int or float, never a boolean),
boolean, null, and compound (array, object). ``==``, ``!=`` and ``in``
compare only within one type: ``"500"`` against ``500`` is UNKNOWN, because
an upstream that coerces strings could read it as the number (comparing with
``null`` is the exception: it is a plain "is it null" test). The ordering
operators need a finite number, ``starts_with`` and ``matches`` a string.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from drawbridge.policy.model import Condition, Op, Truth
from drawbridge.policy.regexes import RegexError, check_regex, current_budget

TRUE, FALSE, UNKNOWN = Truth.TRUE, Truth.FALSE, Truth.UNKNOWN

#: ``matches`` runs on arguments of at most this many characters (docs/policy-format.md 5.2).
MAX_SUBJECT_CHARS = 1024

_MISSING: Any = object()
_NO_ARGUMENTS: dict[str, Any] = {}


class ConditionError(ValueError):
    """A condition that cannot be compiled; the message names the problem."""


def _is_number(v: Any) -> bool:
    t = type(v)
    if t is int:
        return True
    if t is float:
        return math.isfinite(v)
    return False


def _family(v: Any) -> str:
    t = type(v)
    if t is str:
        return "string"
    if t is bool:
        return "boolean"
    if t is int or t is float:
        return "number"
    if v is None:
        return "null"
    return "compound"


# ----------------------------------------------------------------------------- operators


def _eq_test(value: Any) -> Callable[[Any], Truth]:
    if value is None:
        return lambda a: TRUE if a is None else FALSE
    if type(value) is bool:
        return lambda a: (TRUE if a is value else FALSE) if type(a) is bool else UNKNOWN
    if type(value) is str:
        return lambda a: (TRUE if a == value else FALSE) if type(a) is str else UNKNOWN
    return lambda a: (TRUE if a == value else FALSE) if _is_number(a) else UNKNOWN


def _negate(test: Callable[[Any], Truth]) -> Callable[[Any], Truth]:
    def ne(a: Any) -> Truth:
        t = test(a)
        return t if t is UNKNOWN else (FALSE if t is TRUE else TRUE)

    return ne


def _order_test(op: Op, value: Any) -> Callable[[Any], Truth]:
    if op is Op.LT:
        return lambda a: (TRUE if a < value else FALSE) if _is_number(a) else UNKNOWN
    if op is Op.LE:
        return lambda a: (TRUE if a <= value else FALSE) if _is_number(a) else UNKNOWN
    if op is Op.GT:
        return lambda a: (TRUE if a > value else FALSE) if _is_number(a) else UNKNOWN
    return lambda a: (TRUE if a >= value else FALSE) if _is_number(a) else UNKNOWN


def _in_test(values: tuple[Any, ...]) -> Callable[[Any], Truth]:
    strings = frozenset(v for v in values if type(v) is str)
    numbers = frozenset(v for v in values if _is_number(v))
    booleans = frozenset(v for v in values if type(v) is bool)
    has_null = any(v is None for v in values)
    has_string, has_number, has_boolean = bool(strings), bool(numbers), bool(booleans)

    def test(a: Any) -> Truth:
        t = type(a)
        if t is str:
            return (TRUE if a in strings else FALSE) if has_string else UNKNOWN
        if t is bool:
            return (TRUE if a in booleans else FALSE) if has_boolean else UNKNOWN
        if _is_number(a):
            return (TRUE if a in numbers else FALSE) if has_number else UNKNOWN
        if a is None:
            return TRUE if has_null else UNKNOWN
        return UNKNOWN

    return test


def _starts_with_test(prefix: str) -> Callable[[Any], Truth]:
    return lambda a: (TRUE if a.startswith(prefix) else FALSE) if type(a) is str else UNKNOWN


def _matches_test(regex: re.Pattern[str]) -> Callable[[Any], Truth]:
    fullmatch, pattern = regex.fullmatch, regex.pattern

    def test(a: Any) -> Truth:
        if type(a) is not str or len(a) > MAX_SUBJECT_CHARS:
            return UNKNOWN
        budget = current_budget()
        if budget is not None and not budget.spend(pattern, len(a), False):
            return UNKNOWN  # the call's regexes have run as long as one call may
        return TRUE if fullmatch(a) is not None else FALSE

    return test


# ----------------------------------------------------------------------------- regex limits


def compile_regex(pattern: str) -> re.Pattern[str]:
    """Compile a ``matches`` pattern (whole-string match), refusing what can hang ``re``."""
    try:
        return check_regex(pattern, subject_max=MAX_SUBJECT_CHARS, search=False)
    except RegexError as exc:
        raise ConditionError(f"regex {exc}") from None


# ----------------------------------------------------------------------------- compile / evaluate


def _check_scalar(value: Any, what: str) -> None:
    if type(value) is float and not math.isfinite(value):
        raise ConditionError(f"{what} must be a finite number")
    if _family(value) == "compound":
        raise ConditionError(f"{what} must be a string, number, boolean or null")


def compile_condition(
    arg: tuple[str, ...], op: str, value: Any, if_missing: bool | None, line: int
) -> Condition:
    """Validate one condition and compile its test; raise ConditionError on a bad one."""
    if not arg or any(not isinstance(k, str) or k == "" for k in arg):
        raise ConditionError("`arg` must name an argument (a non-empty key, or a list of keys)")
    try:
        operator = Op(op)
    except ValueError:
        allowed = ", ".join(o.value for o in Op)
        raise ConditionError(f"unknown operator {op!r} (allowed: {allowed})") from None
    if if_missing is not None and type(if_missing) is not bool:
        raise ConditionError("`if_missing` must be true or false")

    test: Callable[[Any], Truth]
    stored = value
    if operator in (Op.EQ, Op.NE):
        _check_scalar(value, f"value for {operator}")
        test = _eq_test(value)
        if operator is Op.NE:
            test = _negate(test)
    elif operator in (Op.LT, Op.LE, Op.GT, Op.GE):
        if not _is_number(value):
            raise ConditionError(f"value for {operator} must be a finite number")
        test = _order_test(operator, value)
    elif operator is Op.STARTS_WITH:
        if type(value) is not str:
            raise ConditionError("value for starts_with must be a string")
        test = _starts_with_test(value)
    elif operator is Op.IN:
        if not isinstance(value, (list, tuple)) or not value:
            raise ConditionError("value for in must be a non-empty list")
        for item in value:
            _check_scalar(item, "every item of the value for in")
        stored = tuple(value)
        test = _in_test(stored)
    else:  # Op.MATCHES
        if type(value) is not str:
            raise ConditionError("value for matches must be a string (a regex)")
        test = _matches_test(compile_regex(value))
    return Condition(tuple(arg), operator, stored, if_missing, line, test)


def evaluate(condition: Condition, arguments: Any) -> Truth:
    """Truth of ``condition`` for a call's (JSON-decoded) arguments; None means no arguments."""
    current = _NO_ARGUMENTS if arguments is None else arguments
    for key in condition.arg:
        if type(current) is not dict:
            return UNKNOWN
        current = current.get(key, _MISSING)
        if current is _MISSING:
            missing = condition.if_missing
            if missing is None:
                return UNKNOWN
            return TRUE if missing else FALSE
    return condition.test(current)


def all_hold(conditions: tuple[Condition, ...], arguments: Any) -> tuple[Truth, Condition | None]:
    """Kleene AND: FALSE if any is FALSE, else UNKNOWN if any is UNKNOWN, else TRUE.

    Returns the first UNKNOWN condition too, so the reason can name it.
    """
    unknown: Condition | None = None
    for condition in conditions:
        truth = evaluate(condition, arguments)
        if truth is FALSE:
            return FALSE, None
        if truth is UNKNOWN and unknown is None:
            unknown = condition
    return (UNKNOWN, unknown) if unknown is not None else (TRUE, None)


def why_unknown(condition: Condition, arguments: Any) -> str:
    """Plain words for an UNKNOWN result. Names the argument path and a type, never a value."""
    current = _NO_ARGUMENTS if arguments is None else arguments
    for depth, key in enumerate(condition.arg):
        if type(current) is not dict:
            parent = ".".join(condition.arg[:depth]) or "the arguments"
            return f"`{parent}` is a {_family(current)}, not an object"
        if key not in current:
            return f"argument `{condition.arg_text}` is missing"
        current = current[key]
    family = _family(current)
    if condition.op is Op.MATCHES and family == "string":
        if len(current) <= MAX_SUBJECT_CHARS:
            return (f"the call's regexes ran out of their budget before argument `{condition.arg_text}` "
                    "was matched")
        return f"argument `{condition.arg_text}` is longer than {MAX_SUBJECT_CHARS} characters"
    if condition.op in (Op.LT, Op.LE, Op.GT, Op.GE) and family == "number":
        return f"argument `{condition.arg_text}` is not a finite number"
    return f"argument `{condition.arg_text}` is a {family}, which {condition.op} cannot compare here"
