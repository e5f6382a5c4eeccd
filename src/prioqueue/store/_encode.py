"""A snapshot's JSON text, encoded piece by piece and kept in chunks (private).

The C encoder holds the GIL for a whole ``json.dumps``, and ``"".join`` of a 200 MB text is
one C call too; in the writer thread either stalls the event loop for hundreds of ms. The
store encodes a snapshot item by item and keeps the text in chunks of about a MiB, which the
database joins (``Store._write_snapshot``).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["CHUNK_CHARS", "encode_chunks", "encode_in_pieces"]

#: About how many characters :func:`encode_chunks` puts in one chunk.
CHUNK_CHARS = 1 << 20


def encode_chunks(value: Any, depth: int = 3, size: int | None = None) -> list[str]:
    """:func:`encode_in_pieces`'s text, as chunks of about ``size`` characters (or one item).

    ``size`` defaults to :data:`CHUNK_CHARS`.

    Joining the pieces of a 200 MB text is one C call that holds the GIL for 150-350 ms
    (issue 30); chunks of a MiB are joined in well under a millisecond each, and the store
    has the database concatenate them.

    Raises:
        ValueError: A float is not finite. TypeError: a value is not JSON data.

    Complexity: O(size of the text).
    """
    size = CHUNK_CHARS if size is None else size
    pieces: list[str] = []
    _pieces(value, depth, pieces)
    chunks: list[str] = []
    group: list[str] = []
    length = 0
    for piece in pieces:
        group.append(piece)
        length += len(piece)
        if length >= size:
            chunks.append("".join(group))
            group, length = [], 0
    if group or not chunks:
        chunks.append("".join(group))
    return chunks


def encode_in_pieces(value: Any, depth: int = 3) -> str:
    """``json.dumps(value, allow_nan=False, separators=(",", ":"))``, encoded piece by piece.

    The C encoder holds the GIL for a whole ``dumps``: a 200 MB snapshot encoded in the
    writer thread in one call stalled the event loop for seconds (issue 21). Encoding the
    first ``depth`` levels of lists and dicts item by item lets the loop run between items, so
    the stall is bounded by the largest item (one job record, bounded by the body limit).
    The text is the same as one ``dumps`` call would give.

    Raises:
        ValueError: A float is not finite. TypeError: a value is not JSON data.

    Complexity: O(size of the text), like ``dumps``.
    """
    pieces: list[str] = []
    _pieces(value, depth, pieces)
    return "".join(pieces)  # one copy of the text, not one per level


def _pieces(value: Any, depth: int, out: list[str]) -> None:
    if depth > 0 and type(value) is dict and all(type(key) is str for key in value):
        out.append("{")
        for i, (key, item) in enumerate(value.items()):
            out.append(f"{',' if i else ''}{_dumps(key)}:")
            _pieces(item, depth - 1, out)
        out.append("}")
    elif depth > 0 and type(value) in (list, tuple):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _pieces(item, depth - 1, out)
        out.append("]")
    else:
        out.append(_dumps(value))


def _dumps(value: Any) -> str:
    return json.dumps(value, allow_nan=False, separators=(",", ":"))
