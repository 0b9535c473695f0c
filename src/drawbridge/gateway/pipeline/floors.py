"""The floor stage: the least strict action a call can get from the catalogue, whatever the policy says.

Invariant: every tools/call is raised to the floor of the tool it resolves to before the policy's
verdict counts: ``stricter(floor, verdict)``, so no rule relaxes it. The floor of a route is the
stricter of its pin floor (``pins.CataloguePins``: ``new`` deny, ``changed`` human_approval, an
unchecked or unreadable catalogue deny) and its dispatcher floor (a CLI dispatcher: human_approval,
or its ``default_action`` when stricter) -- the same ``catalogue.floors.tool_floor`` rules that
``/tools/decisions`` shows. A floor that raised the action is named as the decider, and a
``human_approval`` it raised is ``person_only``: no grant, no approval memory and no client's answer lifts
it, only an operator's approval (as for a changed pin under a policy that asks too).

Theory of operation. ``Floors.now(route)`` answers without waiting, or None while the pins of the
route's server are being checked; ``Floors.when_checked(route)`` waits for that check (bounded, in
``CataloguePins``) and answers. Without pinning only the dispatcher floor applies.

Before any floor, a route may refuse arguments its upstream could never run (``Route.refusal``: a CLI
call whose subcommand is an option, ``--exec-path=...``, or that holds a shell metacharacter):
``refused_arguments`` makes that a deny by the gateway, so no policy is asked and no person is asked to
approve a call that would be refused once approved. A check that raises denies too (its type named).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from drawbridge.canonical import sanitize
from drawbridge.catalogue.classify import Family, classify_tool
from drawbridge.catalogue.floors import NO_FLOOR, Floor, apply_floor, tool_floor
from drawbridge.gateway.pipeline.pins import CataloguePins
from drawbridge.gateway.pipeline.verdicts import GATEWAY_POLICY, Action, Provenance, Verdict
from drawbridge.policy.model import stricter


@dataclass(frozen=True, slots=True)
class Route:
    """Where a tools/call goes: the upstream that serves the tool, and what the catalogue says of it."""

    server: str
    """The upstream's name: its namespace under ``serve``, its ``--server-id`` under ``wrap``."""
    tool: str
    """The upstream's own name for the tool (the namespace taken off)."""
    dispatcher: bool = False
    """The tool is a CLI dynamic dispatcher: the subcommand is an argument."""
    dispatcher_default_action: Action | None = None
    generic: bool = False
    """The tool is generic (``catalogue.classify``: its argument carries the effect), so approval
    memory never stands in for a person on its calls."""
    refusal: Callable[[Mapping[str, Any]], str | None] | None = field(default=None, compare=False)
    """Why the upstream would refuse these arguments before running anything, or None (module docstring)."""


def route_of(server: str, name: str, tool: Mapping[str, Any]) -> Route:
    """The route of one listed tool, classified once per catalogue (not per call). A tool that cannot
    be classified counts as generic: memory is then never applied to it."""
    try:
        generic = classify_tool(tool).family is Family.GENERIC
    except ValueError:
        generic = True
    return Route(server, name, generic=generic)


DISPATCHER_ONLY: Final = tool_floor(dispatcher=True)


def joined(first: Floor, second: Floor) -> Floor:
    """The stricter of two floors, with the reasons of every floor above allow."""
    if second.action is Action.ALLOW:
        return first
    if first.action is Action.ALLOW:
        return second
    return Floor(stricter(first.action, second.action), first.reasons + second.reasons)


def _dispatcher(route: Route) -> Floor:
    if not route.dispatcher:
        return NO_FLOOR
    if route.dispatcher_default_action is None:
        return DISPATCHER_ONLY
    return tool_floor(dispatcher=True, dispatcher_default_action=route.dispatcher_default_action)


class Floors:
    """The floors of routes: pins (when the catalogue is pinned) and CLI dispatchers (module docstring)."""

    def __init__(self, pins: CataloguePins | None = None) -> None:
        self.pins = pins

    def now(self, route: Route) -> Floor | None:
        """The route's floor without waiting; None while its server's catalogue is being checked."""
        if self.pins is None and not route.dispatcher:
            return NO_FLOOR  # the usual call: nothing to raise it
        floor = _dispatcher(route)
        if self.pins is None:
            return floor
        if self.pins.checking(route.server):
            return None
        return joined(self.pins.floor(route.server, route.tool), floor)

    def current(self, route: Route) -> Floor:
        """The route's floor now, a check in progress or not (an unchecked catalogue is held back)."""
        floor = _dispatcher(route)
        if self.pins is None:
            return floor
        return joined(self.pins.floor(route.server, route.tool), floor)

    async def when_checked(self, route: Route) -> Floor:
        floor = _dispatcher(route)
        if self.pins is None:
            return floor
        return joined(await self.pins.floor_when_checked(route.server, route.tool), floor)


def refused_arguments(route: Route, tool: str, arguments: Mapping[str, Any]) -> Verdict | None:
    """A deny by the gateway when the route's upstream could never run ``arguments`` (module docstring)."""
    if route.refusal is None:
        return None
    try:
        problem = route.refusal(arguments)
    except Exception as exc:  # noqa: BLE001 -- a check that fails is a refusal, whatever it raised
        problem = f"the arguments could not be checked ({type(exc).__name__})"
    if problem is None:
        return None
    reason = f"invalid arguments for {sanitize(tool)}: {problem}"
    return Verdict(Action.DENY, reason, Provenance(GATEWAY_POLICY))


def floored_verdict(verdict: Verdict, floor: Floor, tool: str) -> Verdict:
    """The verdict after the floor; when the floor raised the action, it is named as the decider."""
    if floor.action is Action.ALLOW:
        return verdict
    floored = apply_floor(floor, verdict.action)
    if not floored.by_floor:
        if floor.action is Action.HUMAN_APPROVAL and verdict.action is Action.HUMAN_APPROVAL:
            # The policy asks too, but the floor's question is still a person's (a changed pin).
            return dataclasses.replace(verdict, person_only=True, floor_reasons=floor.reasons)
        return verdict
    said = f"the policy said {verdict.action.value} ({verdict.provenance.label()})"
    reason = f"catalogue floor on {sanitize(tool)}: {'; '.join(floor.reasons)}; {said}"
    action = floored.action
    kept = verdict.provenance  # the policy's verdict still counted: its set, and the shadow beside it
    provenance = Provenance(GATEWAY_POLICY, policy_set=kept.policy_set, shadow=kept.shadow)
    person_only = action is Action.HUMAN_APPROVAL
    reasons = floor.reasons if person_only else ()
    return Verdict(action, reason, provenance, person_only=person_only, floor_reasons=reasons)


__all__ = ["Floors", "Route", "floored_verdict", "joined", "refused_arguments", "route_of"]
