"""The floors ``drawbridge policy explain --config`` computes for one tool, offline.

Invariant: the floor shown is the one a running ``serve`` of the same configuration would apply to
the tool as its upstream lists it now, computed by the gateway's own code: the route discover reads
(``discover_cmd.classify_catalogue``: a CLI dispatcher and its ``default_action``), the pin status
``catalogue.fingerprint.compare`` gives the listed definition against the pins in the state file,
``catalogue.floors.tool_floor`` and ``pipeline.floors.joined``. Nothing is written: the pins are
read, never pinned on first use, so a catalogue never pinned yet is reported as the first run would
pin it (no pin floor). Pins a running gateway holds in a shared PostgreSQL state are not read here;
the note says so, and ``drawbridge tools decisions`` shows them live.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.to_thread

from drawbridge.catalogue.fingerprint import compare
from drawbridge.catalogue.floors import NO_FLOOR, Floor, tool_floor
from drawbridge.cli.discover_cmd import DiscoveredTool, discover
from drawbridge.config import GatewayConfig
from drawbridge.gateway.pipeline.floors import Floors, joined
from drawbridge.policy.model import Action
from drawbridge.state.sqlite import StateDB, StateError


@dataclass(frozen=True, slots=True)
class ToolFloor:
    """The tool's floor (``NO_FLOOR`` when nothing raises it) and what the reading found."""

    floor: Floor
    notes: tuple[str, ...] = ()
    served: bool = True


async def _pinned(config: GatewayConfig, tool: DiscoveredTool) -> tuple[Floor, str | None]:
    """The pin floor of the tool and a note; reads the SQLite state file, never writes it."""
    if not config.pin_tools:
        return NO_FLOOR, "pins: pin_tools is off, no pin floor"
    if config.shared_state is not None:
        return NO_FLOOR, ("pins: held in the shared PostgreSQL state, not read here "
                          "(drawbridge tools decisions shows them for a running gateway)")
    path = Path(config.state_path)
    if not path.exists():
        return NO_FLOOR, f"pins: {path} does not exist yet; the first run pins {tool.server!r} as it lists now"
    from drawbridge.state.pins import SqlitePinStore

    try:
        db = await anyio.to_thread.run_sync(StateDB.open, str(path))
        try:
            store = SqlitePinStore(db)
            never = not await store.is_pinned(tool.server)
            pins = await store.load(tool.server)
        finally:
            db.close()
    except StateError as exc:
        held = Floor(Action.DENY, (f"the pins in {path} cannot be read ({exc})",))
        return held, "pins: unreadable; a running gateway holds every tool of the server back"
    if never:
        return NO_FLOOR, f"pins: {tool.server!r} was never pinned; the first run pins it as it lists now"
    try:
        status = compare({name: pin.fingerprint for name, pin in pins.items()}, [tool.item]).tools[0].status
    except ValueError as exc:  # a pin that cannot be read, a definition that cannot be fingerprinted
        held = Floor(Action.DENY, (f"the tool cannot be checked against its pins ({exc})",))
        return held, "pins: not comparable; a running gateway holds the tool back"
    return tool_floor(status), f"pins: {tool.upstream_name!r} of {tool.server!r} is {status.value}"


async def tool_floor_of(config: GatewayConfig, name: str, timeout: float) -> ToolFloor:
    """The floor of ``name`` (the name agents see under serve) for ``config``'s upstreams, read live."""
    found = await discover(config, timeout)
    notes = [f"upstream not read: {why}" for why in found.unavailable]
    tool = next((t for t in found.tools if t.name == name), None)
    if tool is None or tool.route is None:
        notes.append(f"no upstream serves {name!r}: serve answers a call to it as an unknown tool")
        return ToolFloor(NO_FLOOR, tuple(notes), served=False)
    dispatcher = Floors(None).current(tool.route)
    pinned, note = await _pinned(config, tool)
    if note is not None:
        notes.append(note)
    return ToolFloor(joined(pinned, dispatcher), tuple(notes))


__all__ = ["ToolFloor", "tool_floor_of"]
