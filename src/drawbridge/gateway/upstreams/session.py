"""One long-lived MCP client session to one upstream server, shared by every agent's calls.

Invariant: at any moment an upstream has at most one live connection, and every request the gateway
sent on it ends exactly once: with the upstream's own answer (an error in its place when that answer
had to be dropped: ``exchange.py``), or with ``UpstreamLost`` when that connection ended first. A
request never silently moves to the next connection, and no request is sent while the upstream is not
``ready`` (``UpstreamUnavailable`` says why and when the next attempt is).

Theory of operation. ``run`` is a supervisor loop: connect (spawn the stdio child through
``UpstreamProcess``, or open an HTTP client), run the initialize handshake at 2025-11-25 under the
gateway's own name, send ``notifications/initialized``, load the tool catalogue (``tools/list`` with
cursor pagination), become ``ready``, and wait until the link ends. Then every pending request fails
with ``UpstreamLost`` and the loop waits ``backoff_delay(attempt)`` (1 s doubling to 30 s, with "equal
jitter" from an injected random source) before the next attempt; the attempt counter resets once a
connection has reached ``ready``. ``notifications/tools/list_changed`` reloads the catalogue; reloads
are coalesced, so a burst of notifications costs one reload after the one in progress. An upstream
configured for 2026-07-28 gets ``server/discover`` instead of the handshake, the gateway's envelope on
everything sent to it, and one ``subscriptions/listen`` stream for its changes and the resources
watched (``listen_stream.py``; ``watch_resources`` replaces the stream when that set changes).

The session speaks raw JSON-RPC dicts through its ``exchange.Exchange``, which keeps the id space
(integers counting up for the session's whole life, across reconnects, so a late answer from a dead
connection can never match a new request) and the requests in flight (``requests.PendingCall``).
Messages from the upstream are dispatched by kind: responses complete their waiter, ``ping`` is
answered by the exchange, other server requests (sampling, elicitation) and notifications go to the
``UpstreamListener`` (the router), which knows which agent they are for. On streamable HTTP
(``http_link.py``), a message that arrived on the SSE stream of one of our POSTs carries that
request's id as ``related``; on stdio (``stdio_link.py``) nothing links a server message to a
request, and ``related`` is None. Header values come from the environment variables named in
``headers_env`` and are never logged; URLs are logged without credentials or query.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any, Final, Protocol

import anyio
from anyio.abc import TaskStatus

import drawbridge
from drawbridge.config import UpstreamConfig
from drawbridge.gateway.protocol.eras import (
    HANDSHAKE_PROTOCOL_VERSIONS,
    LATEST_HANDSHAKE_VERSION,
    MODERN_VERSION,
)
from drawbridge.gateway.protocol.jsonrpc import DEFAULT_MAX_UPSTREAM_MESSAGE_BYTES, METHOD_NOT_FOUND
from drawbridge.gateway.protocol.methods import (
    CANCELLED,
    DISCOVER,
    INITIALIZE,
    INITIALIZED,
    TOOLS_LIST,
    TOOLS_LIST_CHANGED,
)
from drawbridge.gateway.protocol.modern import envelope, read_discover
from drawbridge.gateway.protocol.paging import ListingFailed, error_summary, list_all
from drawbridge.gateway.upstreams.child_process import UpstreamProcess
from drawbridge.gateway.upstreams.child_spawn import EnvFilter, EnvPolicy, UpstreamStartError
from drawbridge.gateway.upstreams.exchange import Exchange, Link, error_answer
from drawbridge.gateway.upstreams.http_link import HttpLink, safe_url
from drawbridge.gateway.upstreams.listen_stream import ListenStream
from drawbridge.gateway.upstreams.requests import (
    PendingCall,
    UpstreamLost,
    UpstreamUnavailable,
)
from drawbridge.gateway.upstreams.stdio_link import StdioLink

logger = logging.getLogger("drawbridge.gateway.upstream")

INITIAL_BACKOFF_SECONDS: Final = 1.0
MAX_BACKOFF_SECONDS: Final = 30.0
HANDSHAKE_TIMEOUT_SECONDS: Final = 30.0
LIST_TIMEOUT_SECONDS: Final = 30.0
CLIENT_CAPABILITIES: Final[Mapping[str, Any]] = {"elicitation": {"form": {}, "url": {}}, "sampling": {}}
"""What the gateway declares to upstreams. Sampling and elicitation are relayed to the agent whose call
caused them; roots are not declared, because one shared session cannot speak for several agents' roots."""


