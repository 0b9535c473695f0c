"""wrap's parts around the shared runtime: the server as a child, the relay, the control plane.

Invariant: wrap adds a transport and one upstream, never a second decision path: the relay hands
every tools/call to the runtime's pipeline, which resolves it in the server's own catalogue (listed
by the gateway), raises it to the floors of the runtime's pins (``--pin-tools`` puts that catalogue
under them, in the same state file and with the same statuses as serve, and shows the agent's
``tools/list`` through them as serve does, telling a handshake-era agent when an accept changes
that list; ``--pin-prompts`` puts the server's prompts under the prompt pins, ``wrap_prompts``) and records it through the runtime's guard. The truth
producer's key variables never reach the child (its environment filter, set by the command, denies
them).

SIGINT and SIGTERM stop wrap as the agent closing its end does, but at once (``StdioRelay.stop``):
every call in flight is settled (the gateway stopped), recorded and answered, the server's process
group is stopped, and the command then seals the run (``run_end`` and the final checkpoint). A signal
that comes before the relay runs ends the start-up, with nothing in flight.
"""

from __future__ import annotations

import functools
import logging
import signal
import socket
from collections.abc import Callable

import anyio

from drawbridge.gateway.runtime.assembly import Runtime, StartupProblem
from drawbridge.gateway.transports.process_stdio import process_stdio
from drawbridge.gateway.transports.relay_requests import RelayConfig
from drawbridge.gateway.protocol.methods import PROMPTS_LIST
from drawbridge.gateway.transports.wrap_catalogue import ChildCatalogue
from drawbridge.gateway.transports.wrap_prompts import ChildPrompts
from drawbridge.gateway.transports.wrap_relay import StdioRelay
from drawbridge.gateway.upstreams.child_process import UpstreamProcess
from drawbridge.gateway.upstreams.child_spawn import Upstream, UpstreamStartError

logger = logging.getLogger("drawbridge.gateway")


async def run_wrap(
    runtime: Runtime,
    server: Upstream,
    config: RelayConfig,
    *,
    control: socket.socket | None = None,
    on_control_ready: Callable[[str, int], None] | None = None,
) -> str | None:
    """Serve the agent on this process's stdin and stdout until it closes; returns why the server
    could not be started, if it could not. The command may have started the server already, while
    the runtime was built (``server.started``); else it is started here, once the runtime runs."""
    relays: list[StdioRelay] = []
    try:
        await runtime.prepare()
    except StartupProblem as exc:
        return str(exc)
    async with anyio.create_task_group() as tg:
        tg.start_soon(_stop_on_signal, tg.cancel_scope, relays)
        await tg.start(runtime.run)
        try:
            async with process_stdio() as (client_in, client_out):
                started = server.started
                try:
                    if started is None:
                        upstream = await UpstreamProcess.spawn(
                            server.argv, env_filter=server.env_filter, max_message_bytes=config.max_upstream_message_bytes
                        )
                    elif isinstance(started, str):
                        return started
                    else:
                        upstream = await UpstreamProcess.adopt(started, max_message_bytes=config.max_upstream_message_bytes)
                except UpstreamStartError as exc:
                    return str(exc)
                relay = StdioRelay(upstream, client_in, client_out, pipeline=runtime.pipeline, config=config)
                relays.append(relay)
                catalogue = relay.catalogue
                assert isinstance(catalogue, ChildCatalogue)
                pins = runtime.pins
                after_accept = None
                if pins is not None:
                    runtime.guard_catalogue(catalogue)
                    catalogue.pin(pins)
                    after_accept = functools.partial(_pins_changed, catalogue, relay)
                    runtime.pins_changed_elsewhere.append(after_accept)
                if runtime.prompt_pins is not None:
                    relay.listings[PROMPTS_LIST] = prompts = ChildPrompts(
                        catalogue.name, relay, relay.request_upstream, modern=lambda: relay.session.modern
                    )
                    runtime.prompt_pins.add_source(prompts)
                    prompts.pin(runtime.prompt_pins)
                if control is not None:
                    # The control plane's web stack is loaded only when it is served.
                    from drawbridge.gateway.runtime.control import (
                        CatalogueView,
                        app,
                        control_services,
                        served_by,
                    )
                    from drawbridge.gateway.transports.http_listener import serve_http

                    services = control_services(
                        runtime, CatalogueView(lambda: served_by(catalogue), pins), after_accept=after_accept
                    )
                    tg.start_soon(serve_http, app(services, runtime), control, on_control_ready)
                await relay.run()
        finally:
            tg.cancel_scope.cancel()
    return None


async def _pins_changed(catalogue: ChildCatalogue, relay: StdioRelay, server: str) -> None:
    """The pins of ``server`` changed and were checked (an accept, on this control plane or another
    replica's; the pin store back from an outage): the agent is told when its list would differ."""
    if server == catalogue.name and catalogue.reshown():
        await relay.tools_changed()


async def _stop_on_signal(scope: anyio.CancelScope, relays: list[StdioRelay]) -> None:
    """On SIGINT or SIGTERM, stop the relay (which settles and records what is in flight), or, before
    there is one, the start-up."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for received in signals:
            name = signal.Signals(received).name
            logger.info("%s received: stopping", name)
            if not relays:
                scope.cancel()
                return
            relays[0].stop(f"the gateway was stopped ({name})")


__all__ = ["run_wrap"]
