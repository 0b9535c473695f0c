"""The policy model: what a loaded policy is, and what a decision says.

Invariant: every object here is immutable and already validated. A value of
these types can only come out of the loader (or out of a test that builds it
through the same compile functions), so the evaluator never re-checks a glob,
a condition or a schema, and a decision always carries its provenance.

Theory of operation. A ``PolicySet`` is an ordered tuple of ``Policy`` values,
one per file, already sorted by agent specificity (``globs.Glob.specificity``,
ties in file-name order). A ``Policy`` holds ordered ``Rule`` values and the
per-tool argument ``schemas`` it declares; a ``Rule`` holds compiled tool
patterns, an ``Action`` and zero or more ``Condition`` values (all must hold).
Each policy precomputes the ``Decision`` each of its rules produces, so that
the usual case of a call (an unconditional rule decides) allocates nothing.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from drawbridge.policy.globs import Glob, GlobKind


class Action(enum.StrEnum):
    """What may happen to a call. Ordered by strictness: allow < human_approval < deny."""

    ALLOW = "allow"
    HUMAN_APPROVAL = "human_approval"
    DENY = "deny"

    @property
    def strictness(self) -> int:
        return _STRICTNESS[self]


_STRICTNESS = {Action.ALLOW: 0, Action.HUMAN_APPROVAL: 1, Action.DENY: 2}


def stricter(a: Action, b: Action) -> Action:
    """The stricter of two actions; floors and policies combine through this."""
    return a if _STRICTNESS[a] >= _STRICTNESS[b] else b


class Approver(enum.StrEnum):
    """Who may lift a rule's ``human_approval`` (the rule's ``approval`` key).

    ``any``: a person through any channel, the client's in-band answer included (it proves only that
    the client answered). ``operator``: only an operator the gateway authenticated (console, CLI,
    control plane); the client is never asked and approval memory never stands in.
    """

    ANY = "any"
    OPERATOR = "operator"


class Op(enum.StrEnum):
    """Condition operators (docs/policy-format.md, "Conditions")."""

    EQ = "=="
    NE = "!="
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    STARTS_WITH = "starts_with"
    IN = "in"
    MATCHES = "matches"


class Truth(enum.IntEnum):
    """Three-valued result of a condition: a condition can be undecidable for a call."""

    FALSE = 0
    TRUE = 1
    UNKNOWN = 2


class ToolPattern(Protocol):
    """A compiled tool-name pattern (a mesh7 glob, or an Assay pattern after conversion)."""

    @property
    def text(self) -> str: ...

    @property
    def exact_value(self) -> str | None: ...

    def matches(self, value: str) -> bool: ...


@dataclass(frozen=True, slots=True)
class Condition:
    """One test on one argument. ``test`` is compiled by ``conditions.compile_condition``.

    ``arg`` is the path of object keys from the call's arguments to the tested
    value. ``if_missing`` is the truth value when that path is absent; ``None``
    means "cannot be evaluated" (see docs/policy-format.md).
    """

    arg: tuple[str, ...]
    op: Op
    value: Any
    if_missing: bool | None
    line: int
    test: Callable[[Any], Truth] = field(repr=False, compare=False)

    @property
    def arg_text(self) -> str:
        return ".".join(self.arg)


@dataclass(frozen=True, slots=True)
class Rule:
    """One entry of a policy's ``rules`` list. ``index`` counts from 0 in file order."""

    index: int
    line: int
    tools: tuple[ToolPattern, ...]
    action: Action
    conditions: tuple[Condition, ...] = ()
    approver: Approver = Approver.ANY
    """Who may approve this rule's ``human_approval`` (``approval:``)."""
    memory_key: tuple[tuple[str, ...], ...] = ()
    """Argument paths whose values must also match for approval memory (``memory_key:``)."""

    @property
    def conditional(self) -> bool:
        return bool(self.conditions)

    def matches_tool(self, tool: str) -> bool:
        for pattern in self.tools:
            if pattern.matches(tool):
                return True
        return False


@dataclass(frozen=True, slots=True)
class ToolSchema:
    """A JSON Schema (Draft 2020-12) that a tool's arguments must satisfy.

    ``validator`` is compiled by ``schemas.compile_schema`` at load.
    """

    tool: str
    schema: Any
    line: int
    validator: Any = field(repr=False, compare=False)