def backoff_delay(attempt: int, rand: Callable[[], float]) -> float:
    """Seconds to wait before reconnect attempt ``attempt`` (0-based): 1, 2, 4, ... capped at 30, each
    scaled into [50 %, 100 %] by ``rand()`` (in [0, 1)) so that many gateways do not retry in step."""
    base = min(MAX_BACKOFF_SECONDS, INITIAL_BACKOFF_SECONDS * (2.0 ** min(max(attempt, 0), 16)))
    return base * (0.5 + 0.5 * min(max(rand(), 0.0), 1.0))


class State(StrEnum):
    CONNECTING = "connecting"
    READY = "ready"
    RECONNECTING = "reconnecting"
    FAILED = "failed"  # the first start failed for a reason retrying cannot fix (command not found)
    CLOSED = "closed"


class _ConnectFailed(Exception):
    pass


class UpstreamListener(Protocol):
    """What the session hands to the router."""

    async def upstream_notification(self, upstream: UpstreamSession, message: dict[str, Any], related: int | None) -> None: ...

    async def upstream_request(
        self, upstream: UpstreamSession, message: dict[str, Any], related: int | None
    ) -> dict[str, Any]:
        """Answer a server request: return ``{"result": ...}`` or ``{"error": ...}`` (no id, no jsonrpc)."""
        ...

    async def upstream_catalogue(self, upstream: UpstreamSession, changed: bool) -> None: ...

    async def upstream_state(self, upstream: UpstreamSession) -> None: ...

    async def upstream_dropped(self, upstream: UpstreamSession, kind: str, detail: str, log: bool) -> None:
        """A line from the upstream was dropped (``exchange.Exchange.deliver``): record it as an incident
        of ``kind``, and log it when ``log`` (the exchange keeps a flood out of the log)."""
        ...



# ----------------------------------------------------------------------------------------- session


