"""The runtime both commands share, built once per process: one object of each kind, used by the calls
and the control plane alike.

Invariant: the calls and the control plane act on the same objects, and wrap and serve build them the
same way. The ``PolicyStore`` the pipeline evaluates is the one ``PUT /policies/...`` edits and
reloads (a shadow policy's store beside it is only reported, never edited); the ``ApprovalEngine``
whose waiters a call blocks on is the one ``POST /approvals/{id}/approve`` resolves; the
``CataloguePins`` whose floors decide calls are the ones ``POST /tools/pins/accept`` changes; the
trace every call is recorded in is the one policy edits, pin events and approvals are appended to,
through the one ``EvidenceGuard``, so a trace entry that cannot be written makes the gateway refuse
every later call, whichever kind of entry it was. Nothing is copied, so nothing falls out of step.

Theory of operation. ``Runtime.build(settings)`` runs before anything is spawned or bound, and every
problem it finds is a ``StartupProblem`` (a one-line startup error): the policy is loaded (a gateway
never starts on a policy it cannot read), the truth producer's key is read and removed from the
environment (it never reaches an upstream, whether or not the producer is on), the evidence files
and the state database are opened. It then assembles, in order: the guard around the recorder; the
approval engine and its gate (with a policy: approvals come from ``human_approval`` rules), and with
``approval.notify`` the notifier each new question is posted to webhooks by; with
``pin_tools`` (and ``pin_prompts``), the pin store and the ``CataloguePins`` of that kind (upstreams are added as their catalogues
become known, ``guard_catalogue``); the floors; the ``CallPipeline``. ``run`` starts, before any call
is taken, what runs beside the calls: the pipeline's own tasks, the policy watcher (an edit takes
effect on the next call; a broken edit keeps the previous policy; a shadow policy is watched alike,
and neither it nor its reloads reach the trace), the approvals (what a previous process left pending
expires, then a sweeper expires what comes due), and the notifier's workers.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskStatus

from drawbridge.canonical import sanitize
from drawbridge.catalogue.fingerprint import PROMPTS, TOOLS
from drawbridge.config_state import URL_AS_PATH, looks_like_url
from drawbridge.gateway.pipeline.activity import log_decision
from drawbridge.gateway.pipeline.approvals.engine import ApprovalEngine
from drawbridge.gateway.pipeline.approvals.gate import ApprovalGate, build_approval_engine, recover_approvals, run_approvals
from drawbridge.gateway.pipeline.approvals.notify import ApprovalNotifier
from drawbridge.gateway.pipeline.call import CallPipeline
from drawbridge.gateway.pipeline.deciders import Decider, PolicyDecider, allow_all, deny_all, policy_decider
from drawbridge.gateway.pipeline.floors import Floors
from drawbridge.gateway.pipeline.guard import EvidenceGuard
from drawbridge.gateway.pipeline.pins import CataloguePins, CatalogueSource, open_pins
from drawbridge.gateway.pipeline.rate_limits import rate_limiter
from drawbridge.gateway.pipeline.records import CallRecord, Recorder, null_recorder
from drawbridge.gateway.recording.checkpoints import Checkpointer, evidence_producer, new_run_id
from drawbridge.gateway.recording.metrics import GatewayMetrics
from drawbridge.gateway.recording.recorder import EvidenceRecorder, utc_now
from drawbridge.gateway.recording.shadow_tally import ShadowTally, open_shadow_tally
from drawbridge.gateway.recording.telemetry import Telemetry, TelemetryUnavailable
from drawbridge.gateway.recording.truth_key import ALL_NAMES as TRUTH_KEY_NAMES
from drawbridge.gateway.recording.truth_key import TruthKey, TruthKeyError, digest_key_from_env, truth_key_from_env
from drawbridge.gateway.runtime.admin_token import AdminTokenProblem, ensure_admin_token, token_file_for
from drawbridge.gateway.runtime.replicas import approval_keys, follow, open_shared, replica_name
from drawbridge.gateway.runtime.settings import STATE_FILE, RuntimeSettings
from drawbridge.policy.declared import DeclaredContracts, fixed_contract
from drawbridge.state.append_only import AppendOnlyError, AppendOnlyLocked
from drawbridge.state.checkpoint_files import CheckpointFiles, latest_note, log_origins
from drawbridge.state.pins import SqlitePinStore
from drawbridge.state.policy_store import PolicyStore, ReloadResult, watch_policies
from drawbridge.state.signing_keys import KEYS_DIR, KeyFileError, open_keys
from drawbridge.state.backend import StateBackend
from drawbridge.state.key_ring import KeyRingMismatch
from drawbridge.state.postgres import PostgresDB, ReplicaIdInUse
from drawbridge.state.private_files import make_private_dirs
from drawbridge.state.sqlite import StateDB, StateError
from drawbridge.state.trace_log import TraceLogCorrupt

if TYPE_CHECKING:
    from drawbridge.control.services import RecentCallRing

logger = logging.getLogger("drawbridge.gateway")

POLICY_SET_KIND = "mesh.policy_set"
"""The trace entry naming the policy set a run starts with; the decisions after it (until the next
``mesh.policy_reload`` or ``mesh.policy_edit``) were decided by that set."""
POLICY_RELOAD_KIND = "mesh.policy_reload"


class StartupProblem(Exception):
    """A problem found while building the runtime: a startup error, printed as is (exit code 2)."""


def load_policy(settings: RuntimeSettings) -> Decider:
    """The enforced policy's decider, with the shadow policy beside it when one is configured."""
    if settings.shadow_policy is not None and (settings.allow_all or settings.policy is None):
        raise StartupProblem("a shadow policy needs an enforced policy to be decided beside, not --allow-all")
    if settings.allow_all:
        return allow_all
    if settings.policy is None:
        return deny_all
    try:
        decider = policy_decider(settings.policy)
    except (OSError, ValueError) as exc:
        raise StartupProblem(f"cannot load the policy {settings.policy}: {exc}") from exc
    if settings.shadow_policy is not None:
        try:
            decider.shadow = PolicyStore.open(settings.shadow_policy)
        except (OSError, ValueError) as exc:
            raise StartupProblem(f"cannot load the shadow policy {settings.shadow_policy}: {exc}") from exc
        decider.shadow.kind = "shadow policy"
    return decider


