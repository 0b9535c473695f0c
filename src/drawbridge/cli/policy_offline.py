"""``drawbridge policy check|explain|test``: the policy, checked before it runs, without a gateway.

Invariant: these commands decide with the code the gateway runs (``drawbridge.policy.evaluate``, through
the same ``PolicyStore.evaluate`` the gateway's decider calls) on the files loaded the way the gateway
loads them (``state.policy_files``), so what they say is what a running gateway would decide for the
policy. They never connect an agent, never call a tool and never open the evidence.

Exit codes: ``check``: 0 loaded (warnings printed), 1 the policy does not load, 2 usage or a
configuration that cannot be read. ``explain``: 0, or 1 when the policy does not load. ``test``: 0
every expectation holds, 1 one does not (or a policy or table does not load), 2 usage.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import click

from drawbridge.cli.output import EXIT_FAILED, EXIT_INPUT, agent_id
from drawbridge.cli.seconds import Seconds
from drawbridge.config import ConfigError, GatewayConfig, load_config
from drawbridge.policy.lint import Finding, dead_rules, shadowed_rules
from drawbridge.policy.expectations import Case, Table, read_table
from drawbridge.policy.load import PolicyLoadError
from drawbridge.policy.model import Action, Basis, Decision, PolicySet
from drawbridge.state.policy_store import PolicyStore

CATALOGUE_TIMEOUT_SECONDS = 30.0


def _config(path: str | None) -> GatewayConfig | None:
    if path is None:
        return None
    try:
        return load_config(path, uses=frozenset())  # no agent and no operator is served here
    except ConfigError as exc:
        click.echo(str(exc), err=True)
        sys.exit(EXIT_INPUT)


def _store(policy: str | None, config: GatewayConfig | None) -> PolicyStore:
    """The policy as the gateway would load it: ``--policy``, else the configuration's."""
    path = policy or (config.policy_dir or config.policy_file if config is not None else None)
    if path is None:
        raise click.UsageError("give --policy DIR|FILE, or --config FILE naming policy_dir or policy_file")
    try:
        return PolicyStore.open(path)
    except PolicyLoadError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_FAILED)


def served_names(config: GatewayConfig, timeout: float) -> tuple[list[str], dict[str, str | None]]:
    """The tool names serve would serve for ``config`` (read live), and the upstreams that did not
    answer, each with why when ``discover`` knows (a missing environment variable, a spec that does
    not load), so the warning names the cause rather than a silence."""
    from drawbridge.cli.discover_cmd import discover

    found = anyio.run(discover, config, timeout)
    answered = {tool.server for tool in found.tools}
    missing = {
        name: next((reason for reason in found.unavailable if repr(name) in reason), None)
        for name in config.upstream_names if name not in answered
    }
    return [tool.name for tool in found.tools], missing


def lint(policies: PolicySet, names: list[str] | None, missing: list[str]) -> list[Finding]:
    findings = shadowed_rules(policies, names)
    if names is not None:
        unknown = tuple(f"{name}." for name in missing)
        findings += [
            finding for finding in dead_rules(policies, names)
            if not any(text.startswith(unknown) for text in
                       ([finding.pattern] if finding.pattern is not None else _rule_texts(policies, finding)))
        ]
    return sorted(findings, key=lambda f: (f.source_file, f.rule_index, f.kind))


def _rule_texts(policies: PolicySet, finding: Finding) -> list[str]:
    for policy in policies.policies:
        if policy.name == finding.policy and policy.source_file == finding.source_file:
            return [pattern.text for pattern in policy.rules[finding.rule_index].tools]
    return []


@click.command(name="check")
@click.option("--policy", metavar="DIR|FILE", help="The policy directory or file (default: the configuration's).")
@click.option("--config", "config_path", metavar="FILE",
              help="Read the upstreams' catalogues live and warn about rules that match no served tool.")
@click.option("--timeout", type=Seconds(min=0.1, max=600), default=CATALOGUE_TIMEOUT_SECONDS,
              show_default=True, help="Seconds to wait for the upstreams (with --config).")
def check(policy: str | None, config_path: str | None, timeout: float) -> None:
    """Load and validate the policy; warn about rules that can never decide.

    \b
    A rule is shadowed when an earlier unconditional rule of its policy matches every tool it names;
    with --config, a rule is dead when it matches no tool the upstreams serve (a name written without
    its upstream's prefix, say). Exit 1 when the policy does not load, 0 otherwise.
    """
    config = _config(config_path)
    store = _store(policy, config)
    names: list[str] | None = None
    missing: dict[str, str | None] = {}
    if config is not None:
        names, missing = served_names(config, timeout)
        for name, reason in missing.items():
            why = reason if reason is not None else f"upstream {name!r} did not answer"
            click.echo(f"warning: {why}: rules naming its tools are not checked")
    findings = lint(store.current, names, list(missing))
    for finding in findings:
        click.echo(f"warning: {finding.describe()}")
    rules = sum(len(p.rules) for p in store.current.policies)
    catalogue = f", {len(names)} served tools" if names is not None else ""
    click.echo(f"{len(store.current.policies)} policies, {rules} rules{catalogue}: {len(findings)} warning(s)")


