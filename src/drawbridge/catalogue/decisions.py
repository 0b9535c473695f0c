"""Per-agent decision tables and which tools an agent's ``tools/list`` may leave out (pure).

Invariant: a tool is hidden from an agent only when every path through the policy ends in deny
after floors: the fall-through action and the action of each conditional rule that could decide
before it, each raised by the tool's floor (``stricter(floor, action)``). A conditional deny, a
``human_approval`` anywhere, an ``allow`` anywhere keeps the tool listed. Grants lift only
``human_approval``, so a hidden tool could never have been called; its calls are still
evaluated and refused by the pipeline, hiding changes nothing there.

Theory of operation. ``decision_table`` takes the policy set, the agent and the catalogue (per
tool: its name, its classification, its pin status, whether it is a CLI dispatcher) and builds
one ``ToolDecisionRow`` per tool from ``evaluate.explain`` (the fall-through decision and the
conditional candidates before it) and ``catalogue.floors.tool_floor``. Rows say what the policy
decides (``policy_action``, with provenance: policy, ``source_file``, ``rule_index``, line), what
the floor makes of it (``action``), which floor and why, the conditional rules with their own
and floored actions, the pin status, and ``hidden``. Grants are not reflected: they belong to a
session, not to the catalogue. ``as_dict`` is the JSON ``GET /tools/decisions?agent=`` serves.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from drawbridge.catalogue.classify import Classification
from drawbridge.catalogue.fingerprint import PinStatus
from drawbridge.catalogue.floors import NO_FLOOR, Floor, apply_floor, tool_floor
from drawbridge.policy.evaluate import ToolView, explain
from drawbridge.policy.model import Action, Decision, PolicySet


@dataclass(frozen=True, slots=True)
class CatalogueTool:
    """What the table needs to know about one tool besides the policy."""

    name: str
    classification: Classification | None = None
    pin_status: PinStatus | None = None
    dispatcher: bool = False
    dispatcher_default_action: Action | None = None
    pin_reason: str | None = None
    """Why the tool is held back when its status alone does not say (``floors.tool_floor``)."""

    @property
    def floor(self) -> Floor:
        return tool_floor(
            self.pin_status,
            dispatcher=self.dispatcher,
            dispatcher_default_action=self.dispatcher_default_action,
            pin_reason=self.pin_reason,
        )


ToolInput = CatalogueTool | tuple[Any, ...]


def as_catalogue_tool(item: ToolInput) -> CatalogueTool:
    """A ``CatalogueTool``, or a tuple ``(name, classification, pin_status, dispatcher)``."""
    if isinstance(item, CatalogueTool):
        return item
    if isinstance(item, tuple) and 1 <= len(item) <= 5:
        tool = CatalogueTool(*item)
        if not isinstance(tool.name, str) or not tool.name:
            raise ValueError("a tool needs a non-empty string name")
        return tool
    raise ValueError(f"not a catalogue tool: {item!r}")


@dataclass(frozen=True, slots=True)
class ConditionalPath:
    """A conditional rule evaluated before the fall-through; it decides when its conditions hold."""

    policy: str
    source_file: str
    rule_index: int
    line: int
    policy_action: Action
    action: Action
    conditions: tuple[tuple[str, str], ...]
    """(argument path, operator) of each condition; the compared values are not repeated here."""

    def as_dict(self) -> dict[str, Any]:
        first_field, first_op = self.conditions[0]
        return {
            "action": self.action.value,
            "policy_action": self.policy_action.value,
            "rule": self.policy,
            "source_file": self.source_file,
            "rule_index": self.rule_index,
            "line": self.line,
            "field": first_field,
            "operator": first_op,
            "conditions": [{"field": f, "operator": o} for f, o in self.conditions],
        }


@dataclass(frozen=True, slots=True)
class SchemaRef:
    """An argument schema that applies to the tool for this agent (it can only turn a call into deny)."""

    policy: str
    source_file: str
    line: int


@dataclass(frozen=True, slots=True)
class ToolDecisionRow:
    """What the policy decides for one tool and one agent, before any call."""

    name: str
    classification: Classification | None
    action: Action
    """The fall-through action after the floor."""
    decision: Decision
    """The fall-through decision of the policy (before the floor), with its provenance."""
    conditional: tuple[ConditionalPath, ...]
    floor: Floor
    by_floor: bool
    """The floor, not the policy, set ``action``."""
    pin_status: PinStatus | None
    dispatcher: bool
    schemas: tuple[SchemaRef, ...]
    hidden: bool

    @property
    def policy_action(self) -> Action:
        return self.decision.action

    @property
    def rule(self) -> str | None:
        return self.decision.policy

    @property
    def source_file(self) -> str | None:
        return self.decision.source_file

    @property
    def rule_index(self) -> int | None:
        return self.decision.rule_index

    @property
    def line(self) -> int | None:
        return self.decision.line

    @property
    def possible_actions(self) -> frozenset[Action]:
        """Every action a call could get, after the floor."""
        return frozenset({self.action, *(c.action for c in self.conditional)})

    @property
    def to_review(self) -> bool:
        """Some call could be allowed, and the tool is not a plain named read (or is unclassified)."""
        plain_read = self.classification is not None and self.classification.is_named_read
        return Action.ALLOW in self.possible_actions and not plain_read

    def as_dict(self) -> dict[str, Any]:
        floor = None
        if self.floor.action is not Action.ALLOW:
            floor = {"action": self.floor.action.value, "reasons": list(self.floor.reasons)}
        return {
            "name": self.name,
            "classification": None if self.classification is None else self.classification.as_dict(),
            "action": self.action.value,
            "policy_action": self.policy_action.value,
            "rule": self.rule,
            "source_file": self.source_file,
            "rule_index": self.rule_index,
            "line": self.line,
            "basis": self.decision.basis.value,
            "conditional": [c.as_dict() for c in self.conditional],
            "floor": floor,
            "by_floor": self.by_floor,
            "pin_status": None if self.pin_status is None else PinStatus(self.pin_status).value,
            "dispatcher": self.dispatcher,
            "schemas": [
                {"policy": s.policy, "source_file": s.source_file, "line": s.line} for s in self.schemas
            ],
            "hidden": self.hidden,
            "to_review": self.to_review,
        }


def _always_denied(view: ToolView, floor: Floor) -> bool:
    return all(apply_floor(floor, action).action is Action.DENY for action in view.possible_actions)


def is_hidden(policy_set: PolicySet, agent: str, tool: str, floor: Floor = NO_FLOOR) -> bool:
    """True when every path through the policy ends in deny for ``agent`` after ``floor``."""
    return _always_denied(explain(policy_set, agent, tool), floor)


def decision_row(policy_set: PolicySet, agent: str, item: ToolInput) -> ToolDecisionRow:
    tool = as_catalogue_tool(item)
    floor = tool.floor
    view = explain(policy_set, agent, tool.name)
    floored = apply_floor(floor, view.fallthrough.action)
    conditional = tuple(
        ConditionalPath(
            policy=c.policy.name,
            source_file=c.policy.source_file,
            rule_index=c.rule.index,
            line=c.rule.line,
            policy_action=c.rule.action,
            action=apply_floor(floor, c.rule.action).action,
            conditions=tuple((cond.arg_text, cond.op.value) for cond in c.rule.conditions),
        )
        for c in view.conditional
    )
    schemas = tuple(SchemaRef(p.name, p.source_file, s.line) for p, s in view.schemas)
    return ToolDecisionRow(
        name=tool.name,
        classification=tool.classification,
        action=floored.action,
        decision=view.fallthrough,
        conditional=conditional,
        floor=floor,
        by_floor=floored.by_floor,
        pin_status=tool.pin_status,
        dispatcher=tool.dispatcher,
        schemas=schemas,
        hidden=_always_denied(view, floor),
    )


def decision_table(policy_set: PolicySet, agent: str, tools: Iterable[ToolInput]) -> list[ToolDecisionRow]:
    """One row per tool, in the order given."""
    return [decision_row(policy_set, agent, item) for item in tools]


__all__ = [
    "CatalogueTool",
    "ConditionalPath",
    "SchemaRef",
    "ToolDecisionRow",
    "as_catalogue_tool",
    "decision_row",
    "decision_table",
    "is_hidden",
]
