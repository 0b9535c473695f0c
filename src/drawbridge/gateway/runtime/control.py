"""The control plane's view of a runtime: the services it reads and changes, the same objects the
calls use (``assembly``), and the catalogue as served now.

Invariant: what ``/tools`` and ``/tools/decisions`` show is the catalogue the pipeline resolves calls
in, with the pin statuses the floors come from: serve's merged catalogue (``server.tool``), wrap's
server's own (its own names). A server whose pins could not be read is never shown with an empty
list of held-back tools: ``GET /tools/pins`` answers 503 naming it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio.to_thread
from starlette.routing import BaseRoute, Mount, Router
from starlette.types import Receive, Scope, Send

from drawbridge.catalogue.classify import Classification
from drawbridge.control import (
    CatalogueItem,
    ControlServices,
    HeldBackTool,
    StorePinService,
    control_app,
    control_routes,
)
from drawbridge.control.auth import AdminAuth
from drawbridge.gateway.pipeline.pins import CataloguePins
from drawbridge.gateway.protocol.jsonrpc import MessageError, parse_one_reading
from drawbridge.gateway.recording.recorder import SURFACE_FILE, TRACE_FILE
from drawbridge.gateway.runtime.assembly import Runtime
from drawbridge.gateway.runtime.operating import metrics_route
from drawbridge.gateway.transports.wrap_catalogue import ChildCatalogue
from drawbridge.policy.model import Action
from drawbridge.state.pins import PinStore, PinStoreUnavailable


@dataclass(frozen=True, slots=True)
class ServedTool:
    """One tool as served: its upstream, the upstream's own name and dict, the name agents call."""

    server: str
    upstream_name: str
    name: str
    tool: dict[str, Any]
    source: str = "mcp"
    openapi_method: str | None = None
    dispatcher: bool = False
    dispatcher_default_action: Action | None = None
    free_arguments: bool = False


def served_by(catalogue: ChildCatalogue) -> tuple[object, Iterable[ServedTool]]:
    """wrap's served tools: the server's own catalogue, with its own names (no namespace)."""
    tools = [
        ServedTool(catalogue.name, item["name"], item["name"], dict(item))
        for item in catalogue.tools
        if isinstance(item, dict) and isinstance(item.get("name"), str)
    ]
    return catalogue.catalogue_version, tools


class CatalogueView:
    """The served tools as ``CatalogueItem``s, classified once per catalogue (a new catalogue object
    is classified again)."""

    def __init__(self, served: Callable[[], tuple[object, Iterable[ServedTool]]], pins: CataloguePins | None) -> None:
        self._served = served
        self._pins = pins
        self._cached_for: object = None
        self._classified: dict[str, Classification] = {}

    def __call__(self) -> list[CatalogueItem]:
        catalogue, tools = self._served()
        if catalogue is not self._cached_for:
            self._cached_for, self._classified = catalogue, {}
        items: list[CatalogueItem] = []
        for served in tools:
            status = held = None
            if self._pins is not None:
                status = self._pins.status(served.server, served.upstream_name)
                held = self._pins.held(served.server)
            known = self._classified.get(served.name)
            if known is None:
                item = CatalogueItem.of(
                    served.server, served.tool, name=served.name, pin_status=status, source=served.source,
                    dispatcher=served.dispatcher, dispatcher_default_action=served.dispatcher_default_action,
                    openapi_method=served.openapi_method, free_arguments=served.free_arguments,
                    pin_reason=held,
                )
                self._classified[served.name] = item.classification
            else:
                item = CatalogueItem(
                    server=served.server, tool=served.tool, name=served.name, classification=known, pin_status=status,
                    dispatcher=served.dispatcher, dispatcher_default_action=served.dispatcher_default_action,
                    source=served.source, pin_reason=held,
                )
            items.append(item)
        return items


class GatewayPinService(StorePinService):
    """``StorePinService`` that will not show an empty list for a server whose pins the gateway could
    not read: ``GET /tools/pins`` answers 503 naming the server and the kind (its tools, or its prompts,
    are all held back)."""

    def __init__(self, store: PinStore, pins: CataloguePins, **options: Any) -> None:
        super().__init__(store, pins.servers, **options)
        self._pins = pins

    async def held_back(self) -> list[HeldBackTool]:
        for server in self.servers():
            state = self._pins.state(server)
            if state is not None and state.unavailable is not None:
                raise PinStoreUnavailable(
                    server, f"the gateway's last check of this server's {self.kind} catalogue failed", kind=self.kind
                )
        return await super().held_back()


