"""The client's transport: which replica to ask, what to retry, how to read an answer.

* **Retries** (``stamina``: exponential backoff with jitter, bounded by ``retry_timeout``
  seconds in all): transport errors (the broker restarting, a connection dropped), 503 (a
  standby or a stopping broker) and 429 (a full queue; its ``Retry-After`` is honoured).
  Every other answer is final.
* **Leader**: a 503 naming ``X-Prioqueue-Leader`` moves every later request to that address;
  with several URLs given, a refused connection moves to the next one.
* A request that is not idempotent by itself carries what makes it so: a submit's
  ``Idempotency-Key`` is made once per call and reused by each of its retries.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import stamina

from prioqueue.client._errors import BrokerError, BrokerUnavailable

__all__ = ["AsyncTransport", "Endpoint", "SyncTransport", "raise_for"]

RETRY_AFTER_CAP = 5.0
"""The longest wait (seconds) a ``Retry-After`` may ask between two retries."""


class _Retry(Exception):
    """A 503 or 429: try again (after ``delay`` seconds when the broker said so)."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"{response.status_code}: {response.text[:200]}")
        self.response = response
        delay: float | None = None
        with contextlib.suppress(ValueError):
            delay = float(response.headers.get("retry-after", ""))
        self.delay = None if delay is None else min(max(delay, 0.0), RETRY_AFTER_CAP)


def _backoff(exc: Exception) -> bool | float:
    """The retry hook: retry transport errors and 503/429 (a 429's Retry-After, capped)."""
    if isinstance(exc, _Retry):
        if exc.response.status_code == 429 and exc.delay is not None:
            return exc.delay
        return True
    return isinstance(exc, httpx.TransportError)


class Endpoint:
    """The replica to ask: the given URLs in turn, or the leader a 503 named. Thread-safe.

    Args:
        url: One base URL, several separated by commas, or a sequence of them.

    Raises:
        ValueError: No URL, or one that is not ``http://`` or ``https://``.
    """

    def __init__(self, url: str | Sequence[str]) -> None:
        urls = [u.strip() for u in url.split(",")] if isinstance(url, str) else list(url)
        urls = [u.rstrip("/") for u in urls if u]
        if not urls:
            raise ValueError("the broker URL is empty; expected http://host:port")
        for u in urls:
            if not u.startswith(("http://", "https://")):
                raise ValueError(f"broker URL {u!r} must start with http:// or https://")
        self.urls = urls
        self.current = urls[0]
        self._lock = threading.Lock()

    def follow(self, response: httpx.Response) -> None:
        """Move to the leader a 503 names (``X-Prioqueue-Leader``). O(1)."""
        leader = response.headers.get("x-prioqueue-leader")
        if leader and leader.startswith(("http://", "https://")):
            with self._lock:
                self.current = leader.rstrip("/")

    def rotate(self, failed: str) -> None:
        """After a refused connection to ``failed``, try the next configured URL. O(urls)."""
        with self._lock:
            if self.current != failed:
                return
            index = self.urls.index(failed) if failed in self.urls else -1
            self.current = self.urls[(index + 1) % len(self.urls)]


def raise_for(response: httpx.Response) -> None:
    """Raise :class:`BrokerError` for a 4xx/5xx answer (its JSON ``error`` and ``field``)."""
    if response.status_code < 400:
        return
    try:
        body = response.json()
    except ValueError:
        body = None
    message = response.text[:500]
    field = None
    if isinstance(body, dict):
        message = str(body.get("error", message))
        field = body.get("field")
    raise BrokerError(response.status_code, message, field=field, body=body)


