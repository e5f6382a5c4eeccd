"""``Worker``: a GPU host's loop over the broker, with long-poll pops and heartbeats.

Theory of operation
-------------------
* **Pop** long-polls (``?wait=``): the broker answers when a job this worker may take is
  granted to it, so an idle worker costs one open request and writes nothing.
* **Heartbeats** run in a background thread while the worker holds a job (every
  ``heartbeat_interval`` seconds, at most a quarter of the job's lease). Each answer lists
  the jobs the broker says this worker holds; a held job missing from it was taken back,
  and is marked lost.
* **Lost jobs**: ``complete``/``fail`` answered 409 (or a heartbeat that no longer lists the
  job) raise or mark :class:`~prioqueue.client.JobLost`; the handler checks ``job.lost`` or
  calls ``job.check()`` before a side effect that must not happen twice.
* **Lost answers**: a ``complete`` whose first try may have landed (a retry after a transport
  error) and that is then answered "the job is done" has succeeded. A pop whose answer was
  lost leaves a job granted to this worker that it never saw; the first idle pop after a
  retried pop (or after a restart) asks a heartbeat, which lists it, and the worker hands it
  back with ``leave``. Only then: ``slots_full`` otherwise means another process of that name.
* **Stopping**: the first SIGTERM or SIGINT (Ctrl-C) stops popping, lets the job in hand
  finish and reports it, then ``leave``; a second one interrupts the handler and hands the
  job back with ``leave``. A pop in flight is abandoned (its connection closed); a job the
  broker grants it in the race is handed back: one that arrived is not started, and since a
  broker may still grant to an abandoned long poll until its ``wait`` runs out, the stopping
  worker watches (a heartbeat per ``ABANDONED_POLL_CHECK`` seconds) until then and hands back
  what it is granted; it stops sooner once a heartbeat says that no poll of it waits in the
  broker any more (``X-Prioqueue-Waiting: 0``, at least ``ABANDONED_POLL_SLACK`` seconds
  after the poll was abandoned). A second signal skips that watch.
* **Leases** are measured on the worker's own monotonic ``clock``: :attr:`Job.expires_at` is
  when the pop's answer arrived plus the lease's seconds, whatever the broker's clock says.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import FrameType
from typing import Any

import httpx

from prioqueue.client._http import SyncTransport, raise_for
from prioqueue.client.errors import BrokerError, BrokerUnavailable, JobLost
from prioqueue.client.job import Job
from prioqueue.clock import SYSTEM_CLOCK

__all__ = ["Job", "Worker"]

_log = logging.getLogger("prioqueue.client")

LEAVE_BUDGET = 10.0
"""Seconds ``leave`` retries an unreachable broker (a stopping worker must not hang)."""
ABANDONED_POLL_CHECK = 0.5
"""Seconds between the checks of a stopping worker for a grant to its abandoned long poll."""
ABANDONED_POLL_SLACK = 1.0
"""Seconds added to an abandoned poll's wait for the way to the broker and its answer."""
SHARED_NAME = "worker %s: its slots are full, this process holds nothing: is its name shared?"
"""Logged, instead of handing the jobs back: they may be another live process's."""


class _Interrupted(BaseException):
    """Raised from the signal handler to abandon a blocking pop (or, twice, a handler)."""


Handler = Callable[[Job], Any]


