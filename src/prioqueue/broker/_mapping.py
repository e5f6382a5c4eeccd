"""``OwnedMapping``: the read-only mapping face of an owner of records (private, issue 29).

The job book and the worker book read as mappings of their records and change them only
through their own methods: this base gives them the reads, over the dict each keeps in
``_entries``; ``keys``, ``values`` and ``items`` are the dict's own (read-only) views, as
fast as the dict's. Every read is O(1) (iteration O(1) per entry).
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, KeysView, Mapping, ValuesView
from typing import TypeVar, overload

__all__ = ["OwnedMapping"]

_K = TypeVar("_K")
_V = TypeVar("_V")
_T = TypeVar("_T")


class OwnedMapping(Mapping[_K, _V]):
    """A read-only mapping over ``self._entries``, a dict that the subclass owns and changes."""

    _entries: dict[_K, _V]

    def __getitem__(self, key: _K) -> _V:
        """The entry of ``key``. O(1).

        Raises:
            KeyError: No such entry.
        """
        return self._entries[key]

    def __iter__(self) -> Iterator[_K]:
        """The keys, in the order they were added. O(1) per key."""
        return iter(self._entries)

    def __len__(self) -> int:
        """How many entries. O(1)."""
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` has an entry. O(1)."""
        return key in self._entries

    @overload
    def get(self, key: _K, /) -> _V | None: ...

    @overload
    def get(self, key: _K, default: _V | _T, /) -> _V | _T: ...

    def get(self, key: _K, default: object = None, /) -> object:
        """The entry of ``key``, or ``default``. O(1)."""
        return self._entries.get(key, default)

    def keys(self) -> KeysView[_K]:
        """The keys, a live read-only view. O(1)."""
        return self._entries.keys()

    def values(self) -> ValuesView[_V]:
        """The entries, a live read-only view. O(1)."""
        return self._entries.values()

    def items(self) -> ItemsView[_K, _V]:
        """``(key, entry)`` pairs, a live read-only view. O(1)."""
        return self._entries.items()
