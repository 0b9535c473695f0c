"""Tool-name patterns of the Assay policy format (evidence-formats.md §2.6).

Invariant: every place that asks "does this declared name pattern cover this
tool?" -- the tool axis, the approval/scope/redaction applicability, the
declared digest's meaning -- asks this one function, so the verdict gate can
never read a policy differently from the reference engine.

Theory of operation. This is not a glob. A pattern without ``*`` is an exact
name. Otherwise only a leading and/or trailing ``*`` is a wildcard:

=============  ========================================================
``*``, ``**``  every name (a star at both ends with nothing between)
``read_*``     prefix (the prefix must be non-empty)
``*_file``     suffix (the suffix must be non-empty)
``*search*``   substring; interior stars stay literal (``*a*b*`` seeks ``a*b``)
``a*b``        exact, asterisk included: an interior star is a literal
=============  ========================================================

The empty pattern matches only the empty name, and ``.`` is an ordinary
character. Compatibility requires keeping the reference's known hazard: an
interior star in a *deny* list silently blocks nothing (7.1 "Patterns"). The
gateway's own policy language does not use this function; it exists so that
verdicts over Assay-format policies agree with Assay's byte for byte.
"""

from __future__ import annotations

__all__ = ["matches_tool_pattern"]


def matches_tool_pattern(pattern: str, name: str) -> bool:
    """Whether ``name`` is covered by the Assay tool pattern ``pattern``.

    Argument order is (pattern, name), the reverse of the reference function's,
    because every caller here reads "pattern matches name".
    """
    if "*" not in pattern:
        return name == pattern
    leading = pattern.startswith("*")
    trailing = pattern.endswith("*")
    if leading and trailing:
        inner = pattern.strip("*")
        return inner == "" or inner in name
    if trailing:
        prefix = pattern.rstrip("*")
        return prefix != "" and name.startswith(prefix)
    if leading:
        suffix = pattern.lstrip("*")
        return suffix != "" and name.endswith(suffix)
    return name == pattern
