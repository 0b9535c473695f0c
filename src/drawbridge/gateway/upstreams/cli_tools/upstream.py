"""A ``cli_tools:`` entry of the configuration, opened: its tools and how each one runs.

Invariant: the subcommand a call runs is fixed by the tool it resolved to. A declared command
``<name>.<command>`` runs exactly ``bin <command>``: its ``inputSchema`` has no ``command`` and allows
no other property, so a call that names one is refused before anything runs (mesh7 took the
subcommand from that argument: ``terraform.init`` with ``command: destroy`` ran destroy). Only
``<name>.__dispatch`` takes the subcommand from its ``command`` argument, and it exists only for an
entry that is neither ``strict`` nor ``bare``; its calls are held at the dispatcher floor
(``catalogue.floors``: the entry's ``default_action``, never below ``human_approval``), which the
route carries (``LocalTool.dispatcher``). ``<name>.run`` runs a ``bare`` binary with no subcommand.
A dispatched subcommand that is also declared runs under that command's ``allowed_args`` and
``timeout``. Arguments that cannot run (the input schema, ``argv``: a subcommand that is an option,
a shell metacharacter, a flag not allowed) are refused before the call is decided
(``LocalTool.refusal``: recorded as a refusal, no person asked), and again, the same way, when the
call runs. A command or ``run`` without ``allowed_args`` takes any flag (``git show --output=FILE``
writes a file), so it is marked ``LocalTool.free_arguments`` and classified generic: the draft policy
never allows it unasked, and approval memory never answers for it.

What each tool says about itself (its description) names the program, the subcommand, the allowed
flags, the timeout, the working directory and the names of the entry's environment variables (never
their values), so that a changed entry is a changed tool, and a changed pin.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from drawbridge.config import CliCommandConfig, CliToolConfig
from drawbridge.gateway.upstreams.cli_tools.argv import ArgvRefused, Invocation, build_invocation

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator  # imported where a schema is compiled: only serve with cli_tools needs it
from drawbridge.gateway.upstreams.cli_tools.runner import call_result, child_environment, run
from drawbridge.gateway.upstreams.local import LocalTool, LocalUpstream, NotSent, StartError
from drawbridge.policy.model import Action
from drawbridge.policy.schemas import pointer_of

DISPATCH: Final = "__dispatch"
BARE: Final = "run"

_ARGS: Final = {"type": "array", "items": {"type": "string"}, "description": "Arguments, in order (no shell)."}
_FLAGS: Final = {
    "type": "object",
    "additionalProperties": {"type": ["string", "number", "boolean", "null"]},
    "description": "Flags: {\"n\": 5} is -n 5, {\"oneline\": true} is --oneline.",
}
_STDIN: Final = {"type": "string", "description": "Text piped to the program's standard input."}


def _schema(dispatcher: bool) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    if dispatcher:
        properties["command"] = {"type": "string", "description": "The subcommand to run."}
    properties.update({"args": _ARGS, "flags": _FLAGS, "stdin": _STDIN})
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if dispatcher:
        schema["required"] = ["command"]
    return schema


@dataclass(frozen=True)
class _Runnable:
    """How one tool runs."""

    subcommand: str | None
    rule: CliCommandConfig | None
    """None for the dispatcher: the dispatched subcommand's rule applies, or the defaults."""
    validator: Draft202012Validator


def _facts(entry: CliToolConfig, rule: CliCommandConfig) -> str:
    parts = []
    if rule.allowed_args is not None:
        parts.append("Flags allowed: " + (", ".join(rule.allowed_args) if rule.allowed_args else "none") + ".")
    parts.append(f"Times out after {rule.timeout_seconds:g} s.")
    if entry.working_dir:
        parts.append(f"Working directory: {entry.working_dir}.")
    if entry.env:
        parts.append("Environment: " + ", ".join(sorted(entry.env)) + ".")
    return " ".join(parts)


def resolve_binary(entry: CliToolConfig, environ: Mapping[str, str]) -> str:
    """The program's absolute path: a path as given, else looked up on the gateway's ``PATH``."""
    if os.sep in entry.bin:
        found = entry.bin if os.access(entry.bin, os.X_OK) and os.path.isfile(entry.bin) else None
    else:
        found = shutil.which(entry.bin, path=environ.get("PATH") or os.defpath)
    if found is None:
        raise StartError(f"cli tool {entry.name!r}: {entry.bin!r} is not an executable program (on PATH)")
    return os.path.abspath(found)


