"""The workers owner: the fleet's workers, their held jobs and lease deadlines.

Theory of operation (docs/design/state.md, "Owners"):

* ``Workers`` owns the joined workers (``_workers._Worker``, by name, each with its resident
  model), the live count (workers joined and not timed out), the number of held entries, the
  live workers by last word (``SeenOrder``, for the earliest worker timeout) and the held
  entries' lease deadlines (a lazy heap of ``items.Deadline``).
* Its fields are private; reads are properties returning the live structures as read-only
  types (``Mapping``), never copies: the hot paths read them. Every change is one of its
  methods; ``check`` asserts its invariant.
* It knows nothing of lanes: ``Core.hand_over`` and ``Core.release`` pair its ``take`` and
  ``let_go`` with the lane's charge.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from heapq import heappop, heappush
from typing import Any

from prioqueue._core.items import Deadline, new_item, read_only
from prioqueue._lanes import RUNNING, _Entry
from prioqueue._workers import SeenOrder, _Worker
from prioqueue.errors import UnknownWorker

__all__: list[str] = []  # private module


class Workers:
    """The workers, their held count and lease deadlines (private)."""

    __slots__ = ("_by_name", "_deadlines", "_held", "_live", "_seen_order")

    def __init__(self) -> None:
        self._by_name: dict[str, _Worker] = {}
        self._seen_order = SeenOrder()  # the live workers by last word (worker timeouts)
        self._live = 0  # workers joined and not timed out
        self._held = 0  # entries held by workers
        self._deadlines: list[Deadline] = []  # held entries with a lease (lazy deletion)

    # ------------------------------------------------------------------ reads

    by_name: Mapping[str, _Worker] = read_only(
        "_by_name", "The joined workers by name (the live map, read-only). O(1)."
    )
    live: int = read_only("_live", "The workers joined and not timed out. O(1).")
    held: int = read_only("_held", "The entries held by workers. O(1).")

    def worker_of(self, name: object) -> _Worker:
        """A joined worker; ``UnknownWorker`` otherwise. O(1)."""
        worker = self._by_name.get(name) if isinstance(name, str) else None
        if worker is None:
            raise UnknownWorker(f"worker {name!r} has not joined (or it left); join() it first")
        return worker

    def held_entries(self) -> list[_Entry]:
        """Every held entry, by grant time, then submission. O(h log h)."""
        return sorted(
            (e for w in self._by_name.values() for e in w.held),
            key=lambda e: (e.granted_at, e.job.seq),
        )

    def oldest_seen(self) -> float | None:
        """The least recent last word of a live worker, or None. Amortised O(log n)."""
        return self._seen_order.oldest(self._by_name)

    def next_lease(self) -> float | None:
        """The earliest lease deadline of a held entry, or None (drops stale items)."""
        deadlines = self._deadlines
        while deadlines and deadlines[0].entry.state != RUNNING:
            heappop(deadlines)
        return deadlines[0].deadline if deadlines else None

    # ------------------------------------------------------------------ membership

    def add(self, name: str, t: float) -> _Worker:
        """A worker joins (it counts in the capacity at once)."""
        worker = self._by_name[name] = _Worker(name, t)
        self._seen_order.push(worker)
        self._live += 1
        return worker

    def remove(self, worker: _Worker) -> None:
        """A worker that holds nothing leaves."""
        if not worker.timed_out:
            self._live -= 1
        del self._by_name[worker.name]

    def seen(self, worker: _Worker, t: float) -> None:
        """Mark the worker heard from at ``t``, reviving it when it had timed out."""
        worker.heard(t)
        if worker.timed_out:
            worker.set_timed_out(False)
            self._seen_order.push(worker)
            self._live += 1

    def time_out_silent(self, t: float, timeout: float) -> list[_Worker]:
        """Time out the live workers silent for ``timeout`` at ``t`` (their jobs stay held).

        Returns them, in join order. O(workers).
        """
        silent = []
        for worker in self._by_name.values():
            if not worker.timed_out and worker.last_seen + timeout <= t:
                worker.set_timed_out(True)
                self._live -= 1
                silent.append(worker)
        return silent

    def set_resident(self, worker: _Worker, model: str | None) -> None:
        """Change the model a worker has loaded."""
        if worker.resident != model:
            worker.load(model)

    # ------------------------------------------------------------------ held jobs

    def take(self, entry: _Entry, worker: _Worker, t: float) -> bool:
        """The worker takes a granted entry at ``t``, loading its model; True on a swap."""
        self._held += 1
        worker.take(entry, t)
        swapped = False
        model = entry.grant.job.model  # a multi-model job's: the grant's choice
        resident = worker.resident
        if model is not None and model != resident:  # that is, ``grant.swap``
            worker.load(model)
            swapped = True
        lease = entry.grant.lease
        if lease is not None:
            heappush(
                self._deadlines,
                new_item(Deadline, (lease.deadline, entry.job.seq, id(entry), entry)),
            )
        return swapped

    def let_go(self, entry: _Entry) -> None:
        """The entry's worker no longer holds it."""
        self._held -= 1
        entry.worker.let_go(entry)

    def due_leases(self, t: float) -> Iterator[tuple[float, int, _Entry]]:
        """Pop the lease deadlines due at ``t``: ``(deadline, id(entry), entry)`` of held ones."""
        deadlines = self._deadlines
        while deadlines and deadlines[0].deadline <= t:
            deadline, _, key, entry = heappop(deadlines)
            if entry.state == RUNNING:
                yield deadline, key, entry

    def order_held(self, key: Callable[[_Entry], Any]) -> None:
        """Sort every worker's held entries by ``key`` (a snapshot's grant order)."""
        for worker in self._by_name.values():
            worker.order_held(key)

    # ------------------------------------------------------------------ restore

    def restore(self, worker: _Worker) -> None:
        """File a worker rebuilt from a snapshot (a timed-out one stays out of the capacity)."""
        self._by_name[worker.name] = worker
        if not worker.timed_out:
            self._seen_order.push(worker)
            self._live += 1

    def keep(self, entry: _Entry) -> None:
        """File a held entry rebuilt from a snapshot on its worker, with its lease deadline."""
        self._held += 1
        entry.worker.keep(entry)
        lease = entry.grant.lease
        if lease is not None:
            self._deadlines.append(Deadline(lease.deadline, entry.job.seq, id(entry), entry))
            self._deadlines.sort(key=lambda item: (item.deadline, item.seq, item.key))

    # ------------------------------------------------------------------ invariant

    def check(self, held: list[_Entry]) -> None:
        """Assert the owner's invariant against the held entries (for tests; O(n))."""
        assert len(held) == self._held
        workers = self._by_name.values()
        assert sorted(map(id, held)) == sorted(id(e) for w in workers for e in w.held)
        for worker in workers:
            worker.check()
        assert self._live == sum(not w.timed_out for w in workers)
        ids = set(map(id, held))
        assert all(id(item.entry) in ids for item in self._deadlines if item.entry.state == RUNNING)
