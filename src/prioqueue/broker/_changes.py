"""``Changes``: the hub that wakes a long poll only for what concerns it (private).

The model and its invariants are docs/design/long-poll.md ("Waking"). In short:

* A **job waiter** (``GET /v1/jobs/{id}?wait=S``) is filed under its job's id and woken when
  that job finishes (the engine's ``Changed.finished``).
* A **pop waiter** is filed under each model it serves (or under "any model"), under its
  resident model and under its worker. A job that becomes takeable (``Changed.queued``, with
  its model) is a **wake-up** offered to *one* waiter that could take it: a warm one (its
  resident model) first, then the longest asleep. A woken waiter leaves the index until it
  sleeps again, so a second job wakes a second waiter. A waiter hands its wake-ups on
  (:meth:`Changes.hand_on`) when it is granted a job (the job it took may be another one) or
  when it goes away (time out, client gone); it drops them when its pop found nothing for a
  reason every such waiter shares (then a later change offers the job again).
* A worker whose running job ended (``Changed.freed``) wakes its own waiters (their slots);
  with ``max_running_per_member`` it also offers one wake-up to each model's waiters (the
  member's other jobs may be takeable now), and so does a delayed job's release.
* :meth:`Changes.fire` wakes every waiter (stepping down; tests), :meth:`Changes.drain` for
  good (SIGTERM).

Everything runs on the broker's event loop; each method's cost is given in its docstring.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable

from prioqueue.broker._state import Changed

__all__ = ["ANY", "Changes", "PopWaiter"]

ANY = "\x00any"
"""A wake-up for the waiters that serve every model (a member's jobs of unknown model)."""

_Index = dict["PopWaiter", None]  # insertion-ordered: the longest asleep first


class PopWaiter:
    """One waiting pop: what it can take, its wake-ups, its future while it sleeps.

    Args:
        worker: The worker's name.
        models: The models it serves (None: every model).
        resident: The model it has loaded (None: none).
    """

    __slots__ = ("filed", "future", "models", "nudged", "resident", "tokens", "worker")

    def __init__(self, worker: str, models: Iterable[str] | None, resident: str | None) -> None:
        self.worker = worker
        self.models = None if models is None else tuple(dict.fromkeys(models))
        self.resident = resident
        self.tokens: list[str | None] = []
        """The wake-ups it holds: the model of each job offered to it (None: no model)."""
        self.future: asyncio.Future[None] | None = None
        self.filed = False
        """Whether it is in the model indexes (asleep or trying, not woken)."""
        self.nudged = False
        """Woken without a wake-up (its worker's job ended, the role changed): try again."""

    def take_tokens(self, into: list[str | None]) -> None:
        """Move its wake-ups to ``into`` and forget a nudge: it is about to try. O(tokens)."""
        into.extend(self.tokens)
        self.tokens.clear()
        self.nudged = False

    def sleep(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        """The future it sleeps on until woken (:meth:`woke` after). O(1)."""
        self.future = loop.create_future()
        return self.future

    def woke(self) -> None:
        """It no longer sleeps (woken, timed out or cancelled). O(1)."""
        self.future = None

    def serves(self, model: str | None) -> bool:
        """Whether it could take a job of ``model`` (a job without one runs anywhere). O(1)."""
        return model is None or self.models is None or model in self.models


def _add(index: dict[str, _Index], key: str, waiter: PopWaiter) -> None:
    index.setdefault(key, {})[waiter] = None


def _remove(index: dict[str, _Index], key: str, waiter: PopWaiter) -> None:
    group = index.get(key)
    if group is not None:
        group.pop(waiter, None)
        if not group:
            del index[key]


def _first(group: _Index | None) -> PopWaiter | None:
    return None if not group else next(iter(group))


class Changes:
    """Wakes long polls: job waiters by job id, pop waiters by what they can take.

    Args:
        member_cap: Whether ``max_running_per_member`` is set (a running job that ends may
            make its member's other jobs takeable).
    """

    def __init__(self, *, member_cap: bool = False) -> None:
        self.member_cap = member_cap
        self.draining = False
        """True once the broker is stopping: waiters answer at once."""
        self.waiting: dict[str, int] = {}
        """Workers in a long poll now (name -> open pops)."""
        self.refreshing: asyncio.Future[None] | None = None
        """The liveness refresh in flight, if any (one at a time for the whole fleet)."""
        self.jobs: dict[str, dict[asyncio.Future[None], None]] = {}
        """Job id -> the futures of its waiters."""
        self.by_model: dict[str, _Index] = {}
        self.any_model: _Index = {}
        self.everyone: _Index = {}
        self.by_resident: dict[str, _Index] = {}
        self.by_worker: dict[str, _Index] = {}
        self.fired = 0
        """How many times :meth:`fire` woke everyone (diagnostics, tests)."""
        self.woken = 0
        """Waiters woken so far, pop and job (tests count them: a change wakes only its own)."""
        self.dropped = 0
        """Wake-ups that found no waiter, or were dropped by a waiter that found nothing."""
        self._next: asyncio.Future[None] | None = None

    def token(self) -> asyncio.Future[None]:
        """A future the next applied operation (or :meth:`fire`) resolves (tests). O(1)."""
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
        return self._next

    def _resolve_next(self) -> None:
        future, self._next = self._next, None
        if future is not None and not future.done():
            future.set_result(None)

    # ------------------------------------------------------------------ job waiters

    def watch_job(self, job_id: str) -> asyncio.Future[None]:
        """A future resolved when ``job_id`` finishes (take it before reading). O(1)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.jobs.setdefault(job_id, {})[future] = None
        return future

    def unwatch_job(self, job_id: str, future: asyncio.Future[None]) -> None:
        """Forget a job waiter's future. O(1)."""
        futures = self.jobs.get(job_id)
        if futures is not None:
            futures.pop(future, None)
            if not futures:
                del self.jobs[job_id]

    def _wake_job(self, job_id: str) -> None:
        for future in self.jobs.pop(job_id, ()):
            if not future.done():
                self.woken += 1
                future.set_result(None)

    # ------------------------------------------------------------------ pop waiters

    def file(self, waiter: PopWaiter, *, full: bool = False) -> None:
        """Index ``waiter`` (asleep or about to try). O(models).

        ``full``: its slots are full, so only its own worker's news concerns it (it stays
        out of the model indexes).
        """
        self.by_worker.setdefault(waiter.worker, {})[waiter] = None
        if full or waiter.filed:
            return
        waiter.filed = True
        self.everyone[waiter] = None
        if waiter.models is None:
            self.any_model[waiter] = None
        else:
            for model in waiter.models:
                _add(self.by_model, model, waiter)
        if waiter.resident is not None:
            _add(self.by_resident, waiter.resident, waiter)

    def unfile(self, waiter: PopWaiter, *, worker_too: bool = True) -> None:
        """Take ``waiter`` out of the model indexes (and its worker's). O(models)."""
        if worker_too:
            _remove(self.by_worker, waiter.worker, waiter)
        if not waiter.filed:
            return
        waiter.filed = False
        self.everyone.pop(waiter, None)
        if waiter.models is None:
            self.any_model.pop(waiter, None)
        else:
            for model in waiter.models:
                _remove(self.by_model, model, waiter)
        if waiter.resident is not None:
            _remove(self.by_resident, waiter.resident, waiter)

    def _wake_pop(self, waiter: PopWaiter, token: str | None, counted: bool) -> None:
        if counted:
            waiter.tokens.append(token)
        else:
            waiter.nudged = True
        self.unfile(waiter)
        future = waiter.future
        if future is not None and not future.done():
            self.woken += 1
            future.set_result(None)

    def nudge(self, waiter: PopWaiter) -> None:
        """Wake ``waiter`` without a wake-up (its client left, say). O(models)."""
        self._wake_pop(waiter, None, counted=False)

    def _candidate(self, model: str | None) -> PopWaiter | None:
        if model is None:
            return _first(self.everyone)
        if model == ANY:
            return _first(self.any_model)
        warm = _first(self.by_resident.get(model))
        if warm is not None and warm.serves(model):
            return warm
        return _first(self.by_model.get(model)) or _first(self.any_model)

    def offer(self, model: str | None) -> bool:
        """Offer one wake-up for a takeable job of ``model`` to one waiter that could take it.

        Returns whether a waiter got it (else nobody waits for it: the next pop finds the
        job). O(models of the waiter woken).
        """
        waiter = self._candidate(model)
        if waiter is None:
            self.dropped += 1
            return False
        self._wake_pop(waiter, model, counted=True)
        return True

    def drop(self, count: int) -> None:
        """A waiter that found nothing dropped ``count`` wake-ups (counted). O(1)."""
        self.dropped += count

    async def refresh(self, worker: str, journal: Callable[[list[str]], Awaitable[object]]) -> None:
        """Journal the liveness of every waiting worker (and ``worker``) in one event.

        One refresh at a time for the whole fleet: a call while one is in flight waits for
        it instead. ``journal`` runs the operation with the sorted worker names.
        """
        if self.refreshing is not None:
            await asyncio.wait([self.refreshing])
            return
        done = self.refreshing = asyncio.get_running_loop().create_future()
        try:
            await journal(sorted({*self.waiting, worker}))
        finally:
            self.refreshing = None
            done.set_result(None)

    def hand_on(self, tokens: Iterable[str | None]) -> None:
        """Offer wake-ups a waiter held but did not use up to other waiters. O(tokens)."""
        for model in tokens:
            self.offer(model)

    def offer_everywhere(self) -> None:
        """One wake-up per model served, and one for the any-model waiters. O(models)."""
        for model in list(self.by_model):
            self.offer(model)
        if self.any_model:
            self.offer(ANY)

    # ------------------------------------------------------------------ the engine's news

    def changed(self, notes: Changed) -> None:
        """The engine applied an operation: wake the waiters its notes concern.

        Complexity: O(notes + waiters woken x their models), plus O(models served) for a
        release, or a running job's end with ``member_cap``.
        """
        if self._next is not None:
            self._resolve_next()
        for job_id in notes.finished:
            if job_id in self.jobs:
                self._wake_job(job_id)
        everywhere = notes.released
        for worker, _member in notes.freed:
            for waiter in list(self.by_worker.get(worker, ())):
                self._wake_pop(waiter, None, counted=False)
            everywhere = everywhere or self.member_cap
        for model in notes.queued:
            self.offer(model)
        if everywhere:
            self.offer_everywhere()

    def fire(self) -> None:
        """Wake every waiter (the role changed: stepping down, stopping). O(waiters)."""
        self.fired += 1
        self._resolve_next()
        for job_id in list(self.jobs):
            self._wake_job(job_id)
        for group in list(self.by_worker.values()):
            for waiter in list(group):
                self._wake_pop(waiter, None, counted=False)

    def drain(self) -> None:
        """The broker is stopping: wake every waiter and let none wait again."""
        self.draining = True
        self.fire()

    @property
    def sleeping(self) -> int:
        """Requests asleep now, pops and job reads (tests wait for them to park). O(jobs)."""
        pops = sum(
            1
            for group in self.by_worker.values()
            for w in group
            if w.future is not None and not w.future.done()
        )
        return pops + sum(len(futures) for futures in self.jobs.values())
