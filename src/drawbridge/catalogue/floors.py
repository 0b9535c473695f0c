"""Floors: the least strict action a call to a tool can get, whatever the policy says.

Invariant: a floor is combined with the policy's decision as ``stricter(floor, decision)``
(``allow < human_approval < deny``), so no policy, rule order or condition can relax it.
``apply_floor`` says when the floor, not the policy, set the action, so that the pipeline can
keep a grant from lifting it (grants never lift ``deny`` in any case). Two things set a floor:

| what                                   | floor                                        |
|----------------------------------------|----------------------------------------------|
| pin status ``pinned`` (or pinning off) | none (``allow``)                             |
| pin status ``new``                     | ``deny``                                     |
| pin status ``changed``                 | ``human_approval``                           |
| the call resolves to a CLI dispatcher  | ``human_approval``, or the CLI tool's        |
|                                        | ``default_action`` when that is stricter     |

When both apply, the stricter one wins. The dispatcher floor belongs to the tool the call
*resolves to*: ``terraform.init`` served by ``terraform.__dispatch`` gets it just like a direct
call of ``terraform.__dispatch``, so naming the subcommand in the tool name cannot escape it.
A CLI tool's ``default_action`` (which mesh7 parses and never enforces) can only tighten the
dispatcher floor: ``allow`` there still leaves ``human_approval``.

Theory of operation. ``tool_floor`` builds a ``Floor`` (an action and the reasons for it) from
the pin status and the dispatcher facts; ``apply_floor`` combines it with the policy's action
and says whether the floor decided. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from drawbridge.catalogue.fingerprint import PinStatus
from drawbridge.policy.model import Action, stricter

PIN_FLOORS: Final = {
    PinStatus.PINNED: Action.ALLOW,
    PinStatus.NEW: Action.DENY,
    PinStatus.CHANGED: Action.HUMAN_APPROVAL,
}
DISPATCHER_FLOOR: Final = Action.HUMAN_APPROVAL

_PIN_REASONS: Final = {
    PinStatus.NEW: "the tool appeared after the server's catalogue was pinned",
    PinStatus.CHANGED: "the tool changed since its pinned version was accepted",
}


@dataclass(frozen=True, slots=True)
class Floor:
    """A floor action and why. ``allow`` with no reasons is no floor at all."""

    action: Action
    reasons: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.action, Action):
            raise ValueError(f"unknown floor action {self.action!r}")
        if self.action is not Action.ALLOW and not self.reasons:
            raise ValueError("a floor above allow says why")


NO_FLOOR: Final = Floor(Action.ALLOW)


def pin_floor(status: PinStatus | None) -> Action:
    """The floor of a pin status; ``None`` (pinning off, or a tool no pin store covers) is none."""
    if status is None:
        return Action.ALLOW
    return PIN_FLOORS[PinStatus(status)]


def dispatcher_floor(default_action: Action | None = None) -> Action:
    """The floor of a call that resolves to a CLI dispatcher."""
    if default_action is None:
        return DISPATCHER_FLOOR
    return stricter(DISPATCHER_FLOOR, Action(default_action))


def tool_floor(
    pin_status: PinStatus | None = None,
    *,
    dispatcher: bool = False,
    dispatcher_default_action: Action | None = None,
    pin_reason: str | None = None,
) -> Floor:
    """The floor for a call to one tool: the stricter of its pin floor and its dispatcher floor.
    ``pin_reason`` says why a tool is held back when it is not its status alone (the server's
    catalogue not checked yet, its pins unavailable): the reason a call gets then, not the status's."""
    if dispatcher_default_action is not None and not dispatcher:
        raise ValueError("dispatcher_default_action is given only for a dispatcher")
    action = Action.ALLOW
    reasons: list[str] = []
    pinned = pin_floor(pin_status)
    if pinned is not Action.ALLOW:
        action = stricter(action, pinned)
        reason = pin_reason if pin_reason is not None else _PIN_REASONS[PinStatus(pin_status)]
        reasons.append(f"pin status {PinStatus(pin_status).value}: {reason}")
    if dispatcher:
        floor = dispatcher_floor(dispatcher_default_action)
        action = stricter(action, floor)
        reasons.append(
            "CLI dispatcher: the subcommand is an argument, so a rule on the name cannot judge the effect"
            if floor is DISPATCHER_FLOOR
            else f"CLI dispatcher whose default_action is {floor.value}"
        )
    return Floor(action, tuple(reasons))


@dataclass(frozen=True, slots=True)
class Floored:
    """The action after the floor, and whether the floor (not the policy) set it."""

    action: Action
    by_floor: bool


def apply_floor(floor: Floor | Action, decided: Action) -> Floored:
    """``stricter(floor, decided)``. ``by_floor`` is true only when the floor raised the action."""
    floor_action = floor.action if isinstance(floor, Floor) else Action(floor)
    result = stricter(floor_action, Action(decided))
    return Floored(result, result is not Action(decided))


__all__ = [
    "DISPATCHER_FLOOR",
    "NO_FLOOR",
    "PIN_FLOORS",
    "Floor",
    "Floored",
    "apply_floor",
    "dispatcher_floor",
    "pin_floor",
    "stricter",
    "tool_floor",
]