class UpstreamSession:
    def __init__(
        self,
        config: UpstreamConfig,
        *,
        max_message_bytes: int = DEFAULT_MAX_UPSTREAM_MESSAGE_BYTES,
        env_filter: EnvFilter | None = None,
        environ: Mapping[str, str] | None = None,
        rand: Callable[[], float] = random.random,
        request_timeout: float = LIST_TIMEOUT_SECONDS,
    ) -> None:
        self.config = config
        self.name = config.name
        self.listener: UpstreamListener | None = None
        self._max = max_message_bytes
        self._env_filter = env_filter or EnvPolicy(extra=dict(config.env))
        self._environ = environ
        self._rand = rand
        self._request_timeout = request_timeout

        self.state = State.CONNECTING
        self.last_error: str | None = None
        self.start_error: str | None = None
        self.next_attempt_in: float | None = None
        self.capabilities: dict[str, Any] = {}
        self.server_info: dict[str, Any] | None = None
        self.instructions: str | None = None
        self.protocol_version: str | None = None
        self.modern = config.protocol == MODERN_VERSION
        """The upstream is spoken to in the 2026-07-28 era (``listen_stream.py``)."""
        self.tools: tuple[Any, ...] = ()
        self.catalogue_version = 0
        self._exchange = Exchange(
            self.name,
            unavailable=self.unavailable_reason,
            hop=envelope(CLIENT_CAPABILITIES) if self.modern else None,
            notified=self._on_notification,
            answer=self._answer,
            dropped=self._on_dropped,
        )
        self._listen = ListenStream(self.name, self._exchange.start, self.cancel, lambda: self.state is State.READY)

        self._refresh_wanted = False
        self._refreshing = False
        self._closing = False
        self._run_scope: anyio.CancelScope | None = None
        self._settled = anyio.Event()

    # ------------------------------------------------------------------------------- public

    @property
    def ready(self) -> bool:
        return self.state is State.READY

    @property
    def generation(self) -> int:
        """Which connection this is: 1 for the first, counting up with every reconnect (0 before any)."""
        return self._exchange.generation

    @property
    def related_known(self) -> bool:
        """Whether server messages say which request they belong to (streamable HTTP) or not (stdio)."""
        return self.config.transport == "streamable_http"

    def describe(self) -> str:
        where = safe_url(self.config.url) if self.config.url else (self.config.command or "")
        return f"{self.name} ({self.config.transport}: {where})"

    def unavailable_reason(self) -> str:
        if self.state is State.FAILED:
            return f"upstream {self.name!r} could not be started: {self.start_error}"
        if self.state is State.CLOSED:
            return f"upstream {self.name!r} is closed"
        if self.state is State.RECONNECTING:
            when = f"; next attempt in {self.next_attempt_in:.1f} s" if self.next_attempt_in is not None else ""
            why = f" ({self.last_error})" if self.last_error else ""
            return f"upstream {self.name!r} is disconnected{why}{when}"
        if self.last_error:
            return f"upstream {self.name!r} is reconnecting (last attempt: {self.last_error})"
        return f"upstream {self.name!r} is connecting"

    async def wait_settled(self) -> None:
        """Return once the first connection attempt has succeeded or failed."""
        await self._settled.wait()

    async def run(self) -> None:
        """Connect, and reconnect with backoff, until ``close``."""
        attempt = 0
        with anyio.CancelScope() as scope:
            self._run_scope = scope
            while not self._closing:
                self.state = State.CONNECTING
                self.next_attempt_in = None
                try:
                    reason = await self._connect_once()
                    attempt = 0
                except UpstreamStartError as exc:
                    if not self._settled.is_set():
                        self.start_error = str(exc)
                        self.state = State.FAILED
                        # Not logged: whoever started it (serve, discover) reports ``start_error`` once.
                        logger.debug("upstream %r: %s", self.name, exc)
                        self._settled.set()
                        await self._tell_state()
                        return
                    reason = str(exc)
                except _ConnectFailed as exc:
                    reason = str(exc)
                except Exception as exc:  # noqa: BLE001 -- a bug in one connection must not stop the gateway
                    logger.exception("upstream %r: the connection failed unexpectedly", self.name)
                    reason = f"the connection failed unexpectedly ({type(exc).__name__})"
                self._settled.set()
                if self._closing:
                    break
                self.last_error = reason
                delay = backoff_delay(attempt, self._rand)
                attempt += 1
                self.state = State.RECONNECTING
                self.next_attempt_in = delay
                # The hub records and logs the loss once, as an ``upstream_exited`` incident, with this cause.
                logger.info("upstream %r: %s; reconnecting in %.1f s", self.name, reason, delay)
                await self._tell_state()
                await anyio.sleep(delay)
        self.state = State.CLOSED
        self._settled.set()

    async def close(self) -> None:
        self._closing = True
        if self._run_scope is not None:
            self._run_scope.cancel()
        self.state = State.CLOSED
        self._settled.set()

    async def send_request(self, method: str, params: Mapping[str, Any] | None) -> PendingCall:
        """Send a request now; raise ``UpstreamUnavailable`` if the upstream is not ready."""
        if self.state is not State.READY or self._exchange.link is None:
            raise UpstreamUnavailable(self.unavailable_reason())
        return await self._exchange.start(method, params)

    async def request(self, method: str, params: Mapping[str, Any] | None, timeout: float | None = None) -> dict[str, Any]:
        """Send a request and wait for its response message; ``TimeoutError`` after ``timeout`` seconds."""
        call = await self.send_request(method, params)
        return await self._exchange.wait(call, timeout or self._request_timeout)

    async def cancel(self, call: PendingCall, reason: str) -> None:
        """Abandon a request and tell the upstream (``notifications/cancelled``), if it is still connected."""
        await self._exchange.cancel(call, reason)

    async def notify(self, method: str, params: Mapping[str, Any] | None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        await self._exchange.send(message)

    # ---------------------------------------------------------------------------- connecting

    async def _open_link(self) -> Link:
        config = self.config
        if config.transport == "stdio":
            assert config.command is not None
            process = await UpstreamProcess.spawn(
                [config.command, *config.args],
                env_filter=self._env_filter,
                cwd=config.cwd,
                max_message_bytes=self._max,
                environ=self._environ,
                stderr_label=self.name,
            )
            return StdioLink(process)
        assert config.url is not None
        environ = os.environ if self._environ is None else self._environ
        headers: dict[str, str] = {}
        for header, env_name in config.headers_env.items():
            value = environ.get(env_name)
            if not value:
                raise _ConnectFailed(f"header {header}: environment variable {env_name} is not set")
            headers[header] = value
        return HttpLink(config.url, headers, self._max)

    async def _connect_once(self) -> str:
        """One connection: returns the reason it ended after being ready; raises if it never got ready."""
        link = await self._open_link()
        exchange = self._exchange
        exchange.attach(link)
        ended: list[str] = []
        failure: str | None = None
        lost = False
        try:
            async with anyio.create_task_group() as tg:
                exchange.tasks = tg

                async def read(*, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
                    ended.append(await link.run(exchange.deliver, task_status=task_status))
                    tg.cancel_scope.cancel()

                await tg.start(read)
                try:
                    await self._handshake(link)
                    await self._refresh_tools(initial=True)
                except (_ConnectFailed, UpstreamLost, UpstreamUnavailable, TimeoutError) as exc:
                    failure = f"the handshake failed: {exc}"
                    lost = isinstance(exc, UpstreamLost)
                    tg.cancel_scope.cancel()
                else:
                    self.state = State.READY
                    self.last_error = None
                    self._settled.set()
                    logger.info("upstream %s is ready (%d tools)", self.describe(), len(self.tools))
                    await self._tell_state()
                    await anyio.sleep_forever()
        finally:
            exchange.detach()
            with anyio.CancelScope(shield=True):
                await link.aclose()
                reason = ended[0] if ended else "the connection was closed"
                exchange.lose_all(reason)
        if failure is not None:
            # A child that died mid-handshake fails the write and ends the read, in either order: the
            # cause reported is always how it ended (one failure, one cause), not which side saw it first.
            process = getattr(link, "process", None)
            if lost and process is not None and process.returncode is not None:
                failure = f"the connection ended during the handshake ({process.exit_description()})"
            raise _ConnectFailed(failure)
        if self.state is not State.READY:
            raise _ConnectFailed(f"the connection ended during the handshake ({reason})")
        return reason

    async def _handshake(self, link: Link) -> None:
        if self.modern:
            await self._discover(link)
            return
        params = {
            "protocolVersion": LATEST_HANDSHAKE_VERSION,
            "capabilities": dict(CLIENT_CAPABILITIES),
            "clientInfo": {"name": "drawbridge", "version": drawbridge.__version__},
        }
        body = await self._exchange.wait(await self._exchange.start(INITIALIZE, params), HANDSHAKE_TIMEOUT_SECONDS)
        result = body.get("result")
        if not isinstance(result, dict):
            raise _ConnectFailed(f"initialize was refused ({error_summary(body)})")
        version = result.get("protocolVersion")
        if version not in HANDSHAKE_PROTOCOL_VERSIONS:
            raise _ConnectFailed("the upstream answered initialize with a protocol version the gateway does not speak")
        capabilities = result.get("capabilities")
        self.capabilities = dict(capabilities) if isinstance(capabilities, dict) else {}
        info = result.get("serverInfo")
        self.server_info = dict(info) if isinstance(info, dict) else None
        instructions = result.get("instructions")
        self.instructions = instructions if isinstance(instructions, str) else None
        self.protocol_version = version
        link.handshake_done(version)
        await self._exchange.send({"jsonrpc": "2.0", "method": INITIALIZED})
        if isinstance(link, HttpLink):
            link.start_get_stream()

    async def _discover(self, link: Link) -> None:
        """2026-07-28: no handshake; ``server/discover`` says what the upstream offers, and a listen
        stream is opened for its changes (and the resources still watched, after a reconnect)."""
        link.handshake_done(MODERN_VERSION)  # over HTTP every request, discover included, names its version
        body = await self._exchange.wait(await self._exchange.start(DISCOVER, None), HANDSHAKE_TIMEOUT_SECONDS)
        if "result" not in body:
            raise _ConnectFailed(f"server/discover was refused ({error_summary(body)})")
        try:
            self.capabilities, self.server_info, self.instructions = read_discover(body["result"])
        except ValueError as exc:
            raise _ConnectFailed(str(exc)) from None
        self.protocol_version = MODERN_VERSION
        await self._listen.open(self._exchange.tasks)

    async def watch_resources(self, uris: frozenset[str]) -> frozenset[str]:
        """2026-07-28: follow updates of exactly these resources (a new listen stream replaces the
        old one once acknowledged, so no update falls between them); the URIs the upstream honored."""
        if self.state is not State.READY:
            raise UpstreamUnavailable(self.unavailable_reason())
        return await self._listen.replace(uris, self._request_timeout, self._exchange.tasks)

    async def _refresh_tools(self, *, initial: bool = False) -> None:
        if "tools" not in self.capabilities:
            tools: list[Any] = []
        else:
            tools = await self._list_all(TOOLS_LIST, "tools")
        if isinstance(self._exchange.link, HttpLink):
            tools = self._exchange.link.learn_tools(tools)
        changed = tuple(tools) != self.tools
        self.tools = tuple(tools)
        self.catalogue_version += 1
        if not initial or changed or self.generation > 1:
            logger.info("upstream %r lists %d tools", self.name, len(tools))
        if self.listener is not None:
            try:
                await self.listener.upstream_catalogue(self, changed)
            except Exception as exc:  # noqa: BLE001
                logger.error("merging the tools of upstream %r failed (%s)", self.name, type(exc).__name__)

    async def list_all(self, method: str, key: str) -> list[Any]:
        """Every item of a paginated list (``prompts/list``, ``resources/list``, ...)."""
        if self.state is not State.READY:
            raise UpstreamUnavailable(self.unavailable_reason())
        return await self._list_all(method, key)

    async def _list_all(self, method: str, key: str) -> list[Any]:
        async def ask(params: dict[str, Any] | None) -> dict[str, Any]:
            return await self._exchange.wait(await self._exchange.start(method, params), self._request_timeout)

        try:
            return await list_all(ask, method, key)
        except ListingFailed as exc:
            raise _ConnectFailed(str(exc)) from None

    def _schedule_refresh(self) -> None:
        self._refresh_wanted = True
        tasks = self._exchange.tasks
        if not self._refreshing and tasks is not None:
            self._refreshing = True
            tasks.start_soon(self._refresh_loop)

    async def _refresh_loop(self) -> None:
        try:
            while self._refresh_wanted and self.state is State.READY:
                self._refresh_wanted = False
                try:
                    await self._refresh_tools()
                except (_ConnectFailed, UpstreamLost, UpstreamUnavailable, TimeoutError) as exc:
                    logger.warning("upstream %r: reloading the tool list failed (%s); keeping the last one", self.name, exc)
        finally:
            self._refreshing = False

    async def _tell_state(self) -> None:
        if self.listener is not None:
            with anyio.CancelScope(shield=True):
                try:
                    await self.listener.upstream_state(self)
                except Exception as exc:  # noqa: BLE001
                    logger.error("reporting the state of upstream %r failed (%s)", self.name, type(exc).__name__)

    # --------------------------------------------------------------------- what the upstream sends

    async def _on_notification(self, body: dict[str, Any], related: int | None) -> None:
        if self.modern:
            taken = self._listen.take(body)
            if taken is None:
                return
            body = taken
        method = body.get("method")
        params = body.get("params")
        if method == TOOLS_LIST_CHANGED:
            self._schedule_refresh()
            return
        if method == CANCELLED and isinstance(params, dict):
            self._exchange.cancelled(params.get("requestId"))
            return
        if self.listener is not None:
            try:
                await self.listener.upstream_notification(self, body, related)
            except Exception as exc:  # noqa: BLE001 -- one bad notification must not end the connection
                logger.error("relaying a notification from upstream %r failed (%s)", self.name, type(exc).__name__)

    async def _on_dropped(self, kind: str, detail: str, log: bool) -> None:
        if self.listener is None:  # nothing records it (``drawbridge discover``): said in the log only
            if log:
                logger.warning("%s", detail)
            return
        try:
            await self.listener.upstream_dropped(self, kind, detail, log)
        except Exception as exc:  # noqa: BLE001 -- recording the drop must not end the connection
            logger.error("reporting a dropped line of upstream %r failed (%s)", self.name, type(exc).__name__)

    async def _answer(self, body: dict[str, Any], related: int | None) -> dict[str, Any]:
        if self.listener is None:
            return error_answer(METHOD_NOT_FOUND, "method not found")
        return await self.listener.upstream_request(self, body, related)
