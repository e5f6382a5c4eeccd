"""``OwnedMapping``: the read-only mapping face of an owner of records (private, issue 29).

The job book and the worker book read as mappings of their records and change them only
through their own methods: this base gives them the reads, over the dict each keeps in
``_entries``. Every read is O(1) (iteration O(1) per key).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TypeVar

__all__ = ["OwnedMapping"]

_K = TypeVar("_K")
_V = TypeVar("_V")


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
