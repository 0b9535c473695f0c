"""serve's parts around the shared runtime: the upstream sessions, the hub, per-agent tool lists.

Invariant: serve adds transports and upstreams, never a second decision path: the hub hands every
tools/call to the runtime's pipeline, whose floors are the runtime's pins (every upstream is put
under them with ``pin_tools``), and the control plane reads the hub's merged catalogue with the
same pin statuses. With ``pin_prompts`` the hub is ``PinnedPromptsGateway``, which checks each MCP
upstream's prompts against the runtime's prompt pins. OpenAPI services and CLI binaries (``openapi:``, ``cli_tools:``) are opened here
before the hub exists (``open_local_upstreams``: a spec that cannot be read, a binary that cannot be
found is a startup error), put under the same pins, and served by the same hub and pipeline.
Under ``hide_denied_tools`` agents are told (``notifications/tools/list_changed``)
after every change that may change their list: a policy reload, an accepted pin, a catalogue whose
floors changed.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

import anyio

from drawbridge.catalogue.floors import Floor
from drawbridge.catalogue.merged import Catalogue, CatalogueEntry
from drawbridge.config import GatewayConfig
from drawbridge.control import ControlServices
from drawbridge.gateway.runtime.assembly import Runtime
from drawbridge.gateway.runtime.control import CatalogueView, ServedTool, control_services
from drawbridge.gateway.runtime.settings import secret_env_names
from drawbridge.gateway.serve.hub import Gateway, GatewaySettings
from drawbridge.gateway.protocol.methods import PROMPTS_LIST_CHANGED
from drawbridge.gateway.serve.pinned_listing import PinnedListing
from drawbridge.gateway.serve.prompt_pins import PinnedPromptsGateway
from drawbridge.gateway.serve.visible_tools import VisibleTools
from drawbridge.gateway.upstreams.child_spawn import EnvPolicy
from drawbridge.gateway.upstreams.local import LocalUpstream, StartError
from drawbridge.gateway.upstreams.session import UpstreamSession

logger = logging.getLogger("drawbridge.gateway")

POLICY_POLL_SECONDS: Final = 0.25
"""How often the policy generation is checked for ``announce_policy_changes``."""


async def open_local_upstreams(
    config: GatewayConfig, environ: Mapping[str, str] | None = None, *, calls: bool = True
) -> list[LocalUpstream]:
    """The configuration's OpenAPI services and CLI binaries, opened in order; raises ``StartError``
    (after closing what was opened) for the first that cannot be served. ``calls`` False: opened to
    read the catalogue only (``discover``), so an OpenAPI service's header secrets are not read."""
    environ = os.environ if environ is None else environ
    opened: list[LocalUpstream] = []
    try:
        # Each kind (and what it needs: an HTTP client, JSON Schema) is loaded only when configured.
        if config.openapi:
            from drawbridge.gateway.upstreams.openapi.upstream import open_openapi

            for service in config.openapi:
                opened.append(await open_openapi(service, environ, calls=calls))
        if config.cli_tools:
            from drawbridge.gateway.upstreams.cli_tools.upstream import open_cli

            for entry in config.cli_tools:
                opened.append(open_cli(entry, environ, min(30.0, config.call_timeout_seconds)))
    except BaseException:
        for kind in opened:
            await kind.close()
        raise
    for kind in opened:
        for problem in kind.not_served:
            logger.warning("upstream %r: not served: %s", kind.name, problem)
    return opened


def served_tools(catalogue: Catalogue, local: Mapping[str, LocalUpstream] | None = None) -> tuple[object, Iterable[ServedTool]]:
    def tool(entry: CatalogueEntry) -> ServedTool:
        item = dict(entry.item)
        item["name"] = entry.upstream_name  # the upstream's own dict, with its own name
        kind = local.get(entry.server) if local else None
        facts = kind.tool(entry.upstream_name) if kind is not None else None
        if kind is None or facts is None:
            return ServedTool(entry.server, entry.upstream_name, entry.name, item)
        return ServedTool(
            entry.server, entry.upstream_name, entry.name, item, source=kind.source,
            openapi_method=facts.openapi_method, dispatcher=facts.dispatcher,
            dispatcher_default_action=facts.dispatcher_default_action, free_arguments=facts.free_arguments,
        )

    return catalogue, [tool(entry) for entry in catalogue.entries]


