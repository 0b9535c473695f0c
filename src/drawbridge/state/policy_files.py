"""Reading policy files from disk (shell: the only part of ``policy`` that does file I/O).

Invariant: every way reading can fail (missing path, unreadable file, bytes
that are not UTF-8) ends in a ``PolicyLoadError`` naming the file, so callers
handle exactly one error type.

Theory of operation. A ``policy_dir`` holds one policy per ``*.yaml`` (or
``*.yml``) file directly inside it. Hidden files (``.name``), other suffixes
(``*.bak`` backups, ``*~`` editor copies) and subdirectories are ignored; a symbolic link with a
policy file's name is always read, so one whose target is missing is a load error, never a policy
silently left out (a hot reload then keeps the previous set).
Files are read as UTF-8 (a leading BOM is dropped) and handed to the pure
loader in ``policy.load``; ``source_file`` is the file's name, as the control
plane and console use it to find the file again.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from drawbridge.canonical import canonical_bytes, sha256_prefixed
from drawbridge.policy.load import PolicyLoadError, PolicySource, load_policies
from drawbridge.policy.model import PolicySet

POLICY_SUFFIXES = (".yaml", ".yml")

Fingerprint = tuple[object, ...]


def is_policy_file_name(name: str) -> bool:
    return not name.startswith(".") and name.endswith(POLICY_SUFFIXES)


def policy_file_names(directory: Path) -> list[str]:
    """Names of the policy files in ``directory``, in code-point order."""
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        raise PolicyLoadError(str(directory), None, "policy directory does not exist") from None
    except NotADirectoryError:
        raise PolicyLoadError(str(directory), None, "not a directory") from None
    except OSError as exc:
        raise PolicyLoadError(str(directory), None, f"cannot list the directory: {exc.strerror}") from None
    names = []
    for entry in entries:
        if is_policy_file_name(entry.name):
            try:
                # A link is the operator's file wherever it points: one whose target is gone (or is not
                # a file) is read, and reported, rather than skipped, which would drop its rules.
                if entry.is_file() or entry.is_symlink():
                    names.append(entry.name)
            except OSError:
                names.append(entry.name)  # let read_source report it
    return sorted(names)


def read_source(path: Path, name: str | None = None) -> PolicySource:
    """One file as a ``PolicySource``; ``name`` (default: the file name) becomes ``source_file``."""
    shown = str(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise PolicyLoadError(shown, None, "file does not exist") from None
    except IsADirectoryError:
        raise PolicyLoadError(shown, None, "is a directory, not a policy file") from None
    except OSError as exc:
        raise PolicyLoadError(shown, None, f"cannot read the file: {exc.strerror}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise PolicyLoadError(shown, line, f"not valid UTF-8 (byte offset {exc.start})") from None
    return PolicySource(name or path.name, text, shown)


def read_policy_dir(directory: Path) -> list[PolicySource]:
    """The directory's policy files, marked as such (an Assay-format file is refused there)."""
    return [replace(read_source(directory / name, name), in_directory=True)
            for name in policy_file_names(directory)]


def load_policy_dir(directory: Path | str) -> PolicySet:
    """Every policy file of a ``policy_dir``, strictly loaded and ordered."""
    return load_policies(read_policy_dir(Path(directory)))


def load_policy_file(path: Path | str) -> PolicySet:
    """One policy file (``--policy FILE``): native, or Assay format."""
    return load_policies([read_source(Path(path))])


def load_policy_path(path: Path | str) -> PolicySet:
    """A directory or a single file, whichever ``path`` is."""
    return load_policies(read_policy_path(path))


def read_policy_path(path: Path | str) -> list[PolicySource]:
    """The sources of a directory or a single file, whichever ``path`` is (as ``load_policy_path``)."""
    p = Path(path)
    if not p.exists():
        raise PolicyLoadError(str(p), None, missing_policy_problem(p))
    return read_policy_dir(p) if p.is_dir() else [read_source(p)]


def missing_policy_problem(path: Path) -> str:
    """What a policy path that does not exist is called: one named ``*.yaml`` or ``*.yml`` was meant as
    a policy file (``policy_file``, ``--policy FILE``), any other as a policy directory."""
    if path.name.endswith(POLICY_SUFFIXES):
        return "policy file does not exist"
    return "policy directory does not exist"


def policy_set_digest(sources: list[PolicySource]) -> tuple[str, dict[str, str]]:
    """The digest of a policy set as loaded: ``sha256:`` of the canonical JSON of each file's name and
    the SHA-256 of its text, and those per-file digests (what a hot reload records as changed)."""
    files = {source.name: sha256_prefixed(source.text.encode("utf-8")) for source in sources}
    return sha256_prefixed(canonical_bytes(files)), files


def fingerprint(path: Path | str) -> Fingerprint:
    """What the watcher compares between polls: names, sizes and times of the policy files."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        return ("missing",)
    if not p.is_dir():
        return ("file", st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)
    files: list[object] = []
    try:
        entries = sorted(os.scandir(p), key=lambda e: e.name)
    except OSError:
        return ("unreadable",)
    for entry in entries:
        if not is_policy_file_name(entry.name):
            continue
        try:
            est = entry.stat()
        except OSError:
            files.append((entry.name, None))
            continue
        files.append((entry.name, est.st_mtime_ns, est.st_ctime_ns, est.st_size, est.st_ino))
    return ("dir", st.st_mtime_ns, tuple(files))
