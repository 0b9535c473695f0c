"""Policy evaluation: one (agent, tool, arguments) in, one ``Decision`` out.

The evaluation order, in plain words:

1. Only policies whose ``agent`` glob matches the caller take part. They are
   tried most specific first: an exact agent name, then globs with a longer
   literal prefix, then ``*``; equally specific policies in file-name order.
2. Within a policy, rules are tried top to bottom; a policy in which no rule
   decides falls through to the next policy.
3. A rule is a candidate when one of its ``tools`` globs matches the tool name
   as the agent called it.
4. A candidate without ``when`` decides. A candidate with ``when`` decides
   when all its conditions hold, and is skipped when one of them is false.
5. A candidate whose conditions cannot be evaluated for this call (an
   argument is missing, has the wrong type, is too long) might or might not
   apply, so the result is the stricter of the two outcomes: an ``allow``
   rule is skipped, a ``deny`` rule denies, a ``human_approval`` rule asks a
   human unless what follows it denies. Such a condition never yields allow.
6. When no rule decides, the call is denied: ``rule_index`` None, reason
   "no rule matched".
7. When the result is not deny, the arguments are checked against every
   schema declared for this tool by the policies of step 1; a violation
   denies, naming the schema's policy and file, the failing location and
   keyword, never a value.

Every decision names its policy, ``source_file``, ``rule_index`` and line.

Theory of operation. Steps 1-3 depend only on (agent, tool), so they are
computed once per pair and memoised on the ``PolicySet`` (bounded; a reload
brings a new set and an empty memo). The memo entry keeps only the reachable
candidates (up to the first unconditional one) and, when no condition is
involved, the final decision itself, precomputed at load: the common call is
two dict lookups and no allocation. Conditions run their precompiled tests;
schemas their precompiled validators, and all the regexes of one call share
one budget (``regexes.call_budget``), so no argument can make a call stall.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from drawbridge.policy.conditions import all_hold, why_unknown
from drawbridge.policy.model import (
    DEFAULT_DENY,
    Action,
    Basis,
    Condition,
    Decision,
    Policy,
    PolicySet,
    Rule,
    ToolSchema,
    Truth,
)
from drawbridge.policy.regexes import call_budget
from drawbridge.policy.schemas import check_arguments

MEMO_MAX_ENTRIES = 4096
MEMO_MAX_KEY_CHARS = 512

_ALLOW, _DENY = Action.ALLOW, Action.DENY
_FALSE, _UNKNOWN = Truth.FALSE, Truth.UNKNOWN


@dataclass(frozen=True, slots=True)
class Candidate:
    """A rule that names the tool, in evaluation order, with its policy."""

    policy: Policy
    rule: Rule

    @property
    def conditional(self) -> bool:
        return bool(self.rule.conditions)

    @property
    def decision(self) -> Decision:
        """The decision this rule gives when it applies."""
        return self.policy.decisions[self.rule.index]

    def __repr__(self) -> str:
        return (
            f"Candidate(policy={self.policy.name!r}, rule_index={self.rule.index}, "
            f"action={self.rule.action.value!r}, conditional={self.conditional})"
        )


@dataclass(frozen=True, slots=True)
class _Plan:
    steps: tuple[Candidate, ...]
    fixed: Decision | None
    schemas: tuple[tuple[Policy, ToolSchema], ...]


def _candidates(policies: tuple[Policy, ...], tool: str) -> tuple[Candidate, ...]:
    """Reachable candidates: every matching rule up to and including the first unconditional one."""
    out: list[Candidate] = []
    for policy in policies:
        for rule in policy.rules_for_tool(tool):
            out.append(Candidate(policy, rule))
            if not rule.conditions:
                return tuple(out)
    return tuple(out)


def _plan(policy_set: PolicySet, agent: str, tool: str) -> _Plan:
    policies = policy_set.policies_for(agent)
    steps = _candidates(policies, tool)
    fixed: Decision | None
    if not steps:
        fixed = DEFAULT_DENY
    elif not steps[0].rule.conditions:
        fixed = steps[0].decision
    else:
        fixed = None
    schemas = tuple((p, p.schemas[tool]) for p in policies if tool in p.schemas)
    return _Plan(steps, fixed, schemas)


def _lookup(policy_set: PolicySet, agent: str, tool: str) -> _Plan:
    key = (agent, tool)
    memo = policy_set.memo
    plan = memo.get(key)
    if plan is None:
        plan = _plan(policy_set, agent, tool)
        if len(agent) + len(tool) <= MEMO_MAX_KEY_CHARS:
            if len(memo) >= MEMO_MAX_ENTRIES:
                memo.clear()
            memo[key] = plan
    return plan


def _unknown(candidate: Candidate, condition: Condition, arguments: Any) -> Decision:
    rule, policy = candidate.rule, candidate.policy
    reason = (
        f"{rule.action} by rule {rule.index} of policy {policy.name!r} ({policy.source_file}:{rule.line}): "
        f"its condition cannot be evaluated ({why_unknown(condition, arguments)}), "
        "so the stricter outcome applies"
    )
    return Decision(
        rule.action, policy.name, policy.source_file, rule.index, reason, rule.line, Basis.CONDITION_UNKNOWN,
        rule.approver, rule.memory_key,
    )


def _walk(steps: tuple[Candidate, ...], arguments: Any) -> Decision:
    pending: tuple[Candidate, Condition] | None = None
    for candidate in steps:
        rule = candidate.rule
        if rule.conditions:
            truth, unknown = all_hold(rule.conditions, arguments)
            if truth is _FALSE:
                continue
            if truth is _UNKNOWN:
                assert unknown is not None
                if rule.action is _ALLOW:
                    continue
                if rule.action is _DENY:
                    return _unknown(candidate, unknown, arguments)
                if pending is None:  # human_approval: ask, unless something later denies
                    pending = (candidate, unknown)
                continue
        decision = candidate.policy.decisions[rule.index]
        if pending is not None and decision.action is not _DENY:
            return _unknown(pending[0], pending[1], arguments)
        return decision
    return DEFAULT_DENY


def _schema_deny(policy: Policy, schema: ToolSchema, arguments: Any) -> Decision | None:
    violation = check_arguments(schema, arguments)
    if violation is None:
        return None
    reason = (
        f"deny: the arguments violate the schema for {schema.tool!r} in policy {policy.name!r} "
        f"({policy.source_file}:{schema.line}): {violation.describe()}"
    )
    return Decision(_DENY, policy.name, policy.source_file, None, reason, schema.line, Basis.SCHEMA)


def evaluate(policy_set: PolicySet, agent: str, tool: str, arguments: Any = None) -> Decision:
    """Decide one call. ``arguments`` is the call's JSON-decoded ``arguments`` (None = none)."""
    plan = _lookup(policy_set, agent, tool)
    decision = plan.fixed
    if decision is not None and (not plan.schemas or decision.action is _DENY):
        return decision  # the common call: no condition to run, no schema to check
    with call_budget():  # every regex this call runs shares one budget (``regexes``)
        if decision is None:
            decision = _walk(plan.steps, arguments)
        if plan.schemas and decision.action is not _DENY:
            for policy, schema in plan.schemas:
                refused = _schema_deny(policy, schema, arguments)
                if refused is not None:
                    return refused
        return decision


