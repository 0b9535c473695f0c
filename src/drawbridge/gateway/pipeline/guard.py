"""The recorder behind its guard: one place that knows whether evidence is still being written.

Invariant: a record that fails -- raises, or takes longer than ``RECORD_TIMEOUT_SECONDS`` -- sets
``failed`` for the whole gateway, and from then on the pipeline refuses every tools/call and
withholds the result of every call that ran. That holds for call records, incidents and every
other trace entry (approvals, pins, policy edits) alike, in ``wrap`` and ``serve`` alike, because
they all go through this one guard.

Theory of operation. ``record_now(events)`` hands the events to the recorder's synchronous form
(``record_now``, when it has one: one write per evidence file for all of them) and returns None, or
an awaitable for what is left (an fsync), which the caller awaits before answering. A recorder that
only has its awaitable form is awaited in that awaitable, event by event. ``incident`` logs and
records a ``RelayIncident``; ``admit(call)`` asks, before a call runs, whether its record can be
built (a call whose cannot is refused, and nothing else is); ``append(kind, body)`` writes one trace
entry that is not a call
(``trace_append`` for the approval engine, the pins and the control plane). ``observers`` see
every call record written (the recent-calls ring of the approval view); they never see arguments.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio

from drawbridge.gateway.pipeline.records import (
    RECORD_TIMEOUT_SECONDS,
    CallRecord,
    Recorder,
    RelayEvent,
    RelayIncident,
)
from drawbridge.gateway.pipeline.tool_call import ToolCall

logger = logging.getLogger("drawbridge.gateway")

RecordNow = Callable[[Sequence[RelayEvent]], Awaitable[None] | None]
Observer = Callable[[CallRecord], None]


class EvidenceGuard:
    """The gateway's recorder, guarded (module docstring)."""

    def __init__(self, recorder: Recorder, *, timeout: float = RECORD_TIMEOUT_SECONDS) -> None:
        self.recorder = recorder
        self.failed = False
        self._timeout = timeout
        record_now = getattr(recorder, "record_now", None)
        self._record_now: RecordNow | None = record_now if callable(record_now) else None
        record_event = getattr(recorder, "record_event", None)
        self._record_event = record_event if callable(record_event) else None
        admit = getattr(recorder, "admit", None)
        self._admit: Callable[[ToolCall], str | None] | None = admit if callable(admit) else None
        self.observers: list[Observer] = []
        self.batch_observers: list[Callable[[Sequence[RelayEvent]], None]] = []
        """See each batch of events once it is written (telemetry: ``gateway.recording.telemetry``)."""
        self.write_timer: Callable[[float], None] | None = None
        """Told how long each synchronous write of a batch took, in seconds (``/metrics``)."""

    def _fail(self, what: str, exc: BaseException) -> None:
        self.failed = True
        logger.error("recording %s failed (%s); later tools/call requests are refused", what, type(exc).__name__)

    def admit(self, call: ToolCall) -> str | None:
        """Why the record of this call could not be built (it must then not run), or None. A failure
        here refuses this call only: the sink is not at fault, nothing fails closed."""
        if self._admit is None:
            return None
        try:
            return self._admit(call)
        except Exception as exc:  # noqa: BLE001 -- whatever the builder raised, the call is refused
            return f"building its record failed ({type(exc).__name__})"

    def record_now(self, events: Sequence[RelayEvent]) -> Awaitable[None] | None:
        """Write ``events`` now; None when they are complete, else what is left to await (module docstring)."""
        try:
            if self._record_now is not None:
                if self.write_timer is not None:
                    began = time.perf_counter()
                    rest = self._record_now(events)
                    self.write_timer(time.perf_counter() - began)
                else:
                    rest = self._record_now(events)
            else:
                rest = self._each(events)
        except Exception as exc:  # noqa: BLE001 -- any recorder failure is reported the same way
            self._fail("an event", exc)
            return None
        self._observe(events)
        return None if rest is None else self._bounded(rest)

    async def _each(self, events: Sequence[RelayEvent]) -> None:
        for event in events:
            await self.recorder(event)

    async def _bounded(self, rest: Awaitable[None]) -> None:
        try:
            with anyio.fail_after(self._timeout):
                await rest
        except Exception as exc:  # noqa: BLE001 -- any recorder failure is reported the same way
            self._fail("an event", exc)

    async def record(self, event: RelayEvent) -> None:
        """Write one event and wait until it is complete; shielded, so a cancelled caller still records."""
        with anyio.CancelScope(shield=True):
            rest = self.record_now([event])
            if rest is not None:
                await rest

    async def incident(
        self, kind: str, direction: str, detail: str, code: int | None = None, *, log: bool = True,
        agent: str | None = None,
    ) -> None:
        """Record an incident, and log it at WARNING unless ``log`` is false (its caller reports it)."""
        if log:
            whose = "" if agent is None else f", agent {agent}"
            logger.warning("%s (%s%s): %s", kind, direction, whose, detail)
        await self.record(RelayIncident(kind, direction, detail, code, agent))

    async def append(self, kind: str, body: Mapping[str, Any]) -> Any:
        """One trace entry that is not a call; the entry written, or None when the gateway writes no
        trace (no evidence directory: approvals and pins still work, and nothing is recorded, as for
        calls). A failure is raised, and fails the gateway closed."""
        if self._record_event is None:
            return None
        try:
            with anyio.fail_after(self._timeout):
                return await self._record_event(kind, body)
        except Exception as exc:
            self._fail(f"a {kind} trace entry", exc)
            raise

    def _observe(self, events: Sequence[RelayEvent]) -> None:
        for batch_observer in self.batch_observers:
            try:
                batch_observer(events)
            except Exception as exc:  # noqa: BLE001 -- what observes the records never stops the recording
                logger.error("an observer of the records failed (%s)", type(exc).__name__)
        if not self.observers:
            return
        try:
            for event in events:
                if isinstance(event, CallRecord):
                    for observer in self.observers:
                        observer(event)
        except Exception as exc:  # noqa: BLE001 -- what observes the records never stops the recording
            logger.error("an observer of the call records failed (%s)", type(exc).__name__)


__all__ = ["EvidenceGuard"]