def open_cli(entry: CliToolConfig, environ: Mapping[str, str], default_timeout: float) -> LocalUpstream:
    """The upstream of one ``cli_tools:`` entry (module docstring); raises ``StartError``."""
    binary = resolve_binary(entry, environ)
    if entry.working_dir is not None and not os.path.isdir(entry.working_dir):
        raise StartError(f"cli tool {entry.name!r}: working_dir {entry.working_dir} is not a directory")
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import best_match

    env = child_environment(environ, entry.env)
    default_rule = CliCommandConfig(timeout_seconds=default_timeout)
    tools: list[LocalTool] = []
    runnables: dict[str, _Runnable] = {}

    def add(name: str, description: str, runnable: _Runnable, schema: dict[str, Any], **facts: Any) -> None:
        tools.append(LocalTool(
            {"name": name, "description": description, "inputSchema": schema},
            refusal=lambda arguments: _refusal(prepare(name, arguments)), **facts,
        ))
        runnables[name] = runnable

    def prepare(name: str, arguments: Mapping[str, Any]) -> tuple[Invocation, CliCommandConfig] | str:
        """What a call runs and under which rule, or why it cannot run (module docstring)."""
        runnable = runnables[name]
        error = best_match(runnable.validator.iter_errors(arguments))
        if error is not None:  # named by place and keyword, never by a value: the reason is recorded
            where = pointer_of(error.absolute_path) or "the top level"
            return (
                f"the arguments do not match the tool's input schema ({error.validator!r} fails at {where})"
            )
        subcommand, rule = runnable.subcommand, runnable.rule
        if rule is None:  # the dispatcher
            subcommand = str(arguments["command"])
            rule = entry.commands.get(subcommand, default_rule)
        try:
            return build_invocation(binary, subcommand, arguments, rule.allowed_args), rule
        except ArgvRefused as exc:
            return f"refused before running: {exc}"

    for command, rule in entry.commands.items():
        schema = _schema(False)
        description = f"Runs `{binary} {command}` with the given args and flags (no shell). {_facts(entry, rule)}"
        add(command, description, _Runnable(command, rule, Draft202012Validator(schema)), schema,
            free_arguments=rule.allowed_args is None)
    if entry.bare is not None:
        schema = _schema(False)
        description = f"Runs `{binary}` with the given args and flags (no shell). {_facts(entry, entry.bare)}"
        add(BARE, description, _Runnable(None, entry.bare, Draft202012Validator(schema)), schema,
            free_arguments=entry.bare.allowed_args is None)
    if entry.dispatcher:
        schema = _schema(True)
        floor = Action(entry.default_action)
        declared = ", ".join(entry.commands) if entry.commands else "none"
        description = (
            f"Runs `{binary} <command>` for any subcommand given in `command` (no shell): a dispatcher, whose "
            f"calls are held at least at {floor.value} whatever the policy says. Declared subcommands "
            f"({declared}) keep their own rules. {_facts(entry, default_rule)}"
        )
        add(DISPATCH, description, _Runnable(None, None, Draft202012Validator(schema)), schema,
            dispatcher=True, dispatcher_default_action=floor)

    async def invoke(name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        prepared = prepare(name, arguments)
        if isinstance(prepared, str):
            return _refused(prepared)
        invocation, rule = prepared
        try:
            result = await run(
                invocation.argv, env=env, cwd=entry.working_dir, stdin=invocation.stdin,
                timeout=rule.timeout_seconds, max_output_bytes=entry.max_output_bytes,
            )
        except OSError as exc:
            raise NotSent(f"{entry.bin} could not be started ({exc.strerror or type(exc).__name__})") from None
        return call_result(result, rule.timeout_seconds, entry.max_output_bytes)

    kind = "dispatcher" if entry.dispatcher else ("bare" if entry.bare is not None else "strict")
    return LocalUpstream(
        entry.name, "cli", tools, invoke, detail=f"CLI {binary} ({len(tools)} tool(s), {kind})"
    )


def _refusal(prepared: tuple[Invocation, CliCommandConfig] | str) -> str | None:
    return prepared if isinstance(prepared, str) else None


def _refused(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": True}


__all__ = ["BARE", "DISPATCH", "open_cli", "resolve_binary"]