def load_truth_key(settings: RuntimeSettings, environ: Any = os.environ) -> TruthKey | None:
    """The truth producer's key when it is configured; every truth key variable leaves the environment."""
    try:
        if settings.truth_out is not None:
            return truth_key_from_env(environ)
        for name in TRUTH_KEY_NAMES:
            environ.pop(name, None)
        return None
    except TruthKeyError as exc:
        raise StartupProblem(f"tool-decision truth producer: {exc}") from None


def open_recorder(
    settings: RuntimeSettings, policy: Decider, truth_key: TruthKey | None, replica_id: str | None = None
) -> Recorder:
    """The evidence recorder (none when neither evidence nor truth carriers are asked for)."""
    if settings.evidence_dir is None and settings.truth_out is None:
        return null_recorder
    if isinstance(policy, PolicyDecider):
        store = policy.store
        declared: Callable[[str], Mapping[str, Any]] = DeclaredContracts(lambda: store.current)
    else:
        contract = fixed_contract(settings.allow_all)
        declared = lambda _agent: contract  # noqa: E731 -- one constant contract
    try:
        digest_key = digest_key_from_env(os.environ)
    except TruthKeyError as exc:
        raise StartupProblem(f"argument digest key: {exc}") from None
    if digest_key is not None and truth_key is not None:
        raise StartupProblem(
            "argument digest key: the truth producer's key keys the digests when it is on; unset "
            "DRAWBRIDGE_ARGS_DIGEST_KEY* or the truth producer's key"
        )
    try:
        return EvidenceRecorder(
            settings.evidence_dir,
            route=settings.server_id,
            truth_out=settings.truth_out,
            truth_key=truth_key,
            digest_key=digest_key,
            declared=declared,
            fsync=settings.fsync,  # type: ignore[arg-type]
            replica=replica_id,
        )
    except AppendOnlyLocked as exc:
        raise StartupProblem(
            f"cannot open the evidence output: {exc} (another gateway writes this evidence directory: stop it, "
            "or give this one a directory of its own)"
        ) from None
    except TraceLogCorrupt as exc:
        raise StartupProblem(
            f"cannot open the evidence output: {exc}; `drawbridge evidence verify-chain` shows where; move the file aside "
            "(it stays evidence) so that a new chain starts"
        ) from None
    except (AppendOnlyError, OSError, ValueError) as exc:
        raise StartupProblem(f"cannot open the evidence output: {exc}") from None


