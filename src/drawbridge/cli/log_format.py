"""How the gateway's commands write their log to stderr: ``text`` (one ``drawbridge: LEVEL ...`` line) or
``json`` (one object per line), both carrying the same fields.

Invariant: the operator's activity lines (``drawbridge.activity``: decisions, approvals, refused logins)
are shown at INFO whatever ``--verbose`` says (in serve; wrap shows them with ``--verbose``, since its
stderr is its MCP client's log); the rest of the gateway's log is shown at WARNING, or at
INFO with ``--verbose``. A field value is written so that it cannot start a new line or a new field: in
text, a value with a space, a quote, an ``=`` or a control character is written as a JSON string.

Theory of operation. ``configure_logging`` installs a queue on the ``drawbridge`` logger, drained by a
thread of its own into one stream handler with the chosen formatter (no line is written on the event loop);
the HTTP listeners' own loggers (``uvicorn``: a request that is not HTTP, a connection refused at the cap;
``asyncio``: a socket error) write through the same queue at WARNING, so that every line on stderr is in the
chosen format (uvicorn is started without a logging configuration of its own); ``activity`` fields travel in
the log record's ``activity`` attribute (``drawbridge.gateway.pipeline.activity``) and other records carry
only their message.
"""

from __future__ import annotations

import atexit
import json
import logging
import re
import sys
from logging.handlers import QueueHandler, QueueListener
from queue import Queue
from datetime import UTC, datetime
from typing import Any, Final, TextIO

import click

FORMATS: Final = ("text", "json")
LISTENER_LOGGERS: Final = ("uvicorn", "asyncio")
"""The loggers of the libraries that serve HTTP, written in the project's format (module docstring)."""
_listener: QueueListener | None = None


@atexit.register
def _flush() -> None:
    if _listener is not None:
        _listener.stop()
_PLAIN: Final = re.compile(r"[^\s\"'=\\]+")

log_format_option = click.option(
    "--log-format",
    type=click.Choice(FORMATS),
    default="text",
    show_default=True,
    help="The log on stderr: text lines, or one JSON object per line (for a log shipper).",
)


def _value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    if _PLAIN.fullmatch(text) and text.isprintable():
        return text
    return json.dumps(text, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``drawbridge: INFO decision agent=claude tool=git.git_status ...``."""

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "activity", None)
        if isinstance(fields, dict) and fields.get("event") == "serve":
            return f"drawbridge: {record.getMessage()}"  # the command's own lines read as sentences
        if isinstance(fields, dict) and fields.get("event") == "startup_failed":
            return record.getMessage()  # already says where it comes from (a file, or "drawbridge:")
        if isinstance(fields, dict) and fields.get("event") == "upstream_stderr":
            return f"[{fields.get('upstream')}] {fields.get('line')}"  # the upstream's own words, named
        if isinstance(fields, dict):
            event = fields.get("event", record.getMessage())
            pairs = " ".join(f"{key}={_value(value)}" for key, value in fields.items() if key != "event")
            return f"drawbridge: {record.levelname} {event} {pairs}"
        return f"drawbridge: {record.levelname} {record.getMessage()}"


class JsonFormatter(logging.Formatter):
    """``{"ts": ..., "level": "INFO", "logger": "drawbridge.activity", "event": "decision", ...}``."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
        }
        fields = getattr(record, "activity", None)
        if isinstance(fields, dict):
            line.update(fields)
        else:
            line["message"] = record.getMessage()
        return json.dumps(line, ensure_ascii=False, separators=(",", ":"))


class _Enqueue(QueueHandler):
    """Hands the record over as it is: it is formatted in the writing thread, not on the event loop
    (the gateway's messages are built from immutable values, so nothing changes meanwhile)."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record


def configure_logging(
    verbose: bool, log_format: str = "text", *, level: int | None = None, quiet_activity: bool = False,
    stream: TextIO | None = None,
) -> None:
    """The ``drawbridge`` logger writes to stderr in ``log_format`` (module docstring); ``level`` overrides
    the gateway's level (discover shows errors only). Activity lines stay at INFO, except with
    ``quiet_activity`` (wrap: its stderr is the MCP client's log), where they follow ``verbose``."""
    global _listener
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    if _listener is not None:
        _listener.stop()
    # Lines are written by a thread of their own: a decision's line never blocks the event loop on a
    # slow stderr (a pipe its reader drains late). At exit the thread writes what is queued, then stops.
    queue: Queue[logging.LogRecord] = Queue()
    _listener = QueueListener(queue, handler)
    _listener.start()
    log = logging.getLogger("drawbridge")
    log.handlers[:] = [_Enqueue(queue)]
    log.setLevel(level if level is not None else (logging.INFO if verbose else logging.WARNING))
    log.propagate = False
    for name in LISTENER_LOGGERS:
        listener_log = logging.getLogger(name)
        listener_log.handlers[:] = [_Enqueue(queue)]
        listener_log.setLevel(max(logging.WARNING, log.level))
        listener_log.propagate = False
    activity_level = logging.INFO if verbose or not quiet_activity else logging.WARNING
    logging.getLogger("drawbridge.activity").setLevel(activity_level)


def say(message: str, **fields: Any) -> None:
    """A line of the command's own (the startup summary, the shutdown): through the log, so that it
    follows ``--log-format``."""
    logging.getLogger("drawbridge.activity").info(
        "%s", message, extra={"activity": {"event": "serve", "message": message, **fields}}
    )


def announce(message: str, **fields: Any) -> None:
    """A line of the command's own that is shown whatever the level (where its control plane
    listens: wrap keeps its activity lines for ``--verbose``), written as ``say`` writes its lines."""
    log = logging.getLogger("drawbridge.activity")
    record = log.makeRecord(
        log.name, logging.INFO, __file__, 0, "%s", (message,), None,
        extra={"activity": {"event": "serve", "message": message, **fields}},
    )
    log.handle(record)


def startup_failed(message: str) -> None:
    """The error of a command that cannot start (then exit 2): through the log, so that under
    ``--log-format json`` a log shipper reads it as one object like every other line."""
    logging.getLogger("drawbridge").error(
        "%s", message, extra={"activity": {"event": "startup_failed", "message": message}}
    )


__all__ = [
    "FORMATS", "JsonFormatter", "TextFormatter", "announce", "configure_logging", "log_format_option", "say",
    "startup_failed",
]
