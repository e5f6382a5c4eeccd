"""``Broker`` and ``AsyncBroker``: the submitter's side of the broker's HTTP API."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import httpx

from prioqueue.client._errors import (
    JobCancelled,
    JobEnded,
    JobExpired,
    JobFailed,
    WaitTimeout,
)
from prioqueue.client._http import AsyncTransport, SyncTransport, raise_for

__all__ = ["AsyncBroker", "Broker"]

FINAL_STATES = frozenset(("done", "failed", "cancelled", "expired"))
"""The states a job does not leave."""
LONG_POLL = 30.0
"""The longest single ``?wait=`` the clients ask for (the broker allows 60)."""

_ENDED: dict[str, type[JobEnded]] = {
    "failed": JobFailed,
    "cancelled": JobCancelled,
    "expired": JobExpired,
}


def _submit_body(payload: Any, fields: Mapping[str, Any]) -> dict[str, Any]:
    body = {k: v for k, v in fields.items() if v is not None}
    if payload is not None:
        body["payload"] = payload
    return body


def _outcome(job: dict[str, Any]) -> Any:
    """A finished job's result, or its typed error."""
    state = job.get("state")
    if state == "done":
        return job.get("result")
    raise _ENDED.get(str(state), JobEnded)(job)


def _json(response: httpx.Response) -> Any:
    raise_for(response)
    return response.json()


def _key(idempotency_key: str | None) -> str:
    return idempotency_key or f"pq-{uuid.uuid4().hex}"


class Broker:
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

    Example:
        ``with Broker("http://127.0.0.1:8091", "sk-alice") as broker:
        print(broker.wait(broker.submit({"prompt": "a cat"})))``
    """

    def __init__(
        self,
        url: str | Sequence[str],
        key: str,
        *,
        timeout: float = 10.0,
        retry_timeout: float = 60.0,
        client: httpx.Client | None = None,
    ) -> None:
        self._http = SyncTransport(
            url, key, timeout=timeout, retry_timeout=retry_timeout, client=client
        )

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def submit(
        self,
        payload: Any = None,
        *,
        priority: int | str | None = None,
        model: str | None = None,
        estimate: float | None = None,
        group: str | None = None,
        image: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        **fields: Any,
    ) -> str:
        """Queue one job; returns its id.

        An idempotency key is made for the call (unless given) and sent with each retry, so
        an answer lost on the way never makes two jobs. Other keyword fields (``ttl``,
        ``not_before``, ``max_attempts``, ``backoff``...) go into the body as they are.

        Raises:
            BrokerError: The broker refused it (422 names the field; 429 after the retries).
            BrokerUnavailable: No broker answered in time.
        """
        body = _submit_body(
            payload,
            {"priority": priority, "model": model, "estimate": estimate, "group": group,
             "image": None if image is None else dict(image), **fields},
        )  # fmt: skip
        headers = {"Idempotency-Key": _key(idempotency_key)}
        response = self._http.request("POST", "/v1/jobs", json=body, headers=headers)
        job_id: str = _json(response)["id"]
        return job_id

    def submit_many(
        self, jobs: Iterable[Mapping[str, Any]], *, idempotency_key: str | None = None
    ) -> list[str]:
        """Queue every job of a batch as one operation (all or none); returns their ids.

        Args:
            jobs: Each a submit body (``payload``, ``priority``, ``model``, ...).
            idempotency_key: One key for the batch (default: made for the call).

        Raises:
            BrokerError: The broker refused the batch (nothing was queued).
            BrokerUnavailable: No broker answered in time.
        """
        body = {"jobs": [dict(job) for job in jobs]}
        headers = {"Idempotency-Key": _key(idempotency_key)}
        response = self._http.request("POST", "/v1/jobs/batch", json=body, headers=headers)
        ids: list[str] = _json(response)["ids"]
        return ids

    def get(self, job_id: str, *, wait: float = 0.0) -> dict[str, Any]:
        """The job (state, position, explanation, result); ``wait`` long-polls until it ends.

        Raises:
            BrokerError: 404 no such job of this key's member.
        """
        params = {"wait": wait} if wait else None
        job: dict[str, Any] = _json(
            self._http.request("GET", f"/v1/jobs/{job_id}", params=params, wait=wait)
        )
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
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = LONG_POLL if end is None else min(LONG_POLL, end - time.monotonic())
            job = self.get(job_id, wait=max(0.0, left))
            if job.get("state") in FINAL_STATES:
                return _outcome(job)
            if end is not None and time.monotonic() >= end:
                raise WaitTimeout(job)

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel a queued or running job; returns it.

        Raises:
            BrokerError: 404 unknown; 409 already finished.
        """
        job: dict[str, Any] = _json(self._http.request("DELETE", f"/v1/jobs/{job_id}"))
        return job

    def group(self, group: str, *, member: str | None = None) -> dict[str, Any]:
        """A group's counts by state, GPU-seconds and forecast finish.

        Raises:
            BrokerError: 404 no such group; 403 another member's without the right.
        """
        params = {"member": member} if member else None
        view: dict[str, Any] = _json(
            self._http.request("GET", f"/v1/groups/{group}", params=params)
        )
        return view

    def cancel_group(
        self, group: str, *, running: str = "keep", member: str | None = None
    ) -> dict[str, Any]:
        """Cancel a group's queued jobs (``running="cancel"``: its running ones too).

        Raises:
            BrokerError: 404 no such group; 403 another member's without the right.
        """
        params: dict[str, str] = {"running": running}
        if member:
            params["member"] = member
        view: dict[str, Any] = _json(
            self._http.request("DELETE", f"/v1/groups/{group}", params=params)
        )
        return view

    def status(self) -> dict[str, Any]:
        """Counts by state, workers and who leads."""
        view: dict[str, Any] = _json(self._http.request("GET", "/v1/status"))
        return view