# ----------------------------------------------------------------------------- views for tables


def candidate_rules(policy_set: PolicySet, agent: str, tool: str) -> tuple[Candidate, ...]:
    """The rules that can decide ``tool`` for ``agent``, in evaluation order.

    Stops at the first unconditional rule: rules after it can never decide.
    Each candidate says whether it is conditional.
    """
    return _lookup(policy_set, agent, tool).steps


@dataclass(frozen=True, slots=True)
class ToolView:
    """What the policy decides for one tool and one agent, before any call.

    ``fallthrough`` is where evaluation lands when no condition holds (the
    first unconditional rule, or the default deny); ``conditional`` are the
    conditional rules evaluated before it, each of which decides when its
    conditions hold. ``schemas`` can only turn a result into deny.
    """

    fallthrough: Decision
    conditional: tuple[Candidate, ...]
    schemas: tuple[tuple[Policy, ToolSchema], ...]

    @property
    def possible_actions(self) -> frozenset[Action]:
        """Every action some call could get (a condition that cannot be evaluated adds none)."""
        return frozenset({self.fallthrough.action, *(c.rule.action for c in self.conditional)})


def explain(policy_set: PolicySet, agent: str, tool: str) -> ToolView:
    """The decision-table entry for (agent, tool)."""
    plan = _lookup(policy_set, agent, tool)
    steps = plan.steps
    if steps and not steps[-1].rule.conditions:
        return ToolView(steps[-1].decision, steps[:-1], plan.schemas)
    return ToolView(DEFAULT_DENY, steps, plan.schemas)
