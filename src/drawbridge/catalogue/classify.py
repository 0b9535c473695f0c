"""How a tool is classified: family (named, generic), access (read, write, unknown), and why.

Invariant: a classification is built only from what the upstream declares about the tool (its
name, its argument schema read to every depth, its annotations, the HTTP method of an OpenAPI
operation, whether it is a CLI dispatcher or a CLI command without ``allowed_args``), every signal
that fired is listed as a reason, and the family and access are derived from those reasons by one
rule and by nothing else:

- **access**: one write reason makes the tool a write, whatever read reasons say; otherwise one
  read reason makes it a read; with neither it is ``unknown``. A false read opens a hole, a
  false write only costs an approval, so conflicts resolve to the restrictive side.
- **family**: one generic reason makes the tool ``generic`` (its argument carries the effect:
  code, SQL, a shell command, a CLI subcommand, a CLI command's free flags, an argument schema
  that could not be read to the end); otherwise it is ``named``.

A ``Classification`` checks this on construction, so a value of the type cannot carry an access
or a family that its reasons do not justify. The classification is advice for whoever writes
the policy: it never decides a call. Annotations are claims; nothing here is verified.

Theory of operation. The vocabulary (verbs, argument names, HTTP methods) and the signal table
are data at the top of this module. ``classify_tool`` reads each signal in the table's order and
appends a ``Reason`` (a machine code, the word that fired, and a short text such as
``name verb "send"``) for every one that fires; a tool where none fires gets the single reason
``no signal``. Argument names are looked for at every depth of the input schema, through local
``$ref`` and ``allOf``/``anyOf``/``oneOf`` (``catalogue.arguments``). Names are split into whole
words (``list_repos``, ``get-env``, ``listRepos``, ``git.show`` all split), so ``target`` never
contains ``get`` and ``running`` is not ``run``. Reason texts contain only vocabulary words (and
an HTTP method only when it is a plain word), never other text from the upstream, so they are safe
to show and to put in a policy comment.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from drawbridge.catalogue.arguments import read_arguments

# ------------------------------------------------------------------------------- the signal table


class Family(enum.StrEnum):
    """Where the meaning of a call lives: in the tool's name (named) or in an argument (generic)."""

    NAMED = "named"
    GENERIC = "generic"


class Access(enum.StrEnum):
    """What the tool says it does to the world it reaches."""

    READ = "read"
    WRITE = "write"
    UNKNOWN = "unknown"


class Effect(enum.StrEnum):
    """What one reason pushes the classification towards."""

    READ = "read"
    WRITE = "write"
    GENERIC = "generic"
    NONE = "none"


class ReasonCode(enum.StrEnum):
    """Machine codes of the reasons; ``SIGNALS`` says what each one means."""

    CLI_DISPATCHER = "cli_dispatcher"
    CLI_FREE_ARGUMENTS = "cli_free_arguments"
    GENERIC_ARGUMENT = "generic_argument"
    QUERY_ON_EXECUTOR = "query_on_executor"
    SCHEMA_NOT_FOLLOWED = "schema_not_followed"
    HTTP_METHOD_READ = "http_method_read"
    HTTP_METHOD_WRITE = "http_method_write"
    ANNOTATION_READ_ONLY = "annotation_read_only"
    ANNOTATION_NOT_READ_ONLY = "annotation_not_read_only"
    ANNOTATION_DESTRUCTIVE = "annotation_destructive"
    NAME_VERB_READ = "name_verb_read"
    NAME_VERB_WRITE = "name_verb_write"
    NO_SIGNAL = "no_signal"


@dataclass(frozen=True, slots=True)
class Signal:
    """One row of the signal table."""

    code: ReasonCode
    effect: Effect
    when: str


