"""``Broker`` and ``AsyncBroker``: the submitter's side of the broker's HTTP API.

Both are the same client: each method builds its request (:class:`_Call`, by a function of
this module) and reads the answer with :func:`_read`; only the sending differs (blocking or
awaited), in ``_send``. :class:`Deadline` is the clock of a ``wait`` (also ``jobs wait``'s).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, NamedTuple, TypedDict, TypeVar

import httpx

from prioqueue.capabilities import Needs
from prioqueue.client._http import AsyncTransport, RequestOptions, SyncTransport, raise_for
from prioqueue.client.errors import (
    BrokerError,
    JobCancelled,
    JobEnded,
    JobExpired,
    JobFailed,
    WaitTimeout,
)
from prioqueue.clock import SYSTEM_CLOCK, Clock
from prioqueue.jobfields import names_in

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["AsyncBroker", "Broker", "Deadline", "SubmitFields"]

FINAL_STATES = frozenset(("done", "failed", "cancelled", "expired"))
"""The states a job does not leave."""
LONG_POLL = 30.0
"""The longest single ``?wait=`` the clients ask for (the broker allows 60)."""

_ENDED: dict[str, type[JobEnded]] = {
    "failed": JobFailed,
    "cancelled": JobCancelled,
    "expired": JobExpired,
}
_C = TypeVar("_C", httpx.Client, httpx.AsyncClient)
_FIELD_ORDER = names_in("client")  # the body's documented order (prioqueue.jobfields)


class SubmitFields(TypedDict, total=False):
    """What a submit's body may hold besides its payload (``POST /v1/jobs``, docs/broker.md).

    None (or absent) leaves a field out of the body: the broker's default applies. The
    fields are those of :data:`prioqueue.jobfields.JOB_FIELDS` with the ``client`` layer,
    typed here (``tests/test_jobfields.py`` keeps the two lists equal).
    """

    priority: int | str | None
    model: str | None
    estimate: float | None
    group: str | None
    image: Mapping[str, Any] | None
    ttl: float | None
    not_before: float | None
    max_attempts: int | None
    backoff: Mapping[str, Any] | None
    needs: Needs | Mapping[str, Any] | None
    labels: Mapping[str, str] | None


class _Call(NamedTuple):
    """One request of the API and what its answer gives back."""

    method: str
    path: str
    options: RequestOptions
    member: str | None = None  # the answer's JSON member returned; None: the whole body
    kind: type = dict  # what the value returned must be


def _read(call: _Call, response: httpx.Response) -> Any:
    """The answer to ``call``: its JSON (or one member).

    Raises:
        BrokerError: A 4xx; or an answer that is not the JSON the call expects (not JSON,
            a member missing, a value of another type), with the answer's status.
    """
    raise_for(response)
    try:
        body = response.json()
        value = body if call.member is None else body[call.member]
    except (ValueError, KeyError, TypeError, IndexError):
        value = None
    if not isinstance(value, call.kind):
        expected = "an object" if call.member is None else f"an object with {call.member!r}"
        raise BrokerError(
            response.status_code,
            f"{call.method} {call.path}: the answer is not {expected} of the expected type: "
            f"{response.text[:200]!r}",
        )
    return value


def _key(idempotency_key: str | None) -> str:
    return idempotency_key or f"pq-{uuid.uuid4().hex}"


def _body(fields: Mapping[str, Any]) -> dict[str, Any]:
    """A submit body: the fields in the declared order, None left out, objects as JSON."""
    ordered = {**{name: fields[name] for name in _FIELD_ORDER if name in fields}, **fields}
    body = {k: v for k, v in ordered.items() if v is not None}
    for name in _FIELD_ORDER:
        value = body.get(name)
        if isinstance(value, Needs):
            body[name] = value.as_dict()
        elif isinstance(value, Mapping):
            body[name] = dict(value)
    return body


def _submit(payload: Any, idempotency_key: str | None, fields: Mapping[str, Any]) -> _Call:
    body = _body(fields)
    if payload is not None:
        body["payload"] = payload
    headers = {"Idempotency-Key": _key(idempotency_key)}
    return _Call("POST", "/v1/jobs", {"json": body, "headers": headers}, "id", str)


def _submit_many(jobs: Iterable[Mapping[str, Any]], idempotency_key: str | None) -> _Call:
    body = {"jobs": [_body(job) for job in jobs]}
    headers = {"Idempotency-Key": _key(idempotency_key)}
    return _Call("POST", "/v1/jobs/batch", {"json": body, "headers": headers}, "ids", list)


def _get(job_id: str, wait: float) -> _Call:
    params = {"wait": wait} if wait else None
    return _Call("GET", f"/v1/jobs/{job_id}", {"params": params, "wait": wait})


def _group(group: str, member: str | None) -> _Call:
    params = {"member": member} if member else None
    return _Call("GET", f"/v1/groups/{group}", {"params": params})


def _cancel_group(group: str, running: str, member: str | None) -> _Call:
    params: dict[str, str] = {"running": running}
    if member:
        params["member"] = member
    return _Call("DELETE", f"/v1/groups/{group}", {"params": params})


def _cancel(job_id: str, retried: list[bool]) -> _Call:
    return _Call("DELETE", f"/v1/jobs/{job_id}", {"retried": retried})


def _lost_cancel(exc: BrokerError, retried: list[bool]) -> bool:
    """Whether a cancel's 409 may answer the retry of a cancel that worked (then: GET it)."""
    return exc.status == 409 and bool(retried)


