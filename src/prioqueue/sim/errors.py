"""The simulator's errors (a bad trace row).

A bad option or parameter raises :class:`~prioqueue.ConfigError`; a malformed trace raises its
subclass :class:`TraceError`, which names the file, the line and the column.
"""

from __future__ import annotations

from prioqueue.errors import ConfigError

__all__ = ["TraceError"]


class TraceError(ConfigError):
    """A trace row is malformed.

    Attributes:
        path: The file.
        line: The 1-based line number (the CSV header is line 1).
        column: The column name (and for CSV its 1-based position), or None.
    """

    def __init__(self, path: str, line: int, column: str | None, message: str) -> None:
        where = f"{path}:{line}: " + (f"column {column}: " if column else "")
        super().__init__(where + message)
        self.path = path
        self.line = line
        self.column = column