SIGNALS: Final[tuple[Signal, ...]] = (
    Signal(ReasonCode.CLI_DISPATCHER, Effect.GENERIC,
           "a CLI dynamic dispatcher (`<cli>.__dispatch`): the subcommand is an argument"),
    Signal(ReasonCode.CLI_FREE_ARGUMENTS, Effect.GENERIC,
           "a CLI command without `allowed_args`: any flag may be passed (`git show --output=FILE`)"),
    Signal(ReasonCode.GENERIC_ARGUMENT, Effect.GENERIC,
           "an argument, at any depth of the schema, that may be a string and is named one of"
           " GENERIC_ARGUMENTS"),
    Signal(ReasonCode.QUERY_ON_EXECUTOR, Effect.GENERIC,
           "an argument named `query`, at any depth, on a tool whose name has a word of EXECUTOR_WORDS"),
    Signal(ReasonCode.SCHEMA_NOT_FOLLOWED, Effect.GENERIC,
           "an argument schema that cannot be read to the end (a `$ref` that is not local or does not"
           " resolve, a dynamic reference, nesting deeper than arguments.MAX_SCHEMA_DEPTH)"),
    Signal(ReasonCode.HTTP_METHOD_READ, Effect.READ, "an OpenAPI operation whose method is in READ_METHODS"),
    Signal(ReasonCode.HTTP_METHOD_WRITE, Effect.WRITE, "an OpenAPI operation with any other method"),
    Signal(ReasonCode.ANNOTATION_READ_ONLY, Effect.READ, "MCP annotation `readOnlyHint: true`"),
    Signal(ReasonCode.ANNOTATION_NOT_READ_ONLY, Effect.WRITE, "MCP annotation `readOnlyHint: false`"),
    Signal(ReasonCode.ANNOTATION_DESTRUCTIVE, Effect.WRITE, "MCP annotation `destructiveHint: true`"),
    Signal(ReasonCode.NAME_VERB_READ, Effect.READ, "a whole word of the tool name is in READ_VERBS"),
    Signal(ReasonCode.NAME_VERB_WRITE, Effect.WRITE, "a whole word of the tool name is in WRITE_VERBS"),
    Signal(ReasonCode.NO_SIGNAL, Effect.NONE, "none of the above fired"),
)
EFFECT_OF: Final[Mapping[ReasonCode, Effect]] = {signal.code: signal.effect for signal in SIGNALS}

READ_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})

READ_VERBS: Final = frozenset({
    "get", "list", "search", "read", "show", "find", "describe", "view", "lookup",
    "inspect", "browse", "retrieve", "count", "preview", "explain",
})
"""Verbs that say a tool only looks. ``query`` is left out on purpose: query languages write too.
``fetch`` is a write verb: fetching stores what it brought (``git fetch`` writes refs)."""

WRITE_VERBS: Final = frozenset({
    "create", "send", "delete", "write", "execute", "exec", "run", "eval", "evaluate", "invoke",
    "update", "upsert", "remove", "add", "set", "put", "post", "patch", "edit", "modify", "insert",
    "upload", "import", "fetch", "move", "rename", "copy", "push", "merge", "fork", "reset", "checkout",
    "revert", "rollback", "restore", "deploy", "install", "uninstall", "apply", "publish", "submit",
    "approve", "reject", "dismiss", "resolve", "cancel", "close", "kill", "stop", "start", "restart",
    "rerun", "retry", "launch", "spawn", "shutdown", "reboot", "scale", "resize", "toggle", "trigger",
    "enable", "disable", "archive", "unarchive", "assign", "unassign", "invite", "kick", "ban",
    "unban", "mute", "unmute", "follow", "unfollow", "subscribe", "unsubscribe", "register",
    "grant", "revoke", "authorize", "rotate", "unlock", "drop", "truncate", "destroy", "clear",
    "purge", "wipe", "erase", "overwrite", "replace", "append", "save", "make", "change", "mark",
    "transfer", "pay", "purchase", "buy", "sell", "refund", "reply", "click", "fill", "press",
    "login", "logout",
})
"""Verbs that say a tool changes something. Words that are more often nouns in read tools' names
(``commit``, ``comment``, ``order``, ``tag``, ``lock``, ``store``, ``call``, ``schedule``) are left
out: each would turn reads such as ``get_commit`` into writes. A tool that really writes under
such a name usually says so through another signal (an annotation, another verb)."""

GENERIC_ARGUMENTS: Final = frozenset({
    "code", "script", "sql", "command", "cmd", "statement", "program", "expression",
})
"""Argument names (compared case-insensitively, whole name only: ``zip_code`` is not ``code``)."""

QUERY_ARGUMENT: Final = "query"
EXECUTOR_WORDS: Final = frozenset({"execute", "exec", "run", "sql"})
DISPATCHER_WORD: Final = "__dispatch"

Source = Literal["mcp", "openapi", "cli"]
SOURCES: Final = ("mcp", "openapi", "cli")

_PLAIN_METHOD = re.compile(r"[A-Za-z]{1,16}")

# ------------------------------------------------------------------------------------- the values


@dataclass(frozen=True, slots=True)
class Reason:
    """One signal that fired: ``code`` for machines, ``text`` for people, ``subject`` the word."""

    code: ReasonCode
    text: str
    subject: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.code, ReasonCode):
            raise ValueError(f"unknown reason code {self.code!r}")

    @property
    def effect(self) -> Effect:
        return EFFECT_OF[self.code]

    def as_dict(self) -> dict[str, Any]:
        return {
            "code": self.code.value,
            "effect": self.effect.value,
            "subject": self.subject,
            "text": self.text,
        }