def open_checkpointer(settings: RuntimeSettings, recorder: Recorder, replica_id: str | None = None) -> Checkpointer | None:
    """With an evidence directory: the signing keys (made at first start) and the checkpointer, with
    this process's run opened in the trace (``run_start``)."""
    trace = recorder.trace if isinstance(recorder, EvidenceRecorder) else None
    if trace is None or settings.evidence_dir is None:
        return None
    keys_dir = settings.keys_dir or str(Path(settings.evidence_dir) / KEYS_DIR)
    try:
        note = latest_note(settings.evidence_dir)
        keys = open_keys(keys_dir, settings.origin, log_origins(note, trace.path), note)
        files = CheckpointFiles(settings.evidence_dir, durable=settings.fsync != "never")
    except KeyFileError as exc:
        raise StartupProblem(f"cannot use the evidence signing keys: {exc}") from None
    except (AppendOnlyError, OSError) as exc:
        raise StartupProblem(f"cannot open the checkpoint log: {exc}") from None
    checkpointer = Checkpointer(
        trace, keys, files, settings.checkpoints, durable=settings.fsync != "never", clock=utc_now
    )
    try:
        checkpointer.begin_run(new_run_id(utc_now), evidence_producer(), replica_id)
    except (AppendOnlyError, OSError) as exc:
        checkpointer.close()
        raise StartupProblem(f"cannot open the run in the trace: {exc}") from None
    return checkpointer


def open_telemetry(
    settings: RuntimeSettings, guard: EvidenceGuard, recorder: Recorder, checkpointer: Checkpointer | None
) -> Telemetry | None:
    """Live telemetry when it is configured: it sees every batch of recorded calls after it is written
    (never before, never in their way) and every signed checkpoint."""
    if settings.telemetry is None:
        return None
    try:
        telemetry = Telemetry(settings.telemetry, os.environ, network_transport=settings.network_transport,
                              origin=checkpointer.origin if checkpointer is not None else None)
    except TelemetryUnavailable as exc:
        raise StartupProblem(str(exc)) from None
    trace = recorder.trace if isinstance(recorder, EvidenceRecorder) else None

    def observe(events: Any) -> None:
        head = trace.head if trace is not None else None
        telemetry.observe(events, head.seq if head is not None else None)

    guard.batch_observers.append(observe)
    if checkpointer is not None:
        checkpointer.published.append(telemetry.checkpoint)
    return telemetry


def open_metrics(guard: EvidenceGuard, recorder: Recorder) -> GatewayMetrics:
    """The gateway's metrics, fed by every written batch of records and every evidence write."""
    metrics = GatewayMetrics()
    guard.batch_observers.append(metrics.observe_batch)
    guard.write_timer = metrics.write_seconds
    if isinstance(recorder, EvidenceRecorder):
        metrics.fsync_lag_seconds = recorder.fsync_lag_seconds
    metrics.evidence_broken = lambda: guard.failed
    return metrics