class Worker:
    """A worker of the fleet: pops jobs, keeps their leases alive, reports, leaves.

    Use ``for job in worker.jobs(): ...; job.complete(result)`` or
    ``worker.run(handler)`` (the handler's return value is the result; an exception fails
    the job with its text).

    Args:
        url: The broker's URL(s) (several replicas separated by commas).
        key: A worker API key.
        name: This worker's name (unique in the fleet).
        models: The models it serves (None: every model).
        resident: The model loaded now; updated to each job's model when it takes one.
        slots: Jobs it may hold at once (``run`` runs that many handlers in threads).
        slow: An extra-slow worker (its leases are 3x).
        wait: Seconds of one long-poll pop (0..60).
        heartbeat_interval: Seconds between heartbeats while a job is held (at most a
            quarter of the job's lease is used).
        timeout: Seconds for one request.
        retry_timeout: Seconds the retries of one call may take (a broker restart, a
            failover) before :class:`BrokerUnavailable`.
        handle_signals: Install SIGTERM/SIGINT handlers during ``jobs``/``run`` (main
            thread only).
        client: An ``httpx.Client`` to send with (tests).
        clock: Monotonic seconds, for the leases and the stop (tests inject their own).

    Raises:
        ValueError: An argument is out of range.
    """

    def __init__(
        self,
        url: str | Sequence[str],
        key: str,
        name: str,
        *,
        models: Sequence[str] | None = None,
        resident: str | None = None,
        slots: int = 1,
        slow: bool = False,
        wait: float = 30.0,
        heartbeat_interval: float = 15.0,
        timeout: float = 10.0,
        retry_timeout: float = 300.0,
        handle_signals: bool = True,
        client: httpx.Client | None = None,
        clock: Callable[[], float] = SYSTEM_CLOCK.monotonic,
    ) -> None:
        if not name or "/" in name:
            raise ValueError(f"worker name must be non-empty without '/', got {name!r}")
        if not isinstance(slots, int) or not 1 <= slots <= 16:
            raise ValueError(f"slots must be an int in 1..16, got {slots!r}")
        if not 0 <= wait <= 60:
            raise ValueError(f"wait must be within 0..60 seconds, got {wait!r}")
        if not heartbeat_interval > 0:
            raise ValueError(f"heartbeat_interval must be > 0, got {heartbeat_interval!r}")
        self._http = SyncTransport(
            url, key, timeout=timeout, retry_timeout=retry_timeout, client=client
        )
        self.name = name
        self.models = None if models is None else list(models)
        self.resident = resident
        self.slots = slots
        self.slow = slow
        self.wait = float(wait)
        self.heartbeat_interval = float(heartbeat_interval)
        self.handle_signals = handle_signals
        self.clock = clock
        self._abandoned_until: float | None = None
        self._abandoned_at = 0.0
        self._held: dict[str, Job] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._signals = 0
        self._in_pop = False
        self._beat_stop = threading.Event()
        self._beat: threading.Thread | None = None
        self._orphans_checked = True

    # ------------------------------------------------------------------ public

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` (or a signal) asked the loop to end."""
        return self._stopping.is_set()

    def stop(self) -> None:
        """Stop popping; ``jobs``/``run`` end after the job in hand, then leave. Thread-safe."""
        self._stopping.set()

    def held(self) -> list[Job]:
        """The jobs this worker holds now."""
        with self._lock:
            return list(self._held.values())

    def pop(self, wait: float | None = None) -> Job | None:
        """Ask for a job, long-polling up to ``wait`` seconds (default: the worker's).

        Returns:
            The job, or None when none came in time.

        Raises:
            BrokerError: The broker refused the worker's settings (422).
            BrokerUnavailable: No broker answered in time.
        """
        seconds = self.wait if wait is None else wait
        body = {"models": self.models, "resident": self.resident, "slots": self.slots}
        if self.slow:
            body["slow"] = True
        retried: list[bool] = []
        self._in_pop = True
        sent = self.clock()
        try:
            response = self._http.request(
                "POST", f"/v1/workers/{self.name}/pop", json=body,
                params={"wait": seconds}, wait=seconds, retried=retried,
            )  # fmt: skip
        except _Interrupted:
            # The broker may grant to this poll until its wait runs out (see _shutdown); a
            # retried poll began after ``sent``, at the latest now.
            began = self.clock() if retried else sent
            self._abandoned_until = began + seconds + ABANDONED_POLL_SLACK
            self._abandoned_at = self.clock()
            raise
        finally:
            self._in_pop = False
        received = self.clock()
        if retried:
            self._orphans_checked = False  # a grant's answer may have been lost
        if response.status_code == 204:
            idle = response.headers.get("x-prioqueue-idle", "")
            if not self._orphans_checked:  # first idle pop, or one after a retried pop
                self._hand_back_orphans()
            elif "slots_full" in idle and not self.held():  # not a lost grant: no leave
                _log.warning(SHARED_NAME, self.name)
            return None
        raise_for(response)
        job = Job(self, response.json(), received_at=received)
        with self._lock:
            self._held[job.id] = job
        if job.model is not None:
            self.resident = job.model
        self._start_heartbeats()
        return job

    def jobs(self) -> Generator[Job, None, None]:
        """Yield jobs as they are granted until :meth:`stop` or a signal; then leave.

        Complete (or fail) each job before asking for the next: one left unreported is
        failed with a note when the loop moves on.

        Raises:
            BrokerError: A refusal that retrying cannot fix.
            BrokerUnavailable: No broker answered within ``retry_timeout``.
        """
        with self._signal_handlers():
            try:
                while not self.stopping:
                    try:
                        job = self.pop()
                    except _Interrupted:
                        break
                    if job is None:
                        continue
                    if self._stopping.is_set():
                        break  # granted as the signal came: leave() hands it back
                    try:
                        yield job
                    finally:
                        self._unreported(job)
            finally:
                self._shutdown()

    def run(self, handler: Handler) -> None:
        """Run ``handler(job)`` on each job until stopped; its return value is the result.

        An exception fails the job (``{"error": "Type: text"}``); :class:`JobLost` inside
        the handler just ends it. With ``slots > 1`` up to ``slots`` handlers run at once in
        threads.

        Raises:
            BrokerError: A refusal that retrying cannot fix.
            BrokerUnavailable: No broker answered within ``retry_timeout``.
        """
        if self.slots == 1:
            jobs = self.jobs()
            try:
                for job in jobs:
                    self._handle(handler, job)
            except _Interrupted:  # a second signal: the job in hand is handed back
                pass
            finally:
                jobs.close()
            return
        free = threading.Semaphore(self.slots)
        with self._signal_handlers(), ThreadPoolExecutor(self.slots) as pool:
            try:
                while not self.stopping:
                    if not free.acquire(timeout=0.5):
                        continue
                    try:
                        granted = self.pop()
                    except _Interrupted:
                        free.release()
                        break
                    except BaseException:
                        free.release()
                        raise
                    if granted is None or self._stopping.is_set():
                        free.release()
                        if self._stopping.is_set():
                            break  # granted as the signal came: leave() hands it back
                        continue
                    future = pool.submit(self._handle, handler, granted)
                    future.add_done_callback(lambda _f: free.release())
                pool.shutdown(wait=True)
            finally:
                self._shutdown()

    def leave(self) -> list[str]:
        """Leave the fleet: the broker requeues every job this worker holds.

        Returns:
            The ids of the jobs handed back.
        """
        try:
            response = self._http.request(
                "POST", f"/v1/workers/{self.name}/leave", budget=LEAVE_BUDGET
            )
        except BrokerUnavailable:
            _log.warning("worker %s: could not leave (no broker); leases will expire", self.name)
            return []
        with self._lock:
            lost = list(self._held.values())
            self._held.clear()
        for job in lost:
            job.taken_back()
        if response.status_code == 404:
            return []
        raise_for(response)
        requeued: list[str] = response.json()["requeued"]
        return requeued

    def close(self) -> None:
        """Stop the heartbeats and close the connections."""
        self._beat_stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
        self._http.close()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _finish(self, job: Job, op: str, extra: dict[str, Any]) -> None:
        if job.finished:
            raise RuntimeError(f"job {job.id!r} was already reported")
        body = {"worker": self.name, "attempt": job.attempt, **extra}
        retried: list[bool] = []
        response = self._http.request("POST", f"/v1/jobs/{job.id}/{op}", json=body, retried=retried)
        landed = "is done" if op == "complete" else "is failed"
        if response.status_code == 409 and retried and landed in response.text:
            pass  # an earlier try landed; only its answer was lost
        elif response.status_code in (404, 409):
            self._drop(job, lost=True)
            try:
                raise_for(response)
            except BrokerError as exc:
                raise JobLost(exc.status, f"job {job.id!r} was taken back: {exc}") from None
        else:
            raise_for(response)
        job.accepted()
        self._drop(job, lost=False)

    def _drop(self, job: Job, *, lost: bool) -> None:
        with self._lock:
            self._held.pop(job.id, None)
        if lost:
            job.taken_back()

    def _unreported(self, job: Job) -> None:
        if job.finished or job.lost or self._signals > 1:
            return  # reported, lost, or interrupted: leave() hands it back
        with contextlib.suppress(JobLost, BrokerError):
            job.fail("the worker moved on without reporting the job")

    def _handle(self, handler: Handler, job: Job) -> None:
        try:
            result = handler(job)
        except JobLost:
            _log.info("worker %s: %r was taken back", self.name, job)
            return
        except Exception as exc:
            if not (job.finished or job.lost):
                with contextlib.suppress(JobLost):
                    job.fail(f"{type(exc).__name__}: {exc}")
            return
        if job.finished or job.lost:
            return
        try:
            job.complete(result)
        except JobLost:
            _log.info("worker %s: %r was taken back before its result", self.name, job)
        except BrokerError as exc:
            if exc.status == 413:
                with contextlib.suppress(JobLost):
                    job.fail(f"result refused: {exc}")
            else:
                raise

    def _hand_back_orphans(self) -> None:
        """A grant this worker never saw (a lost answer): hand it back with ``leave``."""
        self._orphans_checked = True
        if self.held():
            return
        try:
            response = self._http.request(
                "POST", f"/v1/workers/{self.name}/heartbeat", json={"resident": self.resident}
            )
        except BrokerUnavailable:
            return
        if response.status_code == 200 and response.json().get("jobs"):
            _log.warning("worker %s: handing back jobs whose grant was lost", self.name)
            self.leave()

    def _start_heartbeats(self) -> None:
        if self._beat is not None and self._beat.is_alive():
            return
        self._beat_stop.clear()
        self._beat = threading.Thread(
            target=self._heartbeats, name=f"prioqueue-heartbeat-{self.name}", daemon=True
        )
        self._beat.start()

    def _heartbeats(self) -> None:
        while not self._beat_stop.is_set():
            held = self.held()
            if not held:
                return
            interval = min([self.heartbeat_interval] + [j.lease_seconds / 4 for j in held])
            if self._beat_stop.wait(interval):
                return
            sent_with = self.held()  # one popped from now on may be granted after the answer
            try:
                response = self._http.request(
                    "POST",
                    f"/v1/workers/{self.name}/heartbeat",
                    json={"resident": self.resident},
                )
            except BrokerUnavailable:
                continue
            except Exception:  # pragma: no cover - keep beating whatever happened
                _log.exception("worker %s: heartbeat failed", self.name)
                continue
            if response.status_code not in (200, 404):
                continue
            jobs = response.json()["jobs"] if response.status_code == 200 else []
            listed = {(j["id"], int(j["attempt"])) for j in jobs}
            for job in sent_with:  # not self.held(): a newer job is missing yet still ours
                if (job.id, job.attempt) not in listed and not job.finished:
                    _log.warning("worker %s: %r was taken back", self.name, job)
                    self._drop(job, lost=True)

    def _shutdown(self) -> None:
        self._beat_stop.set()
        self.leave()
        until, self._abandoned_until = self._abandoned_until, None
        if until is not None and self._signals < 2:
            self._watch_abandoned_poll(until)

    def _watch_abandoned_poll(self, until: float) -> None:
        """Hand back what a broker grants to the abandoned long poll until its wait ends.

        A broker that notices the closed connection grants nothing and says so: once a
        heartbeat (200, or 404 after the leave) answers ``X-Prioqueue-Waiting: 0`` (no poll of
        this worker left in the broker) at least :data:`ABANDONED_POLL_SLACK` seconds after
        the poll was abandoned (time for a request still on its way to arrive), nothing can be
        granted to it any more and the watch ends.
        A broker that does not notice may grant a job to the gone poll, which this hands back
        with ``leave`` within :data:`ABANDONED_POLL_CHECK` seconds. A second signal ends it.
        """
        settled = self._abandoned_at + ABANDONED_POLL_SLACK
        _log.info("worker %s: watching the abandoned poll for a grant until it ends", self.name)
        with contextlib.suppress(_Interrupted):
            while self._signals < 2 and self.clock() < until:
                pause = min(ABANDONED_POLL_CHECK, max(0.0, until - self.clock()))
                threading.Event().wait(pause)  # a second signal interrupts it
                try:
                    response = self._http.request(
                        "POST", f"/v1/workers/{self.name}/heartbeat",
                        json={"resident": self.resident}, budget=LEAVE_BUDGET,
                    )  # fmt: skip
                except BrokerUnavailable:
                    return
                if response.status_code == 200 and response.json().get("jobs"):
                    _log.warning("worker %s: handing back a job granted while stopping", self.name)
                    self.leave()
                elif response.headers.get("x-prioqueue-waiting") == "0" and self.clock() >= settled:
                    _log.info("worker %s: no poll of it waits in the broker: stopping", self.name)
                    return  # nothing can be granted to the abandoned poll any more

    @contextlib.contextmanager
    def _signal_handlers(self) -> Iterator[None]:
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            self._signals += 1
            self._stopping.set()
            _log.info("worker %s: signal %d: stopping", self.name, signum)
            if self._in_pop or self._signals > 1:
                raise _Interrupted()

        handled = (signal.SIGTERM, signal.SIGINT)
        previous = {sig: signal.signal(sig, on_signal) for sig in handled}
        try:
            yield
        except _Interrupted:
            pass
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