def upstream_states(hub: Gateway, upstreams: Iterable[UpstreamSession]) -> dict[str, str | None]:
    """Each upstream by name: None while connected and serving, else why not. The one source of
    ``/readyz``, ``/metrics`` and the console's overview, so they never disagree."""
    states = {upstream.name: None if upstream.ready else upstream.unavailable_reason() for upstream in upstreams}
    states.update((name, None) for name in hub.local)  # opened at startup, or serve did not start
    return states


@dataclass
class ServeParts:
    hub: Gateway
    upstreams: list[UpstreamSession]
    services: ControlServices | None
    """The control plane's services, when a control plane is served."""
    visible: VisibleTools | None = None

    def upstream_up(self) -> dict[str, bool]:
        """Each upstream by name: connected and serving (``/readyz``, ``/metrics``)."""
        return {name: cause is None for name, cause in upstream_states(self.hub, self.upstreams).items()}

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


def build_serve(
    runtime: Runtime, config: GatewayConfig, *, control_open: bool, local: Iterable[LocalUpstream] = ()
) -> ServeParts:
    """The hub and its upstreams on the runtime (and the control plane's services when one is served);
    ``local``: the opened OpenAPI and CLI upstreams (``open_local_upstreams``)."""
    denied = secret_env_names(config)
    upstreams = [
        UpstreamSession(u, env_filter=EnvPolicy(extra=dict(u.env), deny_names=denied)) for u in config.upstreams
    ]
    local = list(local)
    for source in [*upstreams, *local]:
        runtime.guard_catalogue(source)
    pins = runtime.pins
    floors = runtime.pipeline.floors
    hub: Gateway | None = None

    def floor(entry: CatalogueEntry) -> Floor:
        assert hub is not None
        return floors.current(hub.route(entry))

    def revision() -> int:
        return 0 if pins is None else pins.revision

    visible = VisibleTools(runtime.policy_store, floor, revision) if config.hide_denied_tools else None

    async def on_catalogue(upstream: UpstreamSession | LocalUpstream) -> bool:
        assert pins is not None
        return await pins.check(upstream.name)

    prompt_pins = runtime.prompt_pins
    hub_class = Gateway if prompt_pins is None else functools.partial(PinnedPromptsGateway, prompt_pins=prompt_pins)
    hub = hub_class(
        upstreams,
        pipeline=runtime.pipeline,
        settings=GatewaySettings(call_timeout=config.call_timeout_seconds),
        on_catalogue=on_catalogue if pins is not None else None,
        tool_filter=visible,
        listing_view=PinnedListing(pins) if pins is not None else None,
        local=local,
    )

    async def after_accept(server: str) -> None:
        await hub.tools_changed()  # the accepted definitions are listed now
        if prompt_pins is not None:
            await hub.broadcast({"jsonrpc": "2.0", "method": PROMPTS_LIST_CHANGED})

    runtime.pins_changed_elsewhere.append(after_accept)

    services = None
    if control_open:
        served = hub
        catalogue = CatalogueView(lambda: served_tools(served.tools, served.local), pins)
        services = control_services(
            runtime, catalogue, after_accept=after_accept, upstreams=lambda: upstream_states(served, upstreams)
        )
    return ServeParts(hub, upstreams, services, visible)


__all__ = [
    "POLICY_POLL_SECONDS",
    "ServeParts",
    "StartError",
    "build_serve",
    "open_local_upstreams",
    "secret_env_names",
    "served_tools",
    "upstream_states",
]