def gateway_reading(text: str, tool: str) -> tuple[dict[str, Any], None] | tuple[None, str]:
    """The arguments (JSON text) of a call to ``tool`` as the gateway reads them: the call is built as an
    agent would send it and read by the gateway's own reader, so what it would refuse before any rule (a
    name with a control character, a repeated key, keys equal after case folding, a number no double
    holds, arguments that are not an object) is refused here too, never decided as if it ran. Either
    ``(arguments, None)`` or ``(None, why)``."""
    from drawbridge.gateway.pipeline.tool_call import parse_tool_call
    from drawbridge.gateway.protocol.jsonrpc import LineRefusal, MessageError, read_client_line

    head = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool}})[:-2]
    line = f'{head},"arguments":{text}}}}}'.encode("utf-8", "surrogatepass")
    message = read_client_line(line)
    if isinstance(message, LineRefusal):
        return None, message.detail
    try:
        return dict(parse_tool_call(message, "explain", None).arguments), None
    except MessageError as exc:
        return None, exc.message


REFUSED_BEFORE_ANY_RULE = "the gateway refuses such a call before any rule"


def _arguments(text: str | None, tool: str) -> Any:
    """``--args`` (absent: ``{}``, so the name is still read as the gateway reads it) through
    ``gateway_reading``; what the gateway refuses is a usage error, never explained as if it ran."""
    if text is not None:
        try:
            json.loads(text)  # one JSON value, its syntax errors placed in the text as given
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"not JSON: {exc.msg} at character {exc.pos}", param_hint="--args") from None
        except (ValueError, RecursionError):
            pass  # what the gateway's reader refuses, it says why below
    arguments, problem = gateway_reading("{}" if text is None else text, tool)
    if problem is not None:
        raise click.BadParameter(f"{REFUSED_BEFORE_ANY_RULE}: {problem}",
                                 param_hint="--args" if text is not None else "TOOL")
    return arguments


def _rule_shown(decision: Decision) -> str:
    """Where the decision comes from, said as the reason and ``considered first`` say it: a rule by its
    index in its file's ``rules`` and by its line (``file:N`` is only ever a line)."""
    if decision.rule_index is not None:
        where = f"rule {decision.rule_index} of {decision.source_file}"
        return f"{where} (line {decision.line}) in policy {decision.policy!r}"
    if decision.policy is not None:  # a schema decides: its policy, file and line, no rule
        where = f"the schema in {decision.source_file}"
        return f"none: {where} (line {decision.line}) of policy {decision.policy!r}"
    return "none (no rule matched)"


@click.command(name="explain")
@click.option("--policy", metavar="DIR|FILE", help="The policy directory or file (default: the configuration's).")
@click.option("--config", "config_path", metavar="FILE",
              help="The gateway configuration: names the policy, and with it the floors are computed from the "
                   "upstreams' live catalogues and the pins in the state file.")
@click.option("--agent", required=True, metavar="ID", callback=agent_id, help="The agent id the call comes from.")
@click.option("--args", "args_json", metavar="JSON", help="The call's arguments (a JSON object).")
@click.option("--timeout", type=Seconds(min=0.1, max=600), default=CATALOGUE_TIMEOUT_SECONDS,
              show_default=True, help="Seconds to wait for the upstreams (with --config).")
