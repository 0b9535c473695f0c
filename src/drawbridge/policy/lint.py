"""What ``drawbridge policy check`` warns about in a policy set that loads: rules that can never decide.

Invariant: a finding is only reported when it is certain: a rule is *shadowed* when an earlier
unconditional rule of the same policy matches every name it could match (so the later rule is never
reached), and *dead* when, against a given catalogue of served names, none of its patterns matches a
served tool; a pattern that matches no served tool in a rule that other patterns keep alive is reported
too, on its own. Without a catalogue only shadowing is judged, and only where one pattern plainly covers
another (``*``, the same text, or a literal name the earlier pattern matches); a rule that might be
shadowed is not reported. Each finding names the file, the rule's index and line.

Theory of operation. ``shadowed_rules(policies, names)`` and ``dead_rules(policies, names)`` are pure
functions of the loaded set and the served names; a dead rule's message suggests the served names
that end in what was written (``git_commit`` for ``git.git_commit``), the usual slip.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from drawbridge.policy.model import Policy, PolicySet, Rule, ToolPattern


@dataclass(frozen=True, slots=True)
class Finding:
    """One warning about one rule."""

    kind: str
    """``shadowed`` or ``dead``."""
    policy: str
    source_file: str
    rule_index: int
    line: int
    message: str
    pattern: str | None = None
    """For a dead pattern of a rule that other patterns keep alive: that pattern's text."""

    def describe(self) -> str:
        return f"{self.source_file}:{self.line}: policy {self.policy!r} rule {self.rule_index}: {self.message}"


def _patterns(rule: Rule) -> str:
    return ", ".join(pattern.text for pattern in rule.tools)


def _covers(earlier: ToolPattern, later: ToolPattern) -> bool:
    """``earlier`` matches every name ``later`` can match (judged without a catalogue)."""
    if earlier.text == "*" or earlier.text == later.text:
        return True
    literal = later.exact_value
    return literal is not None and earlier.matches(literal)


def _shadowing(policy: Policy, rule: Rule, names: Sequence[str] | None) -> Rule | None:
    for earlier in policy.rules[: rule.index]:
        if earlier.conditions:
            continue
        if names is not None:
            reached = [name for name in names if rule.matches_tool(name)]
            if reached and all(earlier.matches_tool(name) for name in reached):
                return earlier
        if all(any(_covers(e, later) for e in earlier.tools) for later in rule.tools):
            return earlier
    return None


def shadowed_rules(policies: PolicySet, names: Sequence[str] | None = None) -> list[Finding]:
    """Rules an earlier unconditional rule of the same policy always decides before them."""
    found: list[Finding] = []
    for policy in policies.policies:
        for rule in policy.rules:
            earlier = _shadowing(policy, rule, names)
            if earlier is not None:
                found.append(Finding(
                    "shadowed", policy.name, policy.source_file, rule.index, rule.line,
                    f"never decides: rule {earlier.index} (line {earlier.line}, tools {_patterns(earlier)}, "
                    f"{earlier.action.value}) matches every tool it names ({_patterns(rule)}) first",
                ))
    return found


def _suggestions(pattern: ToolPattern, names: Sequence[str]) -> list[str]:
    return sorted(name for name in names if name.endswith("." + pattern.text))[:3]


def _hint(patterns: Sequence[ToolPattern], names: Sequence[str]) -> str:
    hints = [hint for pattern in patterns for hint in _suggestions(pattern, names)]
    return f"; did you mean {', '.join(hints)}?" if hints else ""


def dead_rules(policies: PolicySet, names: Sequence[str]) -> list[Finding]:
    """Rules none of whose patterns matches a served tool name, and each dead pattern of a rule that
    another pattern keeps alive (``tools: [get_secret, fake.get_report]`` under serve: the first one
    was meant to deny or allow something and does nothing)."""
    found: list[Finding] = []
    for policy in policies.policies:
        for rule in policy.rules:
            dead = [pattern for pattern in rule.tools if not any(pattern.matches(name) for name in names)]
            if len(dead) == len(rule.tools):
                found.append(Finding(
                    "dead", policy.name, policy.source_file, rule.index, rule.line,
                    f"matches no tool the upstreams serve (tools {_patterns(rule)})"
                    f"{_hint(rule.tools, names)}",
                ))
                continue
            for pattern in dead:
                found.append(Finding(
                    "dead", policy.name, policy.source_file, rule.index, rule.line,
                    f"pattern {pattern.text!r} matches no tool the upstreams serve (its other patterns do)"
                    f"{_hint([pattern], names)}",
                    pattern.text,
                ))
    return found


__all__ = ["Finding", "dead_rules", "shadowed_rules"]
