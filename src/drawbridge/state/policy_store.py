"""Hot reload of the policies (shell): one current ``PolicySet``, swapped whole or not at all.

Invariant: ``PolicyStore.current`` is always a fully loaded, valid policy set.
A reload either replaces it in one assignment (readers see the old set or the
new one, never a mix) or, when the new files do not load, keeps it and
reports the ``PolicyLoadError`` that says why. The set and its digest are one
snapshot, swapped together, so ``decide`` names the digest of the very set that
decided, even when a reload lands between two calls.

Theory of operation. ``reload`` takes the files' fingerprint, loads the whole
directory (or file) through ``policy_files``, and swaps. ``watch_policies`` is
an anyio task that polls the fingerprint every ``interval_ms``; a change is
acted on once the fingerprint has been the same for two polls in a row, so a
file caught half-written is not loaded (and if it is, the next change loads
again). A failed attempt is remembered by its fingerprint, so a broken edit
is reported once, not at every poll; the next edit is tried again. The load
runs in a worker thread, so the event loop is not blocked; a lock keeps two
reloads (watcher and control plane) from interleaving.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from drawbridge.policy.evaluate import evaluate
from drawbridge.policy.load import PolicyLoadError, load_policies
from drawbridge.policy.model import Decision, PolicySet
from drawbridge.state.policy_files import (
    Fingerprint,
    fingerprint,
    policy_set_digest,
    read_policy_dir,
    read_policy_path,
    read_source,
)

logger = logging.getLogger("drawbridge.policy")

DEFAULT_INTERVAL_MS = 250


@dataclass(frozen=True, slots=True)
class ReloadResult:
    """What one reload did: ``error`` is None when the new set is in place; the digests of the policy
    set before and after (the same when it failed) and the files added, changed or removed."""

    generation: int
    error: PolicyLoadError | None
    digest_before: str = ""
    digest_after: str = ""
    changed: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None


class PolicyStore:
    """Holds the current policy set for a ``policy_dir`` (or one ``--policy`` file)."""

    kind = "policy"
    """What the log lines call it: ``policy``, or ``shadow policy`` for a shadow set."""

    def __init__(
        self,
        path: Path | str,
        policy_set: PolicySet,
        loaded: Fingerprint | None = None,
        *,
        is_dir: bool | None = None,
    ) -> None:
        self.path = Path(path)
        # Fixed at construction: a policy_dir that disappears is an error, not a file to read.
        self.is_dir = self.path.is_dir() if is_dir is None else is_dir
        self._snapshot: tuple[PolicySet, str] = (policy_set, "")
        self._attempted: Fingerprint | None = loaded
        self._last_error: PolicyLoadError | None = None
        self._generation = 0
        self._lock = threading.Lock()
        self.files: dict[str, str] = {}
        """Each file's digest, by name."""

    @classmethod
    def open(cls, path: Path | str) -> PolicyStore:
        """Load at startup; a ``PolicyLoadError`` here is a startup error."""
        before = fingerprint(path)
        sources = read_policy_path(path)
        store = cls(path, load_policies(sources), before, is_dir=Path(path).is_dir())
        digest, store.files = policy_set_digest(sources)
        store._snapshot = (store.current, digest)
        return store

    @property
    def current(self) -> PolicySet:
        return self._snapshot[0]

    @property
    def digest(self) -> str:
        """The policy set's digest (``policy_files.policy_set_digest``) once loaded from files."""
        return self._snapshot[1]

    @property
    def last_error(self) -> PolicyLoadError | None:
        """The error of the latest reload, or None if it succeeded (or none was tried)."""
        return self._last_error

    @property
    def generation(self) -> int:
        """Counts successful reloads."""
        return self._generation

    @property
    def attempted_fingerprint(self) -> Fingerprint | None:
        return self._attempted

    def evaluate(self, agent: str, tool: str, arguments: Any = None) -> Decision:
        return evaluate(self._snapshot[0], agent, tool, arguments)

    def decide(self, agent: str, tool: str, arguments: Any = None) -> tuple[Decision, str]:
        """The decision and the digest of the policy set that made it (one snapshot: module docstring)."""
        policy_set, digest = self._snapshot
        return evaluate(policy_set, agent, tool, arguments), digest

    def reload(self) -> PolicyLoadError | None:
        """Load the files again; swap on success, keep the previous set and return the error otherwise."""
        return self.reload_result().error

    def reload_result(self) -> ReloadResult:
        """``reload``, saying what changed: the digests before and after and the files that differ."""
        with self._lock:
            before = fingerprint(self.path)
            digest_before, files_before = self.digest, self.files
            try:
                sources = read_policy_dir(self.path) if self.is_dir else [read_source(self.path)]
                new = load_policies(sources)
            except PolicyLoadError as exc:
                self._attempted = before
                self._last_error = exc
                logger.warning("%s reload failed, keeping the previous policies: %s", self.kind, exc)
                return ReloadResult(self._generation, exc, digest_before, digest_before)
            digest, files = policy_set_digest(sources)
            self._snapshot = (new, digest)
            self.files = files
            self._attempted = before
            self._last_error = None
            self._generation += 1
            changed = sorted(name for name in {*files_before, *self.files} if files_before.get(name) != self.files.get(name))
            prefix = "policies" if self.kind == "policy" else f"{self.kind} files"
            logger.info("%s reloaded from %s: %d policies", prefix, self.path, len(new.policies))
            return ReloadResult(self._generation, None, digest_before, self.digest, tuple(changed))


async def watch_policies(
    store: PolicyStore,
    *,
    interval_ms: int = DEFAULT_INTERVAL_MS,
    on_reload: Callable[[ReloadResult], Awaitable[None] | None] | None = None,
) -> None:
    """Poll the store's path and reload on change, forever (cancel the task to stop)."""
    if interval_ms <= 0:
        raise ValueError("interval_ms must be positive")
    interval = interval_ms / 1000
    previous: Fingerprint | None = None
    while True:
        await anyio.sleep(interval)
        try:
            seen = await anyio.to_thread.run_sync(fingerprint, store.path)
            if seen == store.attempted_fingerprint:
                previous = seen
                continue
            if seen != previous:  # still changing: wait until it settles
                previous = seen
                continue
            result = await anyio.to_thread.run_sync(store.reload_result)
            if on_reload is not None:
                told = on_reload(result)
                if told is not None:
                    await told
        except Exception:  # the watcher must outlive any surprise; the current set stays
            logger.exception("policy watcher: unexpected error; keeping the current policies")