class Basis(enum.StrEnum):
    """Why a decision came out the way it did."""

    RULE = "rule"  # a rule matched (its conditions, if any, held)
    CONDITION_UNKNOWN = "condition_unknown"  # a condition could not be evaluated; stricter outcome
    SCHEMA = "schema"  # the arguments violate a declared schema
    NO_RULE = "no_rule"  # nothing matched: default deny


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one evaluation, with where it came from.

    ``policy``/``source_file``/``rule_index``/``line`` point at what decided:
    the rule, or for a schema violation the schema's entry (``rule_index`` is
    then None). For the default deny all four are None. ``reason`` is safe
    to show to the agent: it never contains an argument value.
    """

    action: Action
    policy: str | None
    source_file: str | None
    rule_index: int | None
    reason: str
    line: int | None = None
    basis: Basis = Basis.RULE
    approver: Approver = Approver.ANY
    """Who may lift a ``human_approval`` decision (the deciding rule's ``approval``)."""
    memory_key: tuple[tuple[str, ...], ...] = ()
    """The deciding rule's ``memory_key``: argument paths approval memory also matches on."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form for records and the control plane (no argument data in it)."""
        out: dict[str, Any] = {
            "action": self.action.value,
            "policy": self.policy,
            "source_file": self.source_file,
            "rule_index": self.rule_index,
            "line": self.line,
            "basis": self.basis.value,
            "reason": self.reason,
        }
        if self.action is Action.HUMAN_APPROVAL and self.approver is not Approver.ANY:
            out["approval"] = self.approver.value
        return out


DEFAULT_DENY = Decision(Action.DENY, None, None, None, "no rule matched", None, Basis.NO_RULE)


def _rule_decision(policy: str, source_file: str, rule: Rule) -> Decision:
    reason = f"{rule.action} by rule {rule.index} of policy {policy!r} ({source_file}:{rule.line})"
    if rule.action is Action.HUMAN_APPROVAL and rule.approver is Approver.OPERATOR:
        reason += ", an operator must approve"
    return Decision(
        rule.action, policy, source_file, rule.index, reason, rule.line, Basis.RULE, rule.approver, rule.memory_key
    )


@dataclass(frozen=True)
class Policy:
    """One policy file: a name, the agents it applies to, ordered rules, argument schemas."""

    name: str
    agent: Glob
    rules: tuple[Rule, ...]
    schemas: Mapping[str, ToolSchema]
    source_file: str
    line: int = 1
    description: str | None = None
    #: For a policy converted from an Assay-format file: that file as Assay reads it
    #: (``parse_assay_policy``), for the truth layer's declared digest. None for native files.
    assay_policy: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)
    # Derived at construction; not part of equality.
    decisions: tuple[Decision, ...] = field(init=False, repr=False, compare=False)
    _by_exact: Mapping[str, tuple[int, ...]] = field(init=False, repr=False, compare=False)
    _by_pattern: tuple[Rule, ...] = field(init=False, repr=False, compare=False)
    _index: _PatternIndex = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.schemas, MappingProxyType):
            object.__setattr__(self, "schemas", MappingProxyType(dict(self.schemas)))
        object.__setattr__(
            self, "decisions", tuple(_rule_decision(self.name, self.source_file, r) for r in self.rules)
        )
        by_exact: dict[str, list[int]] = {}
        by_pattern: list[Rule] = []
        for rule in self.rules:
            if any(p.exact_value is None for p in rule.tools):
                by_pattern.append(rule)
                continue
            for pattern in rule.tools:
                positions = by_exact.setdefault(pattern.exact_value, [])  # type: ignore[arg-type]
                if not positions or positions[-1] != rule.index:
                    positions.append(rule.index)
        object.__setattr__(self, "_by_exact", MappingProxyType({k: tuple(v) for k, v in by_exact.items()}))
        object.__setattr__(self, "_by_pattern", tuple(by_pattern))
        object.__setattr__(self, "_index", _PatternIndex(tuple(by_pattern)))

    def rules_for_tool(self, tool: str) -> tuple[Rule, ...]:
        """Rules whose ``tools`` match ``tool``, in file order.

        A rule that names tools only exactly matches when one of its names is
        ``tool`` (found through a dict). A rule with a wildcard pattern matches
        when one of its patterns' ``matches`` says so; ``_PatternIndex`` finds
        those rules without trying every pattern, so a policy of many rules
        costs a few dict lookups here.
        """
        positions = set(self._by_exact.get(tool, ()))
        self._index.add_matching(tool, positions)
        return tuple(self.rules[i] for i in sorted(positions))


