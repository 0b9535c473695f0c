"""serve's parts around the shared runtime: the upstream sessions, the hub, per-agent tool lists.

Invariant: serve adds transports and upstreams, never a second decision path: the hub hands every
tools/call to the runtime's pipeline, whose floors are the runtime's pins (every upstream is put
under them with ``pin_tools``), and the control plane reads the hub's merged catalogue with the
same pin statuses. Under ``hide_denied_tools`` agents are told (``notifications/tools/list_changed``)
after every change that may change their list: a policy reload, an accepted pin, a catalogue whose
floors changed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

import anyio

from drawbridge.catalogue.floors import Floor
from drawbridge.catalogue.merged import Catalogue, CatalogueEntry
from drawbridge.config import GatewayConfig
from drawbridge.control import ControlServices
from drawbridge.gateway.pipeline.floors import Route
from drawbridge.gateway.recording.truth_key import ALL_NAMES as TRUTH_KEY_NAMES
from drawbridge.gateway.runtime.assembly import Runtime
from drawbridge.gateway.runtime.control import CatalogueView, ServedTool, control_services
from drawbridge.gateway.serve.hub import Gateway, GatewaySettings
from drawbridge.gateway.serve.visible_tools import VisibleTools
from drawbridge.gateway.upstreams.child_process import EnvPolicy
from drawbridge.gateway.upstreams.session import UpstreamSession

POLICY_POLL_SECONDS: Final = 0.25
"""How often the policy generation is checked for ``announce_policy_changes``."""


def secret_env_names(config: GatewayConfig) -> frozenset[str]:
    """Environment variables that hold the gateway's own credentials: never passed to stdio children
    (``DRAWBRIDGE_*`` never is either, see ``EnvPolicy``)."""
    names = {name for upstream in config.upstreams for name in upstream.headers_env.values()}
    names |= set(config.telemetry_headers_env.values())  # the collector's credentials too
    return frozenset(names | set(TRUTH_KEY_NAMES))


def served_tools(catalogue: Catalogue) -> tuple[object, Iterable[ServedTool]]:
    def tool(entry: CatalogueEntry) -> ServedTool:
        item = dict(entry.item)
        item["name"] = entry.upstream_name  # the upstream's own dict, with its own name
        return ServedTool(entry.server, entry.upstream_name, entry.name, item)

    return catalogue, [tool(entry) for entry in catalogue.entries]


@dataclass
class ServeParts:
    hub: Gateway
    upstreams: list[UpstreamSession]
    services: ControlServices | None
    """The control plane's services, when a control plane is served."""
    visible: VisibleTools | None = None

    async def announce_policy_changes(self, runtime: Runtime, interval: float = POLICY_POLL_SECONDS) -> None:
        """Under ``hide_denied_tools``: after every successful policy reload (a file edited, a control
        plane edit), tell handshake-era agents that their tool list may differ. Runs until cancelled."""
        store = runtime.policy_store
        if self.visible is None or store is None:
            return
        seen = store.generation
        while True:
            await anyio.sleep(interval)
            generation = store.generation
            if generation != seen:
                seen = generation
                await self.hub.tools_changed()


def build_serve(runtime: Runtime, config: GatewayConfig, *, control_open: bool) -> ServeParts:
    """The hub and its upstreams on the runtime (and the control plane's services when one is served)."""
    denied = secret_env_names(config)
    upstreams = [
        UpstreamSession(u, env_filter=EnvPolicy(extra=dict(u.env), deny_names=denied)) for u in config.upstreams
    ]
    for upstream in upstreams:
        runtime.guard_catalogue(upstream)
    pins = runtime.pins
    floors = runtime.pipeline.floors

    def floor(entry: CatalogueEntry) -> Floor:
        return floors.current(Route(entry.server, entry.upstream_name))

    def revision() -> int:
        return 0 if pins is None else pins.revision

    visible = VisibleTools(runtime.policy_store, floor, revision) if config.hide_denied_tools else None

    async def on_catalogue(upstream: UpstreamSession) -> bool:
        assert pins is not None
        return await pins.check(upstream.name)

    hub = Gateway(
        upstreams,
        pipeline=runtime.pipeline,
        settings=GatewaySettings(call_timeout=config.call_timeout_seconds),
        on_catalogue=on_catalogue if pins is not None else None,
        tool_filter=visible,
    )

    async def after_accept(server: str) -> None:
        if visible is not None:
            await hub.tools_changed()

    services = None
    if control_open:
        catalogue = CatalogueView(lambda: served_tools(hub.tools), pins)
        services = control_services(runtime, catalogue, after_accept=after_accept)
    return ServeParts(hub, upstreams, services, visible)


__all__ = ["POLICY_POLL_SECONDS", "ServeParts", "build_serve", "secret_env_names", "served_tools"]