def _outcome(job: dict[str, Any]) -> Any:
    """A finished job's result, or its typed error."""
    state = job.get("state")
    if state == "done":
        return job.get("result")
    raise _ENDED.get(str(state), JobEnded)(job)


class Deadline:
    """The end of a wait for a job: each long poll's length, and whether time is up.

    Args:
        timeout: Seconds to wait at most, or None for no end.
        clock: The clock that times it (:data:`~prioqueue.clock.SYSTEM_CLOCK` by default).
    """

    def __init__(self, timeout: float | None, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self.end = None if timeout is None else clock.monotonic() + timeout

    def next_poll(self) -> float:
        """Seconds the next long poll may wait: :data:`LONG_POLL` at most, never < 0. O(1)."""
        if self.end is None:
            return LONG_POLL
        return max(0.0, min(LONG_POLL, self.end - self._clock.monotonic()))

    def passed(self) -> bool:
        """Whether the wait's time is up. O(1)."""
        return self.end is not None and self._clock.monotonic() >= self.end

    def settled(self, job: dict[str, Any]) -> bool:
        """Whether ``job`` ended (True), or may be waited for again (False).

        Raises:
            WaitTimeout: It has not ended and the time is up.
        """
        if job.get("state") in FINAL_STATES:
            return True
        if self.passed():
            raise WaitTimeout(job)
        return False


class _Client(Generic[_C]):
    """What :class:`Broker` and :class:`AsyncBroker` share: the constructor (their transport).

    The arguments are :class:`Broker`'s; ``client`` is an ``httpx.Client`` for a
    :class:`Broker`, an ``httpx.AsyncClient`` for an :class:`AsyncBroker`.
    """

    _transport: ClassVar[type[Any]]  # SyncTransport or AsyncTransport
    _http: Any

    def __init__(
        self,
        url: str | Sequence[str],
        key: str,
        *,
        timeout: float = 10.0,
        retry_timeout: float = 60.0,
        client: _C | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._clock = clock
        self._http = self._transport(
            url, key, timeout=timeout, retry_timeout=retry_timeout, client=client
        )


class Broker(_Client[httpx.Client]):
    """A blocking client for submitters (a key with role ``submitter``).

    Every call retries transport errors, 503 and 429 with exponential backoff and jitter
    (``retry_timeout`` seconds in all), follows the leader a standby names, and raises
    :class:`~prioqueue.client.BrokerError` for a refusal (4xx) or
    :class:`~prioqueue.client.BrokerUnavailable` when the budget runs out.

    Args:
        url: The broker's URL (``http://host:port``), or several (replicas) separated by
            commas.
        key: The API key.
        timeout: Seconds for one request.
        retry_timeout: Seconds the retries of one call may take.
        client: An ``httpx.Client`` to send with (tests; default: its own).
        clock: The clock that times :meth:`wait` (default
            :data:`~prioqueue.clock.SYSTEM_CLOCK`; tests inject a manual one).

    Example:
        ``with Broker("http://127.0.0.1:8091", "sk-alice") as broker:
        print(broker.wait(broker.submit({"prompt": "a cat"})))``
    """

    _transport = SyncTransport
    _http: SyncTransport

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def _send(self, call: _Call) -> Any:
        return _read(call, self._http.request(call.method, call.path, **call.options))

    def submit(
        self,
        payload: Any = None,
        *,
        idempotency_key: str | None = None,
        **fields: Unpack[SubmitFields],
    ) -> str:
        """Queue one job; returns its id.

        An idempotency key is made for the call (unless given) and sent with each retry, so
        an answer lost on the way never makes two jobs.

        Args:
            payload: Opaque JSON handed to the worker (None: none).
            idempotency_key: Reuse to make a repeated submit safe (default: made for the call).
            **fields: The body's fields (:class:`SubmitFields`, each described in
                :data:`prioqueue.jobfields.JOB_FIELDS`): ``priority`` (a number or an
                alias), ``model``, ``estimate`` (seconds), ``needs`` (a
                :class:`~prioqueue.capabilities.Needs` or its mapping), ...

        Raises:
            BrokerError: The broker refused it (422 names the field; 429 after the retries).
            BrokerUnavailable: No broker answered in time.
        """
        job_id: str = self._send(_submit(payload, idempotency_key, fields))
        return job_id

    def submit_many(
        self, jobs: Iterable[Mapping[str, Any]], *, idempotency_key: str | None = None
    ) -> list[str]:
        """Queue every job of a batch as one operation (all or none); returns their ids.

        Args:
            jobs: Each a submit body (``payload``, ``priority``, ``model``, ``needs``, ...;
                None values are left out, a ``Needs`` is sent as its mapping).
            idempotency_key: One key for the batch (default: made for the call).

        Raises:
            BrokerError: The broker refused the batch (nothing was queued).
            BrokerUnavailable: No broker answered in time.
        """
        ids: list[str] = self._send(_submit_many(jobs, idempotency_key))
        return ids

    def get(self, job_id: str, *, wait: float = 0.0) -> dict[str, Any]:
        """The job (state, position, explanation, result); ``wait`` long-polls until it ends.

        Raises:
            BrokerError: 404 no such job of this key's member.
        """
        job: dict[str, Any] = self._send(_get(job_id, wait))
        return job

    def wait(self, job_id: str, timeout: float | None = None) -> Any:
        """Wait for the job to end; returns its result.

        Raises:
            JobFailed: It failed (``exc.job["result"]`` is the worker's report).
            JobCancelled: It was cancelled.
            JobExpired: It expired before a worker took it.
            WaitTimeout: ``timeout`` seconds passed first (a ``TimeoutError``).
            BrokerError: 404 no such job.
        """
        deadline = Deadline(timeout, self._clock)
        job = self.get(job_id, wait=deadline.next_poll())
        while not deadline.settled(job):
            job = self.get(job_id, wait=deadline.next_poll())
        return _outcome(job)

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel a queued or running job; returns it.

        A cancel whose answer was lost is retried; the broker answers the retry 409 (the job
        is already cancelled): the client then reads the job and, cancelled, returns it as
        the success it was.

        Raises:
            BrokerError: 404 unknown; 409 already finished (done, failed, expired, or
                cancelled before this call).
        """
        retried: list[bool] = []
        try:
            job: dict[str, Any] = self._send(_cancel(job_id, retried))
        except BrokerError as exc:
            if not _lost_cancel(exc, retried):
                raise
            job = self.get(job_id)
            if job.get("state") != "cancelled":
                raise
        return job

    def group(self, group: str, *, member: str | None = None) -> dict[str, Any]:
        """A group's counts by state, GPU-seconds and forecast finish.

        Raises:
            BrokerError: 404 no such group; 403 another member's without the right.
        """
        view: dict[str, Any] = self._send(_group(group, member))
        return view

    def cancel_group(
        self, group: str, *, running: str = "keep", member: str | None = None
    ) -> dict[str, Any]:
        """Cancel a group's queued jobs (``running="cancel"``: its running ones too).

        Raises:
            BrokerError: 404 no such group; 403 another member's without the right.
        """
        view: dict[str, Any] = self._send(_cancel_group(group, running, member))
        return view

    def status(self) -> dict[str, Any]:
        """Counts by state, workers and who leads."""
        view: dict[str, Any] = self._send(_Call("GET", "/v1/status", {}))
        return view


class AsyncBroker(_Client[httpx.AsyncClient]):
    """:class:`Broker` for asyncio: the same methods, awaited; the same arguments."""

    _transport = AsyncTransport
    _http: AsyncTransport

    async def __aenter__(self) -> AsyncBroker:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    async def _send(self, call: _Call) -> Any:
        return _read(call, await self._http.request(call.method, call.path, **call.options))

    async def submit(
        self,
        payload: Any = None,
        *,
        idempotency_key: str | None = None,
        **fields: Unpack[SubmitFields],
    ) -> str:
        """See :meth:`Broker.submit` (``fields`` as there: :class:`SubmitFields`)."""
        job_id: str = await self._send(_submit(payload, idempotency_key, fields))
        return job_id

    async def submit_many(
        self, jobs: Iterable[Mapping[str, Any]], *, idempotency_key: str | None = None
    ) -> list[str]:
        """See :meth:`Broker.submit_many`."""
        ids: list[str] = await self._send(_submit_many(jobs, idempotency_key))
        return ids

    async def get(self, job_id: str, *, wait: float = 0.0) -> dict[str, Any]:
        """See :meth:`Broker.get`."""
        job: dict[str, Any] = await self._send(_get(job_id, wait))
        return job

    async def wait(self, job_id: str, timeout: float | None = None) -> Any:
        """See :meth:`Broker.wait`."""
        deadline = Deadline(timeout, self._clock)
        job = await self.get(job_id, wait=deadline.next_poll())
        while not deadline.settled(job):
            job = await self.get(job_id, wait=deadline.next_poll())
        return _outcome(job)

    async def cancel(self, job_id: str) -> dict[str, Any]:
        """See :meth:`Broker.cancel`."""
        retried: list[bool] = []
        try:
            job: dict[str, Any] = await self._send(_cancel(job_id, retried))
        except BrokerError as exc:
            if not _lost_cancel(exc, retried):
                raise
            job = await self.get(job_id)
            if job.get("state") != "cancelled":
                raise
        return job

    async def group(self, group: str, *, member: str | None = None) -> dict[str, Any]:
        """See :meth:`Broker.group`."""
        view: dict[str, Any] = await self._send(_group(group, member))
        return view

    async def cancel_group(
        self, group: str, *, running: str = "keep", member: str | None = None
    ) -> dict[str, Any]:
        """See :meth:`Broker.cancel_group`."""
        view: dict[str, Any] = await self._send(_cancel_group(group, running, member))
        return view

    async def status(self) -> dict[str, Any]:
        """See :meth:`Broker.status`."""
        view: dict[str, Any] = await self._send(_Call("GET", "/v1/status", {}))
        return view