class _PatternIndex:
    """Finds the rules (by index) one of whose patterns matches a name, as ``Rule.matches_tool`` would.

    Each pattern goes where its ``matches`` can be decided without trying it on every name:

    * a mesh7 ``Glob`` is true for its own ``text`` (the "pattern equals value" rule) and, if it
      names one tool, for that name: both go in ``_certain``; ``*`` is true for every name
      (``_everything``); any other glob's anchored regex begins with its literal prefix, so it can
      only match a name that starts with that prefix: it is filed under the prefix
      (``_by_prefix``) and tried only on such names;
    * any other pattern kind (an Assay pattern with a star, an ``OutsidePattern``) is tried on
      every name (``_try_always``).

    Only whether a rule matches is computed here; order and provenance come from the rules.
    """

    __slots__ = ("_by_prefix", "_certain", "_everything", "_lengths", "_try_always")

    def __init__(self, rules: tuple[Rule, ...]) -> None:
        certain: dict[str, set[int]] = {}
        by_prefix: dict[str, list[tuple[int, ToolPattern]]] = {}
        everything: set[int] = set()
        try_always: list[tuple[int, ToolPattern]] = []
        for rule in rules:
            for pattern in rule.tools:
                if not isinstance(pattern, Glob):
                    try_always.append((rule.index, pattern))
                elif pattern.kind is GlobKind.CATCH_ALL:
                    everything.add(rule.index)
                else:
                    certain.setdefault(pattern.text, set()).add(rule.index)
                    if pattern.exact_value is not None:
                        certain.setdefault(pattern.exact_value, set()).add(rule.index)
                    else:
                        by_prefix.setdefault(pattern.literal_prefix, []).append((rule.index, pattern))
        self._certain = {name: frozenset(found) for name, found in certain.items()}
        self._by_prefix = {prefix: tuple(found) for prefix, found in by_prefix.items()}
        self._lengths = tuple(sorted({len(prefix) for prefix in by_prefix}))
        self._everything = frozenset(everything)
        self._try_always = tuple(try_always)

    def add_matching(self, name: str, positions: set[int]) -> None:
        """Add to ``positions`` the index of every rule one of whose patterns matches ``name``."""
        found = self._certain.get(name)
        if found:
            positions |= found
        if self._everything:
            positions |= self._everything
        by_prefix = self._by_prefix
        size = len(name)
        for length in self._lengths:
            if length > size:
                break
            for index, pattern in by_prefix.get(name[:length], ()):
                if index not in positions and pattern.matches(name):
                    positions.add(index)
        for index, pattern in self._try_always:
            if index not in positions and pattern.matches(name):
                positions.add(index)


@dataclass(frozen=True)
class PolicySet:
    """All loaded policies in evaluation order (most specific agent glob first).

    ``memo`` caches, per (agent, tool), the candidate rules and schemas: the
    evaluator's only state, invisible in results, bounded in size, and dropped
    with the set when a reload swaps in a new one.
    """

    policies: tuple[Policy, ...]
    memo: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_policies(cls, policies: list[Policy] | tuple[Policy, ...]) -> PolicySet:
        """Order policies given in load (file-name) order by agent specificity, stably."""
        ordered = sorted(policies, key=lambda p: p.agent.specificity)
        return cls(tuple(ordered))

    def by_name(self, name: str) -> Policy | None:
        for policy in self.policies:
            if policy.name == name:
                return policy
        return None

    def policies_for(self, agent: str) -> tuple[Policy, ...]:
        """The policies whose agent glob matches ``agent``, in evaluation order."""
        return tuple(p for p in self.policies if p.agent.matches(agent))
