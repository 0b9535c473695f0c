"""What ``serve`` tells the operator when it is up and when it stops: where agents connect, where the
control plane is, each upstream with its tool count and whether it is up, the policies (and a shadow
policy) and the evidence directory, and where to look live.

Invariant: the summary says what is true at the moment it is printed: an upstream that is down is
listed as down with its one cause, never counted as served. It names files, URLs and counts, never a
token (the control plane's line names the file that holds it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from drawbridge.cli.log_format import say
from drawbridge.gateway.runtime.assembly import Runtime
from drawbridge.gateway.upstreams.local import LocalUpstream
from drawbridge.gateway.upstreams.session import UpstreamSession


def upstream_states(upstreams: Sequence[UpstreamSession], local: Sequence[LocalUpstream]) -> list[dict[str, Any]]:
    """Each upstream: name, up or down, tool count, and the cause when down."""
    states: list[dict[str, Any]] = []
    for upstream in upstreams:
        state: dict[str, Any] = {"name": upstream.name, "up": upstream.ready, "tools": len(upstream.tools)}
        if not upstream.ready:
            state["cause"] = upstream.unavailable_reason()
        states.append(state)
    for kind in local:
        states.append({"name": kind.name, "up": True, "tools": len(kind.tools)})
    return states


def policy_summary(runtime: Runtime) -> dict[str, Any]:
    store = runtime.policy_store
    if store is None:
        return {"policies": 0, "path": None}
    current = store.current
    files = sorted({policy.source_file for policy in current.policies})
    return {"path": str(store.path), "policies": len(current.policies), "files": files}


def print_summary(
    runtime: Runtime,
    mcp_url: str | None,
    upstreams: Sequence[UpstreamSession],
    local: Sequence[LocalUpstream],
    host_header: str | None = None,
) -> None:
    """The startup summary (module docstring), one line per fact, through the log's format; the line
    naming the listener comes last, so whoever waits for it has the whole summary. ``host_header`` is
    the ``Host`` a client of ``mcp_url`` must send when its address is not in ``listen.allowed_hosts``
    (``AllowedHosts.host_to_send``): the URLs are then printed with it, never as if they answered."""
    states = upstream_states(upstreams, local)
    up = sum(1 for state in states if state["up"])
    for state in states:
        if state["up"]:
            say(f"  upstream {state['name']}: up, {state['tools']} tools", upstream=state["name"], up=True,
                tools=state["tools"])
        else:
            say(f"  upstream {state['name']}: down: {state['cause']}", upstream=state["name"], up=False,
                cause=state["cause"])
    policies = policy_summary(runtime)
    files = ", ".join(policies.get("files", ())) or "none"
    say(f"  policies: {policies['policies']} from {policies['path']} ({files})", **policies)
    if runtime.shadow_tally is not None:
        shadow = runtime.shadow_tally.store
        say(f"  shadow policy: {len(shadow.current.policies)} from {shadow.path} (reported, never enforced)",
            shadow_policy=str(shadow.path), shadow_policies=len(shadow.current.policies))
    guards = runtime.settings.result_guards
    if guards is not None:
        say(f"  result guards: {len(guards.rules)} entries (secrets redacted, sizes capped on what tools return)",
            result_guards=len(guards.rules))
    evidence = runtime.settings.evidence_dir
    say(f"  evidence: {evidence if evidence is not None else 'none (no trace is written)'}", evidence_dir=evidence)
    if mcp_url is not None:
        base = mcp_url.rsplit("/mcp", 1)[0]
        authority = base.split("://", 1)[1]
        needs = (
            f" with the header Host: {host_header} ({authority} is not in listen.allowed_hosts)"
            if host_header is not None else ""
        )
        extra = {"host_header": host_header} if host_header is not None else {}
        say(f"  live: decisions on this log; {base}/healthz and {base}/readyz{needs}; /metrics on the "
            "control plane", healthz=f"{base}/healthz", readyz=f"{base}/readyz", **extra)
        # last: once it is printed, the whole summary is
        say(
            f"serving {len(states)} upstream(s) on {mcp_url} ({up} up, {len(states) - up} down){needs}",
            listener=mcp_url, upstreams_up=up, upstreams_down=len(states) - up, **extra,
        )
    else:
        say(f"serving {len(states)} upstream(s) on stdin/stdout ({up} up, {len(states) - up} down)",
            listener="stdio", upstreams_up=up, upstreams_down=len(states) - up)


def print_stopping(signal_name: str, runtime: Runtime) -> None:
    say(f"{signal_name} received: stopping (calls being decided: {runtime.pipeline.deciding})",
        signal=signal_name, deciding=runtime.pipeline.deciding)


__all__ = ["print_stopping", "print_summary", "upstream_states"]