def access_from(reasons: Iterable[Reason]) -> Access:
    """The restrictive rule: any write wins, then any read, else unknown."""
    effects = {reason.effect for reason in reasons}
    if Effect.WRITE in effects:
        return Access.WRITE
    if Effect.READ in effects:
        return Access.READ
    return Access.UNKNOWN


def family_from(reasons: Iterable[Reason]) -> Family:
    return Family.GENERIC if any(reason.effect is Effect.GENERIC for reason in reasons) else Family.NAMED


@dataclass(frozen=True, slots=True)
class Classification:
    """A tool's family, access and the reasons for both (never empty; at least ``no signal``)."""

    family: Family
    access: Access
    reasons: tuple[Reason, ...]

    def __post_init__(self) -> None:
        if not self.reasons:
            raise ValueError("a classification lists at least one reason")
        if not all(isinstance(reason, Reason) for reason in self.reasons):
            raise ValueError("reasons must be Reason values")
        no_signal = [r for r in self.reasons if r.code is ReasonCode.NO_SIGNAL]
        if no_signal and len(self.reasons) > 1:
            raise ValueError("`no signal` cannot stand beside a signal")
        if self.access is not access_from(self.reasons):
            raise ValueError(f"access {self.access} does not follow from the reasons")
        if self.family is not family_from(self.reasons):
            raise ValueError(f"family {self.family} does not follow from the reasons")

    @classmethod
    def from_reasons(cls, reasons: Iterable[Reason]) -> Classification:
        listed = tuple(reasons) or (NO_SIGNAL_REASON,)
        return cls(family_from(listed), access_from(listed), listed)

    @property
    def is_named_read(self) -> bool:
        """The one case a draft policy allows: the name states the effect, and it only reads."""
        return self.family is Family.NAMED and self.access is Access.READ

    @property
    def codes(self) -> tuple[ReasonCode, ...]:
        return tuple(reason.code for reason in self.reasons)

    @property
    def reason_texts(self) -> tuple[str, ...]:
        return tuple(reason.text for reason in self.reasons)

    def summary(self) -> str:
        """One line for tables and policy comments: ``[named, write] name verb "send"; ...``."""
        return f"[{self.family}, {self.access}] " + "; ".join(self.reason_texts)

    def as_dict(self) -> dict[str, Any]:
        """The shape ``GET /tools`` serves: ``{"family", "access", "reasons": [text, ...]}``."""
        return {"family": self.family.value, "access": self.access.value, "reasons": list(self.reason_texts)}



NO_SIGNAL_REASON: Final = Reason(ReasonCode.NO_SIGNAL, "no signal")

# ---------------------------------------------------------------------------------- the reading

_CAMEL_LOWER_UPPER = re.compile(r"([a-z0-9])([A-Z])")
_CAMEL_ACRONYM = re.compile(r"([A-Z]+)([A-Z][a-z])")
_NON_WORD = re.compile(r"[^A-Za-z0-9]+")


def name_words(name: str) -> tuple[str, ...]:
    """The whole words of a tool name, lowercased: separators and camelCase both split."""
    spaced = _CAMEL_ACRONYM.sub(r"\1 \2", _CAMEL_LOWER_UPPER.sub(r"\1 \2", name))
    return tuple(word.lower() for word in _NON_WORD.split(spaced) if word)


def is_dispatcher_name(name: str) -> bool:
    """``terraform.__dispatch`` (or a bare ``__dispatch``): the mesh7 spelling of a CLI dispatcher."""
    return name.rsplit(".", 1)[-1] == DISPATCHER_WORD


def _generic_reasons(
    tool: Mapping[str, Any], words: tuple[str, ...], dispatcher: bool, free_arguments: bool
) -> list[Reason]:
    reasons: list[Reason] = []
    if dispatcher:
        reasons.append(Reason(ReasonCode.CLI_DISPATCHER, "CLI dispatcher"))
    if free_arguments:
        reasons.append(Reason(ReasonCode.CLI_FREE_ARGUMENTS, "CLI command without allowed_args"))
    arguments = read_arguments(tool.get("inputSchema"))
    for argument in sorted(GENERIC_ARGUMENTS):
        schemas = arguments.by_name.get(argument, [])
        if any(arguments.may_be_string(schema) for schema in schemas):
            reasons.append(Reason(ReasonCode.GENERIC_ARGUMENT, f'string argument "{argument}"', argument))
    executor = next((word for word in words if word in EXECUTOR_WORDS), None)
    if QUERY_ARGUMENT in arguments.by_name and executor is not None:
        text = f'argument "query" on a tool whose name says "{executor}"'
        reasons.append(Reason(ReasonCode.QUERY_ON_EXECUTOR, text, executor))
    if arguments.not_followed is not None:
        text = f"argument schema not followed: {arguments.not_followed}"
        reasons.append(Reason(ReasonCode.SCHEMA_NOT_FOLLOWED, text, arguments.not_followed))
    return reasons