@click.argument("tool")
def explain(
    policy: str | None, config_path: str | None, agent: str, args_json: str | None, timeout: float, tool: str
) -> None:
    """Which rule decides TOOL for the agent, why, and which floors raise it (the gateway's own code).

    \b
    With --config, the floors are computed as serve would apply them now: the tool's pin status
    (pin_tools: changed asks a person, new is denied) and a CLI dispatcher's floor; the action
    after the floors is the one a call gets.
    """
    from drawbridge.catalogue.floors import apply_floor
    from drawbridge.policy.evaluate import explain as table_entry

    config = _config(config_path)
    store = _store(policy, config)
    arguments = _arguments(args_json, tool)
    decision = store.evaluate(agent, tool, arguments)
    click.echo(f"action: {decision.action.value}")
    click.echo(f"rule: {_rule_shown(decision)}")
    click.echo(f"basis: {decision.basis.value}")
    click.echo(f"reason: {decision.reason}")
    if decision.action.value == "human_approval":
        click.echo(f"approver: {decision.approver.value}")
    view = table_entry(store.current, agent, tool)
    for candidate in view.conditional:
        click.echo(f"considered first: rule {candidate.rule.index} of {candidate.policy.source_file} "
                   f"(line {candidate.rule.line}, {candidate.rule.action.value} when its conditions hold)")
    if config is None:
        click.echo("floors: not computed without --config (a changed or new pin and a CLI dispatcher can only "
                   "raise this action)")
        return
    from drawbridge.cli.policy_floors import tool_floor_of

    found = anyio.run(tool_floor_of, config, tool, timeout)
    for note in found.notes:
        click.echo(f"note: {note}")
    if not found.served:
        return
    if not found.floor.reasons:
        click.echo("floors: none")
    for reason in found.floor.reasons:
        click.echo(f"floor: {reason}")
    floored = apply_floor(found.floor, decision.action)
    raised = " (raised by the floor)" if floored.by_floor else ""
    click.echo(f"action after floors: {floored.action.value}{raised}")
    if floored.action is Action.HUMAN_APPROVAL and found.floor.action is Action.HUMAN_APPROVAL:
        # The gateway's floor stage makes such a question a person's (``pipeline.floors``), whatever the rule said.
        click.echo("approver after floors: operator (a floor's question: never the client's answer, no grant "
                   "or approval memory lifts it)")


def _table(path: Path) -> Table:
    """A table file, read strictly (``policy.expectations``); one that does not read is exit 1."""
    try:
        table = read_table(path.read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError) as exc:
        raise click.ClickException(f"{path}: cannot read the table: {exc}") from None
    except PolicyLoadError as exc:  # TableError, and any other located problem of the text
        raise click.ClickException(str(exc)) from None
    for number, case in enumerate(table.cases, start=1):
        # A case the gateway would refuse before any rule (a repeated key after case folding, an integer
        # beyond 2^53, a name with a control character) would assert a decision no call ever gets.
        _, problem = gateway_reading(json.dumps(case.arguments, ensure_ascii=False), case.tool)
        if problem is not None:
            raise click.ClickException(f"{path}:{case.line}: case {number}: {REFUSED_BEFORE_ANY_RULE}: {problem}")
    return table


@click.command(name="test")
@click.option("--policy", metavar="DIR|FILE", help="The policy (default: each table's own 'policy' key).")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
def test(policy: str | None, files: tuple[Path, ...]) -> None:
    """Check table-driven expectations: each case's agent, tool and arguments must get its action.

    \b
    A table (YAML):
      policy: ./policies          # relative to the table file
      cases:
        - {agent: claude, tool: git.git_status, expect: allow}
        - {agent: claude, tool: git.git_push, arguments: {force: true}, expect: deny, rule: 2}

    A table is read as strictly as a policy: an unknown key, a case without agent, tool or expect,
    arguments that are not an object, a rule that is not an integer, or no case at all is exit 1.
    """
    failed = passed = 0
    for path in files:
        table = _table(path)
        own = str(path.parent / table.policy) if table.policy is not None else None
        if policy is None and own is None:  # test has no --config: the table names its policy
            raise click.UsageError(f"{path}: the table has no `policy:` key (a path relative to the table); "
                                   "add one, or give --policy DIR|FILE")
        store = _store(policy or own, None)
        for number, case in enumerate(table.cases, start=1):
            problem = _check_case(store, case)
            if problem is None:
                passed += 1
            else:
                failed += 1
                click.echo(f"FAIL {path}:{case.line}: case {number} ({case.agent} {case.tool}): {problem}")
    click.echo(f"{passed} passed, {failed} failed")
    if failed:
        sys.exit(EXIT_FAILED)


def _check_case(store: PolicyStore, case: Case) -> str | None:
    decision = store.evaluate(case.agent, case.tool, case.arguments)
    if decision.action is not case.expect:
        where = f"rule {decision.rule_index} of {decision.source_file}" if decision.rule_index is not None else "no rule"
        return f"expected {case.expect.value}, got {decision.action.value} ({where}: {decision.reason})"
    if case.rule is not None and case.rule != decision.rule_index:
        return f"expected rule {case.rule}, decided by {_decided_by(decision)}"
    return None


def _decided_by(decision: Decision) -> str:
    """What decided a call, for a reader who expected a rule: a rule has an index; the default deny
    and an argument schema have none, and printing ``None`` would name neither."""
    if decision.rule_index is not None:
        return f"rule {decision.rule_index}"
    if decision.basis is Basis.SCHEMA:
        return f"the argument schema of policy {decision.policy} (no rule)"
    return "the default deny (no rule matched)"


__all__ = ["check", "explain", "test"]
