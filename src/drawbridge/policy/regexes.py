"""Regular expressions that cannot hang the gateway: checked at load, run on bounded input.

Invariant: every regex a policy runs on call arguments (a ``matches``
condition, a schema ``pattern`` or ``patternProperties`` key) has passed
``check_regex`` at load, and is only ever run on a string of at most the
length it was checked for. Python's ``re`` backtracks, so an unchecked
pattern such as ``(a+)+$`` on an attacker's argument can take minutes.

Theory of operation. ``check_regex`` parses the pattern with ``re``'s own
parser and bounds the number of ways the engine can try to match it:
sequence multiplies, alternation adds, a bounded repeat multiplies by its
number of choices, an unbounded repeat by the subject length; an unanchored
search multiplies by the subject length again (one attempt per start
position). Nested repetition or alternation under an unbounded repeat is
exponential and refused outright, as are backreferences and conditional
groups. Over the budget, the pattern is refused with a message saying why.
A search counts as anchored only when it starts with ``\\A``, or with ``^``
and no ``(?m)`` flag (under ``(?m)``, ``^`` matches after every line break,
so a subject of line breaks is as bad as no anchor at all).

Invariant (per call): one evaluation spends at most ``BUDGET`` steps of
that bound on regexes, however many strings the arguments hold (and as
much again when a schema refuses the call, to name the failure). Each run
is charged ``cost(pattern, len(subject))`` against the ``RegexBudget`` the
evaluation opened (``call_budget``); a run the budget no longer covers is
not made, and its caller refuses (a ``matches`` condition cannot be
evaluated, a schema ``pattern`` fails). So an argument of a thousand
strings cannot multiply a pattern's worst case by a thousand. ``re``
holds the GIL while it runs, so moving evaluation to a thread would not
spare the other calls: the budget is what bounds a call's stall (about
20 million steps, tens of milliseconds).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache
from typing import Any

BUDGET = 20_000_000
MAX_PATTERN_CHARS = 512

_REPEATS = ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")


class RegexError(ValueError):
    """A pattern refused at load; the message says why."""


def _max_repeat() -> int:
    import re._constants as sre_constants

    return int(sre_constants.MAXREPEAT)


def _has_variable_repeat(items: Any) -> bool:
    for op, av in items:
        name = str(op)
        if name in _REPEATS:
            lo, hi, _ = av
            if hi != lo:
                return True
        elif name == "SUBPATTERN" and _has_variable_repeat(av[3]):
            return True
        elif name in ("ASSERT", "ASSERT_NOT") and _has_variable_repeat(av[1]):
            return True
        elif name == "ATOMIC_GROUP" and _has_variable_repeat(av):
            return True
        elif name == "BRANCH" and any(_has_variable_repeat(b) for b in av[1]):
            return True
    return False


def _cost(items: Any, subject: int, unbounded: int) -> int:
    total = 1
    for op, av in items:
        name = str(op)
        if name in _REPEATS:
            lo, hi, body = av
            inner = _cost(body, subject, unbounded)
            if hi == unbounded:
                if inner > 1 or _has_variable_repeat(body):
                    raise RegexError("nests repetition or alternation inside an unbounded repetition")
                total *= subject
            elif inner > 1:
                if hi > 64:
                    raise RegexError("repeats an alternation or repetition more than 64 times")
                total *= (hi - lo + 1) * inner**hi
            else:
                total *= hi - lo + 1
        elif name == "SUBPATTERN":
            total *= _cost(av[3], subject, unbounded)
        elif name == "BRANCH":
            total *= sum(_cost(branch, subject, unbounded) for branch in av[1])
        elif name in ("ASSERT", "ASSERT_NOT"):
            total *= _cost(av[1], subject, unbounded)
        elif name == "ATOMIC_GROUP":
            total *= _cost(av, subject, unbounded)
        elif name.startswith("GROUPREF"):
            raise RegexError("uses a backreference or a conditional group")
        if total > BUDGET * subject:
            break  # already far over; the caller refuses it
    return total


def _anchored(tree: Any) -> bool:
    """The search can only match at the start: ``\\A``, or ``^`` without a global ``(?m)``."""
    first = tree.data[0] if len(tree.data) else None
    if first is None or str(first[0]) != "AT":
        return False
    where = str(first[1])
    if where == "AT_BEGINNING_STRING":
        return True
    return where == "AT_BEGINNING" and not tree.state.flags & re.MULTILINE


def _search_cost(tree: Any, subject: int, search: bool) -> int:
    cost = _cost(tree, subject, _max_repeat())
    if search and not _anchored(tree):
        cost *= max(subject, 1)
    return cost


@lru_cache(maxsize=256)
def _tree(pattern: str) -> Any:
    import re._parser as sre_parser

    return sre_parser.parse(pattern)


@lru_cache(maxsize=4096)
def run_cost(pattern: str, length: int, search: bool) -> int:
    """The bound on one run of a checked ``pattern`` over a subject of ``length`` characters."""
    return max(_search_cost(_tree(pattern), length, search), 1)


class RegexBudget:
    """What one evaluation may still spend on regexes (in steps of the bound)."""

    __slots__ = ("left",)

    def __init__(self, steps: int = BUDGET) -> None:
        self.left = steps

    def spend(self, pattern: str, length: int, search: bool) -> bool:
        """Charge one run; False when the budget does not cover it (the run must not be made)."""
        cost = run_cost(pattern, length, search)
        if cost > self.left:
            self.left = 0
            return False
        self.left -= cost
        return True


_CURRENT: ContextVar[RegexBudget | None] = ContextVar("drawbridge_regex_budget", default=None)


def current_budget() -> RegexBudget | None:
    """The budget of the evaluation under way (None outside one)."""
    return _CURRENT.get()


@contextmanager
def call_budget(*, fresh: bool = False) -> Iterator[RegexBudget]:
    """Open one evaluation's budget (``BUDGET`` steps), unless one is already open (or ``fresh``)."""
    budget = _CURRENT.get()
    if budget is not None and not fresh:
        yield budget
        return
    budget = RegexBudget()
    token = _CURRENT.set(budget)
    try:
        yield budget
    finally:
        _CURRENT.reset(token)


def check_regex(pattern: str, *, subject_max: int, search: bool) -> re.Pattern[str]:
    """Compile ``pattern`` if its worst case over ``subject_max`` characters is within budget.

    ``search`` says the pattern is used unanchored (JSON Schema ``pattern``),
    not as a whole-string match; a leading ``\\A``, or ``^`` without ``(?m)``, makes it anchored.
    """
    import re._parser as sre_parser

    if len(pattern) > MAX_PATTERN_CHARS:
        raise RegexError(f"is longer than {MAX_PATTERN_CHARS} characters")
    try:
        compiled = re.compile(pattern)
        tree = sre_parser.parse(pattern)
    except re.error as exc:
        where = f" at position {exc.pos}" if exc.pos is not None else ""
        raise RegexError(f"is not valid: {exc.msg}{where}") from None
    cost = _search_cost(tree, subject_max, search)
    if cost > BUDGET:
        hint = " (anchor it with ^, without (?m))" if search else ""
        raise RegexError(
            "could backtrack too much (too many unbounded repetitions or alternatives)" + hint
        )
    return compiled
