"""``drawbridge wrap``: run an MCP server behind the gateway, over stdio.

An MCP client launches ``drawbridge wrap [options] -- <server command...>`` in place of the server.
The gateway spawns the server as its child, relays every message unchanged, and decides each
``tools/call`` before it reaches the server.

Invariant: with no ``--policy`` and no ``--allow-all``, every tools/call is refused (fail closed);
``--allow-all`` is the only way to forward without a policy, and it must be asked for. A policy is
watched while the gateway runs: a valid edit applies to the next call, an invalid one is reported on
stderr and the previous policy stays.

Exit codes: 0 when the client closed the connection; 2 for a usage error or an upstream command that
cannot be started (message on stderr; nothing is ever written to stdout but protocol lines).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import click

from drawbridge.cli.output import EXIT_INPUT, InputError
from drawbridge.gateway.jsonrpc import DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_MAX_UPSTREAM_MESSAGE_BYTES
from drawbridge.gateway.pipeline import (
    Decider,
    PolicyDecider,
    Recorder,
    allow_all,
    deny_all,
    null_recorder,
    policy_decider,
)
from drawbridge.gateway.stdio_relay import RelayConfig, serve_stdio
from drawbridge.gateway.truth_key import ALL_NAMES as TRUTH_KEY_NAMES
from drawbridge.gateway.truth_key import TruthKeyError, truth_key_from_env
from drawbridge.gateway.upstream import EnvPolicy, UpstreamStartError


def _configure_logging(verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("drawbridge: %(levelname)s %(message)s"))
    log = logging.getLogger("drawbridge")
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO if verbose else logging.WARNING)
    log.propagate = False


def _decider(policy: str | None, allow_everything: bool) -> Decider:
    if policy is not None and allow_everything:
        raise click.UsageError("--policy and --allow-all exclude each other")
    if allow_everything:
        return allow_all
    if policy is None:
        click.echo("drawbridge: no --policy given: every tools/call will be refused", err=True)
        return deny_all
    try:
        return policy_decider(policy)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot load policy {policy}: {exc}") from exc


def _recorder(
    decide: Decider,
    evidence_dir: str | None,
    truth_out: str | None,
    fsync: str,
    server_id: str,
    allow_everything: bool,
) -> Recorder:
    """The evidence recorder; key material is read (and removed from the environment) first."""
    # The truth producer's key never reaches the upstream, whether or not the producer is on.
    truth_key = None
    try:
        if truth_out is not None:
            truth_key = truth_key_from_env(os.environ)
        else:
            for name in TRUTH_KEY_NAMES:
                os.environ.pop(name, None)
    except TruthKeyError as exc:
        raise InputError(f"tool-decision truth producer: {exc}") from None
    if evidence_dir is None and truth_out is None:
        return null_recorder
    from drawbridge.gateway.recorder import EvidenceRecorder
    from drawbridge.policy.declared import DeclaredContracts, fixed_contract

    if isinstance(decide, PolicyDecider):
        declared: Callable[[str], Mapping[str, Any]] = DeclaredContracts(lambda: decide.store.current)
    else:
        contract = fixed_contract(allow_everything)
        declared = lambda agent: contract  # noqa: E731 -- one constant contract
    try:
        return EvidenceRecorder(
            evidence_dir,
            route=lambda tool: server_id,
            truth_out=truth_out,
            truth_key=truth_key,
            declared=declared,
            fsync=fsync,  # type: ignore[arg-type]
        )
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot open evidence output: {exc}") from exc


@click.command(
    name="wrap",
    context_settings={"help_option_names": ["-h", "--help"], "allow_interspersed_args": False},
)
@click.option("--policy", type=click.Path(exists=True), help="Policy file or directory that decides each tools/call.")
@click.option("--agent", default="anonymous", show_default=True, help="Agent id the policy is evaluated for.")
@click.option("--evidence-dir", type=click.Path(file_okay=False), help="Directory for the trace and evidence.")
@click.option(
    "--tool-decision-truth-out",
    type=click.Path(dir_okay=False),
    help="File to write tool-decision truth carriers to.",
)
@click.option(
    "--fsync",
    type=click.Choice(["always", "batch", "never"]),
    default="always",
    show_default=True,
    help="When evidence reaches the disk: after every record, every 64 records, or when the OS decides.",
)
@click.option(
    "--server-id",
    help="The upstream's id in surface records (default: the server command's file name).",
)
@click.option("--allow-all", "allow_everything", is_flag=True, help="Forward every tools/call (no policy).")
@click.option(
    "--call-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=120.0,
    show_default=True,
    help="Seconds a forwarded tools/call may take before the agent gets a timeout error.",
)
@click.option(
    "--max-message-bytes",
    type=click.IntRange(min=1024),
    default=DEFAULT_MAX_MESSAGE_BYTES,
    show_default=True,
    help="Largest message accepted from the agent.",
)
@click.option(
    "--max-upstream-message-bytes",
    type=click.IntRange(min=1024),
    default=DEFAULT_MAX_UPSTREAM_MESSAGE_BYTES,
    show_default=True,
    help="Largest message accepted from the server.",
)
@click.option("--verbose", "-v", is_flag=True, help="Also log informational events (policy reloads, shutdown).")
@click.argument("server_command", nargs=-1, required=True, type=click.UNPROCESSED)
def command(
    policy: str | None,
    agent: str,
    evidence_dir: str | None,
    tool_decision_truth_out: str | None,
    fsync: str,
    server_id: str | None,
    allow_everything: bool,
    call_timeout: float,
    max_message_bytes: int,
    max_upstream_message_bytes: int,
    verbose: bool,
    server_command: tuple[str, ...],
) -> None:
    """Run SERVER_COMMAND as a stdio MCP server behind the gateway.

    \b
    Example (in an MCP client's configuration):
      drawbridge wrap --policy policies/ --agent claude -- npx -y @modelcontextprotocol/server-github
    """
    _configure_logging(verbose)
    decide = _decider(policy, allow_everything)
    label = server_id or os.path.basename(server_command[0]) or "upstream"
    record = _recorder(decide, evidence_dir, tool_decision_truth_out, fsync, label, allow_everything)
    config = RelayConfig(
        agent=agent,
        max_message_bytes=max_message_bytes,
        max_upstream_message_bytes=max_upstream_message_bytes,
        call_timeout=call_timeout,
    )
    try:
        problem = anyio.run(_serve, list(server_command), decide, record, config)
    except KeyboardInterrupt:
        return
    finally:
        close = getattr(record, "close", None)
        if close is not None:
            close()
    if problem is not None:
        click.echo(f"drawbridge: {problem}", err=True)
        sys.exit(EXIT_INPUT)


async def _serve(argv: list[str], decide: Decider, record: Recorder, config: RelayConfig) -> str | None:
    """Serve until the client closes; returns why the upstream could not start, if it could not."""
    async with anyio.create_task_group() as tg:
        if isinstance(decide, PolicyDecider):
            from drawbridge.policy import watch_policies

            # Edits to the policy take effect on the next call; a broken edit keeps the previous policy.
            tg.start_soon(watch_policies, decide.store)
        try:
            env_filter = EnvPolicy(deny_names=frozenset(TRUTH_KEY_NAMES))
            await serve_stdio(argv, decide=decide, record=record, config=config, env_filter=env_filter)
        except UpstreamStartError as exc:
            return str(exc)
        finally:
            tg.cancel_scope.cancel()
    return None