class AsyncBroker:
    """:class:`Broker` for asyncio: the same methods, awaited; the same arguments."""

    def __init__(
        self,
        url: str | Sequence[str],
        key: str,
        *,
        timeout: float = 10.0,
        retry_timeout: float = 60.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self._http = AsyncTransport(
            url, key, timeout=timeout, retry_timeout=retry_timeout, client=client
        )

    async def __aenter__(self) -> AsyncBroker:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    async def submit(
        self,
        payload: Any = None,
        *,
        priority: int | str | None = None,
        model: str | None = None,
        estimate: float | None = None,
        group: str | None = None,
        image: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        **fields: Any,
    ) -> str:
        """See :meth:`Broker.submit`."""
        body = _submit_body(
            payload,
            {"priority": priority, "model": model, "estimate": estimate, "group": group,
             "image": None if image is None else dict(image), **fields},
        )  # fmt: skip
        headers = {"Idempotency-Key": _key(idempotency_key)}
        response = await self._http.request("POST", "/v1/jobs", json=body, headers=headers)
        job_id: str = _json(response)["id"]
        return job_id

    async def submit_many(
        self, jobs: Iterable[Mapping[str, Any]], *, idempotency_key: str | None = None
    ) -> list[str]:
        """See :meth:`Broker.submit_many`."""
        body = {"jobs": [dict(job) for job in jobs]}
        headers = {"Idempotency-Key": _key(idempotency_key)}
        response = await self._http.request("POST", "/v1/jobs/batch", json=body, headers=headers)
        ids: list[str] = _json(response)["ids"]
        return ids

    async def get(self, job_id: str, *, wait: float = 0.0) -> dict[str, Any]:
        """See :meth:`Broker.get`."""
        params = {"wait": wait} if wait else None
        response = await self._http.request("GET", f"/v1/jobs/{job_id}", params=params, wait=wait)
        job: dict[str, Any] = _json(response)
        return job

    async def wait(self, job_id: str, timeout: float | None = None) -> Any:
        """See :meth:`Broker.wait`."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = LONG_POLL if end is None else min(LONG_POLL, end - time.monotonic())
            job = await self.get(job_id, wait=max(0.0, left))
            if job.get("state") in FINAL_STATES:
                return _outcome(job)
            if end is not None and time.monotonic() >= end:
                raise WaitTimeout(job)

    async def cancel(self, job_id: str) -> dict[str, Any]:
        """See :meth:`Broker.cancel`."""
        job: dict[str, Any] = _json(await self._http.request("DELETE", f"/v1/jobs/{job_id}"))
        return job

    async def group(self, group: str, *, member: str | None = None) -> dict[str, Any]:
        """See :meth:`Broker.group`."""
        params = {"member": member} if member else None
        response = await self._http.request("GET", f"/v1/groups/{group}", params=params)
        view: dict[str, Any] = _json(response)
        return view

    async def cancel_group(
        self, group: str, *, running: str = "keep", member: str | None = None
    ) -> dict[str, Any]:
        """See :meth:`Broker.cancel_group`."""
        params: dict[str, str] = {"running": running}
        if member:
            params["member"] = member
        response = await self._http.request("DELETE", f"/v1/groups/{group}", params=params)
        view: dict[str, Any] = _json(response)
        return view

    async def status(self) -> dict[str, Any]:
        """See :meth:`Broker.status`."""
        view: dict[str, Any] = _json(await self._http.request("GET", "/v1/status"))
        return view
