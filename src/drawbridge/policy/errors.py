"""The one error every way of loading a policy ends in: ``PolicyLoadError``, located ``file:line: problem``.

It lives apart from the loaders so that the native loader (``load``) and the Assay-format converter
(``assay``), which call each other's work, both raise it without importing each other.
"""

from __future__ import annotations

from typing import Any


class PolicyLoadError(ValueError):
    """A policy that cannot be loaded. ``str()`` is ``file:line: problem``."""

    def __init__(self, file: str, line: int | None, problem: str) -> None:
        self.file = file
        self.line = line
        self.problem = problem
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.line is None:
            return f"{self.file}: {self.problem}"
        return f"{self.file}:{self.line}: {self.problem}"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.file, self.line, self.problem))