def open_state(path: str | None) -> tuple[StateDB, str | None]:
    """The state database (created if missing) and the temporary folder holding it, if it is one."""
    temp_dir = None
    if path is None:
        import tempfile  # only a gateway without a state path or evidence folder keeps its state there

        temp_dir = tempfile.mkdtemp(prefix="drawbridge-")
        path = str(Path(temp_dir) / STATE_FILE)
    elif looks_like_url(path):
        raise StartupProblem(f"the state file path {URL_AS_PATH}")
    try:
        make_private_dirs(Path(path).absolute().parent)
        db = StateDB.open(path)
        try:
            db.hold_instance()  # another gateway's start leaves this one's approvals alone (state.instances)
        except BaseException:
            db.close()
            raise
        return db, temp_dir
    except OSError as exc:
        _remove_temporary(temp_dir)
        reason = exc.strerror or str(exc)
        raise StartupProblem(f"cannot open the state database {path}: {reason}; the gateway does not start without it") from None
    except StateError as exc:
        _remove_temporary(temp_dir)
        raise StartupProblem(f"{exc}; the gateway does not start without it") from None


def open_any_state(settings: RuntimeSettings, replica_id: str | None) -> tuple[StateBackend, str | None]:
    """The state the settings name: shared PostgreSQL (``state``) or the SQLite file (``open_state``)."""
    shared = settings.shared_state
    if shared is None:
        return open_state(settings.state_path)
    assert replica_id is not None
    try:
        return open_shared(shared, replica_id), None
    except (KeyRingMismatch, ReplicaIdInUse) as exc:
        raise StartupProblem(str(exc)) from None
    except StateError as exc:
        raise StartupProblem(f"{exc}; the gateway does not start without its state") from None


def recent_call_summary(record: CallRecord, ring: RecentCallRing, clock: Callable[[], str] = utc_now) -> None:
    """Note a recorded call in the ring the approval view shows (no arguments)."""
    if record.tool is None:
        return
    provenance = record.provenance
    ring.add(
        record.agent,
        {
            "tool": sanitize(record.tool),
            "action": record.action.value if record.action is not None else None,
            "outcome": record.outcome.value,
            "policy": sanitize(provenance.policy) if provenance and provenance.policy else None,
            "rule_index": provenance.rule_index if provenance else None,
            "at": clock(),
        },
    )


