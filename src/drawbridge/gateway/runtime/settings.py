"""What a runtime is built from: serve's configuration file or wrap's flags, as one value.

Invariant: both commands fill in the same ``RuntimeSettings``, and nothing of the runtime is built
from anything else, so every floor, every fail-closed rule and every default is the same under both.
The differences are only the values: serve always has a policy, an evidence directory and a state
file; wrap may run with ``--allow-all``, without evidence, or with a temporary state file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from drawbridge.approval.memory import MemoryConfig
from drawbridge.catalogue.names import split_namespaced
from drawbridge.config import GatewayConfig
from drawbridge.config_notify import NotifyTarget
from drawbridge.config_guards import ResultGuardRule
from drawbridge.config_rates import RateLimits
from drawbridge.config_state import SharedState
from drawbridge.gateway.pipeline.approvals.gate import ApprovalSettings
from drawbridge.gateway.pipeline.call import DEFAULT_CALL_TIMEOUT_SECONDS
from drawbridge.gateway.pipeline.result_guards import ResultGuards
from drawbridge.gateway.recording.checkpoints import CheckpointSettings
from drawbridge.gateway.recording.telemetry import SERVE_LAST_EXPORT_SECONDS, TelemetrySettings
from drawbridge.gateway.recording.truth_key import ALL_NAMES as TRUTH_KEY_NAMES

GATEWAY_SERVER_ID: Final = "drawbridge"
STATE_FILE: Final = "drawbridge.db"


def secret_env_names(config: GatewayConfig) -> frozenset[str]:
    """Environment variables that hold the gateway's own credentials: every one the file names
    (``GatewayConfig.credential_env``: tokens, headers, state, key rings) and the truth key's. None is
    passed to a stdio child, unless that upstream's own ``env`` sets it (``DRAWBRIDGE_*`` never is,
    see ``EnvPolicy``): an upstream holding the admin token could approve its own calls."""
    return config.credential_env | frozenset(TRUTH_KEY_NAMES)


def upstream_of(tool: str) -> str:
    """serve's surface-record ``server.id`` of a namespaced tool: the upstream's configured name."""
    split = split_namespaced(tool)
    return split[0] if split is not None else GATEWAY_SERVER_ID


@dataclass(frozen=True)
class RuntimeSettings:
    policy: str | None = None
    """A policy file or directory; None refuses every call (unless ``allow_all``)."""
    shadow_policy: str | None = None
    """A policy file or directory decided beside ``policy`` and only reported (``pipeline.shadow``)."""
    allow_all: bool = False
    evidence_dir: str | None = None
    truth_out: str | None = None
    fsync: str = "batch"
    state_path: str | None = None
    """The SQLite state; None: a temporary file, removed on close (wrap without ``--state``)."""
    call_timeout: float = DEFAULT_CALL_TIMEOUT_SECONDS
    approval: ApprovalSettings = field(default_factory=ApprovalSettings)
    operator_channel: bool = True
    """A person can answer outside the client: a control plane is open, or the state file is shared."""
    pin_tools: bool = False
    pin_prompts: bool = False
    """Each upstream's prompts are pinned like its tools (``serve.prompt_pins``, ``wrap --pin-prompts``)."""
    hide_denied_tools: bool = False
    control_open: bool = False
    """A control plane is served: it needs a credential (``admin_token``)."""
    admin_token_sha256: str | None = None
    """The configured admin token's digest; None: the token file beside the state file (``admin_token``)."""
    agent_tokens: Mapping[str, str] = field(default_factory=dict)
    """The agents' static tokens, digest -> agent id: the token file's token must be none of them."""
    server_id: Callable[[str], str] = upstream_of
    """The served tool name -> the upstream's id in surface records."""
    checkpoints: CheckpointSettings = field(default_factory=CheckpointSettings)
    keys_dir: str | None = None
    """Where the signing keys live; None: ``keys`` inside the evidence directory."""
    origin: str | None = None
    """The trace's origin when its keys are made; None: a random one (``drawbridge.local/<hex>``)."""
    telemetry: TelemetrySettings | None = None
    network_transport: str = "pipe"
    """How agents reach this gateway, as telemetry names it: ``pipe`` (stdio) or ``tcp`` (HTTP)."""
    shared_state: SharedState | None = None
    """State on PostgreSQL shared with other replicas (``state``, ``replica``); None: ``state_path``."""
    rate_limits: RateLimits | None = None
    result_guards: ResultGuards | None = None
    """``result_guards`` (serve's file, ``wrap --result-guards``); None: results pass as they come."""

    @classmethod
    def from_config(cls, config: GatewayConfig, *, control_open: bool, network_transport: str = "tcp") -> RuntimeSettings:
        """serve's settings: everything from the configuration file."""
        telemetry = None
        if config.telemetry_endpoint is not None:
            telemetry = TelemetrySettings(config.telemetry_endpoint, config.telemetry_protocol,
                                          dict(config.telemetry_headers_env), config.telemetry_service_name,
                                          last_export_seconds=SERVE_LAST_EXPORT_SECONDS,
                                          withheld_env=secret_env_names(config))
        return cls(
            policy=config.policy_dir or config.policy_file,
            shadow_policy=config.shadow_policy_dir or config.shadow_policy_file,
            evidence_dir=config.evidence_dir,
            truth_out=config.tool_decision_truth_out,
            fsync=config.fsync,
            state_path=config.state_path,
            call_timeout=config.call_timeout_seconds,
            approval=ApprovalSettings.from_config(config),
            operator_channel=control_open,
            control_open=control_open,
            pin_tools=config.pin_tools,
            pin_prompts=config.pin_prompts,
            hide_denied_tools=config.hide_denied_tools,
            admin_token_sha256=config.admin_token_sha256,
            agent_tokens={a.token_sha256: a.agent for a in config.agents},
            checkpoints=CheckpointSettings(config.checkpoint_every_lines, config.checkpoint_every_seconds),
            keys_dir=config.keys_dir,
            origin=config.origin,
            telemetry=telemetry,
            network_transport=network_transport,
            shared_state=config.shared_state,
            rate_limits=config.rate_limits,
            result_guards=ResultGuards.of(config.result_guards),
        )

    @classmethod
    def for_wrap(
        cls,
        *,
        policy: str | None,
        allow_all: bool,
        evidence_dir: str | None,
        truth_out: str | None,
        fsync: str,
        state_path: str | None,
        call_timeout: float,
        approval_timeout: float,
        non_blocking: bool,
        elicitation: bool,
        approval_memory: int,
        control_open: bool,
        pin_tools: bool,
        admin_token_sha256: str | None,
        pin_prompts: bool = False,
        server_id: str,
        checkpoints: CheckpointSettings | None = None,
        keys_dir: str | None = None,
        telemetry: TelemetrySettings | None = None,
        shadow_policy: str | None = None,
        notify: tuple[NotifyTarget, ...] = (),
        result_guards: tuple[ResultGuardRule, ...] | None = None,
    ) -> RuntimeSettings:
        """wrap's settings, from its flags. The state file is ``--state``, else ``drawbridge.db`` inside
        the evidence directory, else a temporary file."""
        approval = ApprovalSettings(
            timeout_seconds=approval_timeout,
            non_blocking=non_blocking,
            elicitation=elicitation,
            memory=MemoryConfig(enabled=approval_memory > 0, min_approvals=max(approval_memory, 1)),
            notify=notify,
        )
        effective_state = state_path
        if effective_state is None and evidence_dir is not None:
            effective_state = str(Path(evidence_dir).absolute() / STATE_FILE)
        return cls(
            policy=policy,
            shadow_policy=shadow_policy,
            allow_all=allow_all,
            evidence_dir=evidence_dir,
            truth_out=truth_out,
            fsync=fsync,
            state_path=effective_state,
            call_timeout=call_timeout,
            approval=approval,
            # A person outside the client: this wrap's control plane, or a gateway sharing the state file.
            operator_channel=control_open or state_path is not None,
            control_open=control_open,
            pin_tools=pin_tools,
            pin_prompts=pin_prompts,
            admin_token_sha256=admin_token_sha256,
            server_id=lambda _tool: server_id,
            checkpoints=checkpoints or CheckpointSettings(),
            keys_dir=keys_dir,
            telemetry=telemetry,
            result_guards=ResultGuards.of(result_guards),
        )


__all__ = ["GATEWAY_SERVER_ID", "STATE_FILE", "RuntimeSettings", "secret_env_names", "upstream_of"]
