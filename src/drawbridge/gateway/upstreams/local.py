"""Upstreams the gateway runs itself (an OpenAPI service's operations, a CLI binary's commands): a fixed
catalogue, and a forwarder that carries out a decided call.

Invariant: a local upstream only forwards. It is handed a call the pipeline decided
(``pipeline.call``: floors, policy, approval, evidence) and ends it exactly once, through the
pipeline: ``answered`` with a CallToolResult, or ``lost`` when nothing could be sent; the tool it
runs is the tool the call resolved to (``flight.resolved.route.tool``) with the arguments the
decision read (``flight.call.arguments``), never a name or a subcommand taken from the arguments.
Its catalogue is read once, when ``serve`` starts (a changed spec or entry is seen at the next
start, where pinning compares it with the accepted pins).

Theory of operation. ``LocalUpstream`` is, to the hub, a catalogue source like an MCP session
(``name``, ``tools``, ``catalogue_version``) and a ``Forwarder``: ``send`` starts one task per call
in the upstream's own task group (``run``) and returns at once, so the pipeline's timeout and an
agent's cancellation can end the call while it runs; ``abandon`` cancels that task, which kills what
the call started (a CLI process group) or closes its HTTP request. Each kind supplies ``invoke(tool,
arguments) -> result`` and, per tool, the facts the floors and the classification read
(``LocalTool``: the HTTP method of an operation, whether a CLI tool is a dispatcher and its floor,
whether a CLI command's arguments are free of an ``allowed_args`` list).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import anyio.abc
from anyio.abc import TaskStatus

from drawbridge.gateway.pipeline.call import CallPipeline, Flight
from drawbridge.gateway.pipeline.floors import Route
from drawbridge.policy.model import Action

logger = logging.getLogger("drawbridge.gateway")

LocalSource = Literal["openapi", "cli"]


class StartError(Exception):
    """A local upstream that cannot be served (the message names it and says why): a startup error."""


class NotSent(Exception):
    """The call did not reach what runs it (the message says why): recorded as not forwarded."""


@dataclass(frozen=True, slots=True)
class LocalTool:
    """One tool of a local upstream: its ``tools/list`` item and what the catalogue reads of it."""

    item: Mapping[str, Any]
    """The tool as listed, with the upstream's own name (no namespace)."""
    openapi_method: str | None = None
    dispatcher: bool = False
    dispatcher_default_action: Action | None = None
    free_arguments: bool = False
    """A CLI command without ``allowed_args``: any flag passes, so the classification calls it generic."""
    refusal: Callable[[Mapping[str, Any]], str | None] | None = field(default=None, compare=False)
    """Why the kind would refuse these arguments before running anything (``Route.refusal``): read by
    the pipeline before any decision, so no person is asked to approve a call that cannot run."""

    @property
    def name(self) -> str:
        return str(self.item["name"])


Invoke = Callable[[str, Mapping[str, Any]], Awaitable[dict[str, Any]]]
"""``(tool, arguments) -> CallToolResult``; raises ``NotSent`` when nothing was sent."""


class LocalUpstream:
    """A local upstream (module docstring)."""

    def __init__(
        self,
        name: str,
        source: LocalSource,
        tools: Sequence[LocalTool],
        invoke: Invoke,
        *,
        close: Callable[[], Awaitable[None]] | None = None,
        not_served: Sequence[str] = (),
        detail: str = "",
    ) -> None:
        self.name = name
        self.source: LocalSource = source
        self.local_tools = {tool.name: tool for tool in tools}
        self.tools: list[dict[str, Any]] = [dict(tool.item) for tool in tools]
        self.catalogue_version = 1
        self.generation = 1
        self.not_served = tuple(not_served)
        """What the catalogue leaves out, each with why (shown by ``discover`` and logged by ``serve``)."""
        self.detail = detail
        """One line for people: where the tools come from."""
        self._invoke = invoke
        self._close = close
        self._pipeline: CallPipeline | None = None
        self._tasks: anyio.abc.TaskGroup | None = None

    # ------------------------------------------------------------------------------ catalogue

    def tool(self, name: str) -> LocalTool | None:
        return self.local_tools.get(name)

    def route(self, name: str) -> Route:
        """The route of one of its tools, with the dispatcher facts the floors read (a CLI command with
        free arguments is generic, as ``catalogue.classify`` says: approval memory never answers for it)."""
        tool = self.local_tools.get(name)
        if tool is None:
            return Route(self.name, name)
        if not tool.dispatcher:
            return Route(self.name, name, generic=tool.free_arguments, refusal=tool.refusal)
        return Route(
            self.name, name, dispatcher=True, dispatcher_default_action=tool.dispatcher_default_action,
            refusal=tool.refusal,
        )

    # ------------------------------------------------------------------------------ lifecycle

    def attach(self, pipeline: CallPipeline) -> None:
        self._pipeline = pipeline

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """The calls' task group, until cancelled; then what the kind holds is closed."""
        try:
            async with anyio.create_task_group() as tg:
                self._tasks = tg
                task_status.started()
                await anyio.sleep_forever()
        finally:
            self._tasks = None
            await self.close()

    async def close(self) -> None:
        close, self._close = self._close, None
        if close is not None:
            with anyio.CancelScope(shield=True):
                await close()

    # ------------------------------------------------------------------------------ forwarding

    def send(self, flight: Flight) -> None:
        pipeline = self._pipeline
        assert pipeline is not None, "attach the pipeline first"
        if self._tasks is None:
            pipeline.lost(flight, f"upstream {self.name!r} is not running; the call was not sent", sent=False)
            return None
        self._tasks.start_soon(self._call, flight)
        return None

    def abandon(self, flight: Flight, reason: str, *, timed_out: bool) -> None:
        scope = flight.handle
        if isinstance(scope, anyio.CancelScope):
            scope.cancel()
        return None

    async def _call(self, flight: Flight) -> None:
        pipeline = self._pipeline
        assert pipeline is not None and flight.resolved is not None and flight.call is not None
        if flight.settled:
            return
        with anyio.CancelScope() as scope:
            flight.handle = scope
            tool = flight.resolved.route.tool
            try:
                result = await self._invoke(tool, flight.call.arguments)
            except NotSent as exc:
                pipeline.lost(flight, f"{exc}; the call was not sent", sent=False)
            except Exception as exc:  # noqa: BLE001 -- whatever failed, the call ends with a reason
                logger.error("upstream %r: running %s failed (%s)", self.name, tool, type(exc).__name__)
                pipeline.lost(flight, f"upstream {self.name!r} failed while running the call ({type(exc).__name__})")
            else:
                pipeline.answered(flight, {"jsonrpc": "2.0", "id": flight.request_id, "result": result})
        flight.handle = None
        await pipeline.flush()


__all__ = ["Invoke", "LocalSource", "LocalTool", "LocalUpstream", "NotSent", "StartError"]