@dataclass
class Runtime:
    """Everything a command shares between its calls and its control plane (module docstring)."""

    settings: RuntimeSettings
    policy: Decider
    recorder: Recorder
    guard: EvidenceGuard
    pipeline: CallPipeline
    state_db: StateBackend | None = None
    engine: ApprovalEngine | None = None
    pin_store: SqlitePinStore | None = None
    pins: CataloguePins | None = None
    checkpointer: Checkpointer | None = None
    telemetry: Telemetry | None = None
    _temp_dir: str | None = field(default=None, repr=False)
    admin_token_sha256: str | None = None
    """What the control plane's credential must hash to (configured, or from ``admin_token_file``)."""
    admin_token_file: Path | None = None
    """The file holding the control plane's credential, when the gateway made or reused it."""
    replica_id: str | None = None
    """This replica's name on a shared state (None: SQLite, one gateway)."""
    pins_changed_elsewhere: list[Callable[[str], Any]] = field(default_factory=list)
    """Called with a server whose pins another replica changed, after they are checked here."""
    metrics: GatewayMetrics = field(default_factory=GatewayMetrics)
    """What ``/metrics`` shows, fed by every recorded call."""
    shadow_tally: ShadowTally | None = None
    """With a shadow policy: its verdicts of the recorded calls, for ``GET /shadow``."""
    notifier: ApprovalNotifier | None = None
    """Posts each question this process opens to the webhooks of ``approval.notify``."""
    prompt_pins: CataloguePins | None = None
    """``pin_prompts``: each upstream's prompts against their pins (no floors: prompts are not decided)."""
    _prepared: bool = field(default=False, repr=False)

    @classmethod
    def build(cls, settings: RuntimeSettings) -> Runtime:
        """Assemble the runtime (module docstring); raises ``StartupProblem``."""
        policy = load_policy(settings)
        replica_id = replica_name(settings.shared_state) if settings.shared_state is not None else None
        recorder = open_recorder(settings, policy, load_truth_key(settings), replica_id)
        guard = EvidenceGuard(recorder)
        guard.observers.append(log_decision)  # the operator's live line per decision (no arguments)
        metrics = open_metrics(guard, recorder)
        tally = open_shadow_tally(policy, guard)
        metrics.shadow_calls = {} if tally is not None else None  # the metrics count the shadow's pairs too
        state_db: StateBackend | None = None
        temp_dir: str | None = None
        checkpointer: Checkpointer | None = None
        telemetry: Telemetry | None = None
        try:
            checkpointer = open_checkpointer(settings, recorder, replica_id)
            telemetry = open_telemetry(settings, guard, recorder, checkpointer)
            engine = gate = None
            notifier: ApprovalNotifier | None = None
            approvals = isinstance(policy, PolicyDecider)
            if approvals or settings.pin_tools or settings.pin_prompts or settings.control_open:
                state_db, temp_dir = open_any_state(settings, replica_id)
            admin_digest, admin_file = settings.admin_token_sha256, None
            if settings.control_open and admin_digest is None:
                assert state_db is not None
                admin_file = token_file_for(state_db.path if isinstance(state_db, StateDB) else settings.state_path or STATE_FILE)
                try:
                    admin_digest = ensure_admin_token(admin_file, settings.agent_tokens)
                except AdminTokenProblem as exc:
                    raise StartupProblem(str(exc)) from None
            if approvals:
                assert state_db is not None
                if settings.approval.notify:
                    notifier = ApprovalNotifier(settings.approval.notify, console=settings.control_open)
                engine = build_approval_engine(
                    settings.approval, state_db, guard.append, **approval_keys(settings.shared_state),
                    on_pending=notifier.pending if notifier is not None else None,
                )
                gate = ApprovalGate(
                    engine, elicitation=settings.approval.elicitation, operator_channel=settings.operator_channel,
                    ask_by_link=settings.approval.ask_by_link,
                )
            pin_store, pins = open_pins(state_db, guard.append, TOOLS) if settings.pin_tools else (None, None)
            _, prompt_pins = open_pins(state_db, guard.append, PROMPTS) if settings.pin_prompts else (None, None)
            pipeline = CallPipeline(
                policy=policy, guard=guard, floors=Floors(pins), approvals=gate, call_timeout=settings.call_timeout,
                rate_limits=rate_limiter(settings.rate_limits, state_db),
                result_guards=settings.result_guards,
            )
        except BaseException:
            _close(recorder, state_db, temp_dir, checkpointer, telemetry)
            raise
        return cls(
            settings, policy, recorder, guard, pipeline, state_db, engine, pin_store, pins, checkpointer, telemetry,
            temp_dir, admin_digest, admin_file, replica_id, metrics=metrics, shadow_tally=tally,
            notifier=notifier, prompt_pins=prompt_pins,
        )

    def recent_calls(self) -> RecentCallRing:
        """The ring of each agent's latest decisions the approval view shows, fed from now on by every
        recorded call (only where a control plane can show it: it costs a little on every call)."""
        from drawbridge.control.services import RecentCallRing  # the control plane's, loaded with it

        ring = RecentCallRing()
        self.guard.observers.append(lambda record: recent_call_summary(record, ring))
        return ring

    def guard_catalogue(self, source: CatalogueSource) -> None:
        """Put an upstream's catalogue under the pins (``pin_tools``); nothing without pinning."""
        if self.pins is not None:
            self.pins.add_source(source)

    @property
    def policy_store(self) -> Any:
        return self.policy.store if isinstance(self.policy, PolicyDecider) else None

    async def prepare(self) -> None:
        """What comes before the first call, once: the policy set recorded, and the approvals a previous
        run left expired (``recover_approvals``). Raises ``StartupProblem`` when the state cannot be read
        (a malformed page, a locked file): the command reports it in one line, before its task groups,
        rather than as a traceback. ``run`` calls it when the command did not."""
        if self._prepared:
            return
        self._prepared = True
        if isinstance(self.policy, PolicyDecider):
            store = self.policy.store
            await self.guard.append(POLICY_SET_KIND, {
                "policy_set_digest": store.digest, "files": dict(store.files), "generation": store.generation,
            })
        if self.engine is not None:
            try:
                await recover_approvals(self.engine)
            except StateError as exc:
                raise StartupProblem(f"{exc}; the gateway does not start without its state") from None

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """What runs beside the calls (module docstring); start with ``tg.start`` before any call."""
        await self.prepare()
        async with anyio.create_task_group() as tg:
            await tg.start(self.pipeline.run)
            if isinstance(self.policy, PolicyDecider):
                store = self.policy.store
                tg.start_soon(functools.partial(watch_policies, store, on_reload=self._policy_reloaded))
                if self.policy.shadow is not None:  # reloaded alike, recorded nowhere (``pipeline.shadow``)
                    tg.start_soon(watch_policies, self.policy.shadow)
            if self.engine is not None:
                await tg.start(self._run_approvals)
            if self.notifier is not None:
                await tg.start(self.notifier.run)
            for pins in (self.pins, self.prompt_pins):
                if pins is not None:
                    await tg.start(pins.retry_unavailable, self.pins_changed_elsewhere)
            if isinstance(self.state_db, PostgresDB):
                await tg.start(follow, self.state_db, self.engine, self.pins, self.pins_changed_elsewhere, self.prompt_pins)
            task_status.started()

    async def _policy_reloaded(self, result: ReloadResult) -> None:
        """A hand edit picked up by the watcher, recorded as control-plane edits are: which files changed
        and the policy set's digest before and after (a reload that failed keeps the set: recorded too)."""
        body: dict[str, Any] = {
            "files_changed": list(result.changed), "policy_set_digest_before": result.digest_before,
            "policy_set_digest_after": result.digest_after, "generation": result.generation,
            "loaded": result.ok,
        }
        if result.error is not None:
            body["error"] = str(result.error)
        await self.guard.append(POLICY_RELOAD_KIND, body)

    async def _run_approvals(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        assert self.engine is not None
        await run_approvals(
            self.engine, sweep_seconds=self.settings.approval.sweep_seconds, recover=False, task_status=task_status
        )

    def close(self) -> None:
        """The run is sealed (``run_end`` and a checkpoint covering it), then everything is closed."""
        _close(self.recorder, self.state_db, self._temp_dir, self.checkpointer, self.telemetry)


def _close(
    recorder: Recorder,
    state_db: StateBackend | None,
    temp_dir: str | None,
    checkpointer: Checkpointer | None = None,
    telemetry: Telemetry | None = None,
) -> None:
    if checkpointer is not None:
        checkpointer.end_run()
        checkpointer.close()
    if telemetry is not None:
        telemetry.shutdown()
    close = getattr(recorder, "close", None)
    if close is not None:
        close()
    if state_db is not None:
        state_db.close()
    _remove_temporary(temp_dir)


def _remove_temporary(temp_dir: str | None) -> None:
    if temp_dir is not None:
        import shutil  # with tempfile: bz2 and lzma come with it, which a gateway has no other use for

        shutil.rmtree(temp_dir, ignore_errors=True)


__all__ = [
    "Runtime", "StartupProblem", "load_policy", "load_truth_key", "open_checkpointer", "open_recorder", "open_state",
]