def _headers(key: str, extra: Mapping[str, str] | None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {key}"}
    if extra:
        headers.update(extra)
    return headers


class SyncTransport:
    """Blocking requests with retries (see the module docstring).

    Args:
        url: The broker's URL(s).
        key: The API key.
        timeout: Seconds for one request to connect and answer (long polls add their wait).
        retry_timeout: Seconds all the retries of one call may take before
            :class:`BrokerUnavailable`.
        client: An ``httpx.Client`` to use (tests); default a new one.
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
        self.endpoint = Endpoint(url)
        self.key = key
        self.timeout = timeout
        self.retry_timeout = retry_timeout
        self.client = client or httpx.Client(timeout=timeout)

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        wait: float = 0.0,
        retried: list[bool] | None = None,
        budget: float | None = None,
    ) -> httpx.Response:
        """One call, retried; returns the final answer (any status below 500 but 429).

        Args:
            method: The HTTP method.
            path: The path under the broker's URL.
            json: The JSON body, if any.
            params: Query parameters.
            headers: Extra headers.
            wait: A long poll's wait, added to the request's timeout.
            retried: When given, gets True appended on each retry (a caller may need to
                know its first try may have landed).
            budget: Seconds of retries for this call (default ``retry_timeout``).

        Raises:
            BrokerUnavailable: No answer but 503/429/transport errors within the budget.
        """
        all_headers = _headers(self.key, headers)
        timeout = self.timeout + wait
        try:
            for attempt in stamina.retry_context(
                on=_backoff,
                attempts=None,
                timeout=self.retry_timeout if budget is None else budget,
                wait_max=2.0,
            ):
                with attempt:
                    if attempt.num > 1 and retried is not None:
                        retried.append(True)
                    base = self.endpoint.current
                    try:
                        response = self.client.request(
                            method, base + path, json=json, params=params,
                            headers=all_headers, timeout=timeout,
                        )  # fmt: skip
                    except httpx.TransportError:
                        self.endpoint.rotate(base)
                        raise
                    if response.status_code in (429, 503):
                        self.endpoint.follow(response)
                        raise _Retry(response)
                    return response
        except _Retry as exc:
            raise BrokerUnavailable(exc.response.status_code, str(exc)) from None
        except httpx.TransportError as exc:
            raise BrokerUnavailable(0, f"no answer from {self.endpoint.current}: {exc!r}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        """Close the connections."""
        self.client.close()


class AsyncTransport:
    """:class:`SyncTransport` for asyncio (``httpx.AsyncClient``); same arguments."""

    def __init__(
        self,
        url: str | Sequence[str],
        key: str,
        *,
        timeout: float = 10.0,
        retry_timeout: float = 60.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.endpoint = Endpoint(url)
        self.key = key
        self.timeout = timeout
        self.retry_timeout = retry_timeout
        self.client = client or httpx.AsyncClient(timeout=timeout)

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        wait: float = 0.0,
        retried: list[bool] | None = None,
        budget: float | None = None,
    ) -> httpx.Response:
        """See :meth:`SyncTransport.request`."""
        all_headers = _headers(self.key, headers)
        timeout = self.timeout + wait
        try:
            async for attempt in stamina.retry_context(
                on=_backoff,
                attempts=None,
                timeout=self.retry_timeout if budget is None else budget,
                wait_max=2.0,
            ):
                with attempt:
                    if attempt.num > 1 and retried is not None:
                        retried.append(True)
                    base = self.endpoint.current
                    try:
                        response = await self.client.request(
                            method, base + path, json=json, params=params,
                            headers=all_headers, timeout=timeout,
                        )  # fmt: skip
                    except httpx.TransportError:
                        self.endpoint.rotate(base)
                        raise
                    if response.status_code in (429, 503):
                        self.endpoint.follow(response)
                        raise _Retry(response)
                    return response
        except _Retry as exc:
            raise BrokerUnavailable(exc.response.status_code, str(exc)) from None
        except httpx.TransportError as exc:
            raise BrokerUnavailable(0, f"no answer from {self.endpoint.current}: {exc!r}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def aclose(self) -> None:
        """Close the connections."""
        await self.client.aclose()
