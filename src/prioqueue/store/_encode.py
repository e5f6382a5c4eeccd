"""A snapshot's JSON text, encoded piece by piece and kept in chunks (private).

The C encoder holds the GIL for a whole ``json.dumps``, and ``"".join`` of a 200 MB text is
one C call too; in the writer thread either stalls the event loop for hundreds of ms. The
store encodes a snapshot item by item and keeps the text in chunks of about a MiB, which the
database joins (``Store._write_snapshot``).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["CHUNK_CHARS", "SPLIT_ITEMS", "encode_chunks", "encode_in_pieces", "release"]

#: About how many characters :func:`encode_chunks` puts in one chunk.
CHUNK_CHARS = 1 << 20


#: A list or dict with more items than this is encoded item by item at any depth.
SPLIT_ITEMS = 64


class _Chunks:
    """Pieces of text, joined into chunks of about ``size`` characters as they come."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.chunks: list[str] = []
        self._group: list[str] = []
        self._length = 0

    def append(self, piece: str) -> None:
        self._group.append(piece)
        self._length += len(piece)
        if self._length >= self.size:
            self.chunks.append("".join(self._group))
            self._group, self._length = [], 0

    def done(self) -> list[str]:
        if self._group or not self.chunks:
            self.chunks.append("".join(self._group))
            self._group, self._length = [], 0
        return self.chunks


def encode_chunks(value: Any, depth: int = 1, size: int | None = None) -> list[str]:
    """:func:`encode_in_pieces`'s text, as chunks of about ``size`` characters (or one item).

    ``size`` defaults to :data:`CHUNK_CHARS`.

    Joining the pieces of a 200 MB text is one C call that holds the GIL for 150-350 ms
    (issue 30); chunks of a MiB are joined in well under a millisecond each, and the store
    has the database concatenate them.

    Raises:
        ValueError: A float is not finite. TypeError: a value is not JSON data.

    Complexity: O(size of the text).
    """
    out = _Chunks(CHUNK_CHARS if size is None else size)
    _pieces(value, depth, out)
    return out.done()


def encode_in_pieces(value: Any, depth: int = 1) -> str:
    """``json.dumps(value, allow_nan=False, separators=(",", ":"))``, encoded piece by piece.

    The C encoder holds the GIL for a whole ``dumps``: a 200 MB snapshot encoded in the
    writer thread in one call stalled the event loop for seconds (issue 21). The first
    ``depth`` levels of lists and dicts, and below them any list or dict of more than
    :data:`SPLIT_ITEMS` items or holding one (the fleet's 10^5 queued jobs are three levels
    down), are encoded item by item: only short containers go to ``dumps`` whole, so the
    loop runs between items and the stall is bounded by the largest of those (a job record
    with its payload, bounded by the body limit). The text is the same as one ``dumps`` call
    would give.

    Raises:
        ValueError: A float is not finite. TypeError: a value is not JSON data.

    Complexity: O(size of the text), like ``dumps``.
    """
    pieces: list[str] = []
    _pieces(value, depth, pieces)
    return "".join(pieces)  # one copy of the text, not one per level


def _pieces(value: Any, depth: int, out: list[str] | _Chunks) -> None:
    kind = type(value)
    split = depth > 0 or (kind in _CONTAINERS and _large(value))
    if split and kind is dict and all(type(key) is str for key in value):
        out.append("{")
        for i, (key, item) in enumerate(value.items()):
            out.append(f"{',' if i else ''}{_dumps(key)}:")
            _pieces(item, depth - 1, out)
        out.append("}")
    elif split and kind in (list, tuple):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _pieces(item, depth - 1, out)
        out.append("]")
    else:
        out.append(_dumps(value))


_CONTAINERS = (dict, list, tuple)


def release(box: list[Any]) -> None:
    """Free what ``box`` alone holds a few hundred items at a time, without changing any of it.

    Dropping the last reference to a snapshot frees its whole tree in one step that holds
    the GIL (about 40 ms for 20,000 broker jobs). Instead, references to the items of its
    large containers are held aside, ``box`` is emptied (freeing only the containers'
    shells), then the held items are dropped in slices. Nothing is mutated, so a container
    the snapshot shares with its owner is safe; the caller must hold no other reference.
    Complexity: O(containers walked).
    """
    held: list[Any] = []
    for value in (v for v in box if type(v) in _CONTAINERS):
        _hold(value, held, 2)
    box.clear()
    while held:
        del held[-256:]


def _hold(value: Any, held: list[Any], levels: int) -> None:
    # Items of large containers up to ``levels`` below the top (the fleet's queued jobs are
    # two below it): each then frees one record's small tree.
    items = value.values() if type(value) is dict else value
    if len(value) > SPLIT_ITEMS:
        held.extend(items)
    if levels:
        for item in items:
            if type(item) in _CONTAINERS:
                _hold(item, held, levels - 1)


def _large(value: Any, levels: int = 4) -> bool:
    """Whether a container has many items, or holds one that has (``levels`` deep)."""
    if len(value) > SPLIT_ITEMS:
        return True
    if levels == 0:
        return False
    items = value.values() if type(value) is dict else value
    return any(type(item) in _CONTAINERS and _large(item, levels - 1) for item in items)


# One encoder for every piece: json.dumps with options builds a new one per call.
_dumps = json.JSONEncoder(allow_nan=False, separators=(",", ":")).encode