def control_services(
    runtime: Runtime,
    catalogue: Callable[[], Sequence[CatalogueItem]],
    *,
    after_accept: Callable[[str], Awaitable[None]] | None = None,
    upstreams: Callable[[], Mapping[str, str | None]] | None = None,
) -> ControlServices:
    """The control plane's services on this runtime's objects; ``upstreams``: each upstream's status
    (None when up, else why not), when the gateway knows it (serve)."""
    if runtime.engine is None or runtime.policy_store is None:
        raise ValueError("the control plane needs a policy (approvals come from human_approval rules)")
    def service(store: Any, pins: Any) -> GatewayPinService:
        """The pin service of one kind: an accept re-checks that kind's catalogue, then tells the agents."""

        async def accepted(server: str) -> None:
            await pins.after_accept(server)
            if after_accept is not None:
                await after_accept(server)

        return GatewayPinService(store, pins, after_accept=accepted, offered=pins.offered, unpinnable=pins.unpinnable)

    pin_service = None
    if runtime.pin_store is not None and runtime.pins is not None:
        pin_service = service(runtime.pin_store, runtime.pins)
    prompt_service = None if runtime.prompt_pins is None else service(runtime.prompt_pins.store, runtime.prompt_pins)
    checkpointer = runtime.checkpointer

    async def checkpoint() -> str | None:
        if checkpointer is None:
            return None
        return await anyio.to_thread.run_sync(checkpointer.checkpoint_now)

    return ControlServices(
        policy_store=runtime.policy_store,
        catalogue=catalogue,
        approvals=runtime.engine,
        trace_append=runtime.guard.append,
        read_json=read_control_body,
        pins=pin_service,
        prompt_pins=prompt_service,
        recent_calls=runtime.recent_calls(),
        checkpoint=checkpoint,
        upstreams=upstreams,
        shadow=runtime.shadow_tally.report if runtime.shadow_tally is not None else None,
    )


def read_control_body(body: bytes) -> Any:
    """A control-plane body read as an agent's message is (``parse_one_reading``): ``ValueError``
    naming the rule broken, never the content."""
    try:
        return parse_one_reading(body)
    except MessageError as exc:
        raise ValueError(exc.message.partition(": ")[2]) from None


def control_url(host: str, port: int) -> str:
    """The control plane's URL as the CLI's ``--url`` takes it."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def announce_console(runtime: Runtime, host: str, port: int) -> None:
    """The control plane listens at ``host:port``: approval links (``approval.ask_by_link``) point at
    its console's approval pages from now on."""
    gate = runtime.pipeline.approvals
    if gate is not None:
        gate.link_pages = f"{control_url(host, port)}/console/approvals/"


def credential_note(runtime: Runtime) -> str:
    """Where the control plane's credential is, for the startup line (a path, never the token)."""
    if runtime.admin_token_file is not None:
        return f"admin token in {runtime.admin_token_file}"
    return "admin token as configured"


def _credential(runtime: Runtime) -> str:
    if runtime.admin_token_sha256 is None:  # Runtime.build makes one whenever a control plane is open
        raise ValueError("the control plane needs a credential: build the runtime with control_open")
    return runtime.admin_token_sha256


def routes(services: ControlServices, runtime: Runtime) -> list[BaseRoute]:
    """The control plane's routes, behind the admin token (configured, or the gateway's token file)."""
    return list(control_routes(services, admin_token_sha256=_credential(runtime)))


class _ConsoleOnFirstRequest:
    """The console's routes, built with the first request under ``/console``: the console (and with it
    jinja2 and its templates) is loaded only once a person opens it, not by every gateway that serves
    a control plane."""

    def __init__(self, build: Callable[[], Mount]) -> None:
        self._build = build
        self._router: Router | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._router is None:
            self._router = Router(routes=self._build().routes)
        await self._router(scope, receive, send)


def app(services: ControlServices, runtime: Runtime) -> Any:
    """The control plane as an app of its own (its own listener, apart from ``/mcp``), with ``/metrics``
    and the web console at ``/console/`` behind the same credential."""
    digest = _credential(runtime)
    plane = control_app(services, admin_token_sha256=digest, open_mounts=("/console",))
    plane.router.routes.append(metrics_route(runtime, AdminAuth(digest)))
    evidence = Path(runtime.settings.evidence_dir) if runtime.settings.evidence_dir is not None else None
    trace, surfaces = (None, None) if evidence is None else (evidence / TRACE_FILE, evidence / SURFACE_FILE)
    truth = Path(runtime.settings.truth_out) if runtime.settings.truth_out is not None else None

    def console() -> Mount:
        from drawbridge.control.console import console_mount

        return console_mount(
            services, admin_token_sha256=digest, trace_path=trace, surface_path=surfaces, truth_path=truth
        )

    plane.router.routes.append(Mount("/console", app=_ConsoleOnFirstRequest(console)))
    return plane


__all__ = [
    "CatalogueView",
    "GatewayPinService",
    "ServedTool",
    "announce_console",
    "app",
    "control_services",
    "control_url",
    "read_control_body",
    "credential_note",
    "routes",
    "served_by",
]