def _method_reasons(method: str) -> list[Reason]:
    """Case-insensitive, ASCII only: ``"optıons".upper()`` is ``"OPTIONS"`` in Python, not in HTTP."""
    text = method.strip()
    upper = text.upper() if text.isascii() else ""
    if upper in READ_METHODS:
        return [Reason(ReasonCode.HTTP_METHOD_READ, f"HTTP method {upper}", upper)]
    shown = upper if _PLAIN_METHOD.fullmatch(upper) else "(not a plain method name)"
    return [Reason(ReasonCode.HTTP_METHOD_WRITE, f"HTTP method {shown}", shown)]


def _annotation_reasons(tool: Mapping[str, Any]) -> list[Reason]:
    """Only JSON booleans count: a hint spelled ``"true"`` is not a claim the specification defines."""
    annotations = tool.get("annotations")
    if not isinstance(annotations, Mapping):
        return []
    reasons: list[Reason] = []
    read_only = annotations.get("readOnlyHint")
    if read_only is True:
        reasons.append(
            Reason(ReasonCode.ANNOTATION_READ_ONLY, "annotation readOnlyHint: true", "readOnlyHint")
        )
    elif read_only is False:
        reasons.append(
            Reason(ReasonCode.ANNOTATION_NOT_READ_ONLY, "annotation readOnlyHint: false", "readOnlyHint")
        )
    if annotations.get("destructiveHint") is True:
        reasons.append(
            Reason(ReasonCode.ANNOTATION_DESTRUCTIVE, "annotation destructiveHint: true", "destructiveHint")
        )
    return reasons


def _verb_reasons(words: tuple[str, ...]) -> list[Reason]:
    reasons: list[Reason] = []
    seen: set[str] = set()
    for word in words:
        if word in seen:
            continue
        seen.add(word)
        if word in WRITE_VERBS:
            reasons.append(Reason(ReasonCode.NAME_VERB_WRITE, f'name verb "{word}"', word))
        elif word in READ_VERBS:
            reasons.append(Reason(ReasonCode.NAME_VERB_READ, f'name verb "{word}"', word))
    return reasons


def classify_tool(
    tool: Mapping[str, Any],
    *,
    source: Source = "mcp",
    openapi_method: str | None = None,
    cli_dispatcher: bool = False,
    cli_free_arguments: bool = False,
) -> Classification:
    """Classify one tool as it appears in a ``tools/list`` result (the upstream's own dict).

    ``source`` says where the tool comes from; ``openapi_method`` is the HTTP method of an
    OpenAPI operation (only with ``source="openapi"``); ``cli_dispatcher`` marks a CLI tool that
    takes its subcommand as an argument, ``cli_free_arguments`` a CLI command without
    ``allowed_args`` (any flag passes, so its arguments carry the effect: ``git show
    --output=FILE`` writes, ``git fetch --upload-pack=CMD`` runs a program). A name whose last
    dotted part is ``__dispatch`` is a dispatcher whatever the flag says. Raises ``ValueError``
    for a tool without a string name or for inconsistent arguments: a caller error must not turn
    into a quiet classification.
    """
    if source not in SOURCES:
        raise ValueError(f"unknown tool source {source!r} (expected one of {', '.join(SOURCES)})")
    if openapi_method is not None and (source != "openapi" or not isinstance(openapi_method, str)):
        raise ValueError("openapi_method is a string, given only for source='openapi'")
    if (cli_dispatcher or cli_free_arguments) and source != "cli":
        raise ValueError("cli_dispatcher and cli_free_arguments are given only for source='cli'")
    if not isinstance(tool, Mapping):
        raise ValueError("a tool is a JSON object")
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("a tool needs a non-empty string name")
    words = name_words(name)
    reasons = _generic_reasons(tool, words, cli_dispatcher or is_dispatcher_name(name), cli_free_arguments)
    if openapi_method is not None:
        reasons += _method_reasons(openapi_method)
    reasons += _annotation_reasons(tool)
    reasons += _verb_reasons(words)
    return Classification.from_reasons(reasons)
