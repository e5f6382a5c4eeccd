"""The client's transport: which replica to ask, what to retry, how to read an answer.

* **Retries** (``stamina``: exponential backoff with jitter, bounded by ``retry_timeout``
  seconds in all): transport errors (the broker restarting, a connection dropped), 503 (a
  standby or a stopping broker) and 429 (a full queue; its ``Retry-After`` is honoured,
  within [:data:`RETRY_AFTER_FLOOR`, :data:`RETRY_AFTER_CAP`]: a ``0``, negative, ``nan`` or
  date value never makes the client retry without a pause). Every other answer is final.
* **Leader**: a 503 naming ``X-Prioqueue-Leader`` moves every later request to that address
  only when it is one of the URLs the user gave (same scheme, host and port): the key is
  never sent to a host the user did not list, nor over ``http`` where ``https`` was given.
  A leader not listed moves to the next listed URL instead; with several URLs given, a
  refused connection moves to the next one too.
* **Errors**: every failure is a :class:`BrokerError` (or a subclass) with a message, an
  answer this client cannot read included; no ``JSONDecodeError``, ``KeyError`` or httpx
  error escapes.
* A request that is not idempotent by itself carries what makes it so: a submit's
  ``Idempotency-Key`` is made once per call and reused by each of its retries.
"""

from __future__ import annotations

import contextlib
import math
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypedDict, TypeVar

import httpx
import stamina

from prioqueue.client.errors import BrokerError, BrokerUnavailable

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "RETRY_AFTER_CAP",
    "RETRY_AFTER_FLOOR",
    "AsyncTransport",
    "Endpoint",
    "RequestOptions",
    "SyncTransport",
    "raise_for",
    "retry_after",
]

_C = TypeVar("_C", httpx.Client, httpx.AsyncClient)

RETRY_AFTER_CAP = 5.0
"""The longest wait (seconds) a ``Retry-After`` may ask between two retries."""
RETRY_AFTER_FLOOR = 0.5
"""The shortest wait (seconds) between two retries a ``Retry-After`` sets (``0`` included)."""


def retry_after(value: str | None) -> float | None:
    """A ``Retry-After`` header's wait, within [floor, cap]; None when it is not a number.

    An HTTP date, ``nan`` or ``inf`` is not taken (the exponential backoff applies). O(1).
    """
    if value is None or len(value) > 32:
        return None
    try:
        delay = float(value)
    except ValueError:
        return None
    if not math.isfinite(delay):
        return None
    return min(max(delay, RETRY_AFTER_FLOOR), RETRY_AFTER_CAP)


class RequestOptions(TypedDict, total=False):
    """The options of one call (see :meth:`SyncTransport.request`)."""

    json: Any
    params: Mapping[str, Any] | None
    headers: Mapping[str, str] | None
    wait: float
    retried: list[bool] | None
    budget: float | None


class _Retry(Exception):
    """A 503 or 429: try again (after ``delay`` seconds when the broker said so)."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"{response.status_code}: {response.text[:200]}")
        self.response = response
        self.delay = retry_after(response.headers.get("retry-after"))


def _backoff(exc: BaseException) -> bool | float:
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
        self._origins = {_origin(u): u for u in reversed(urls)}  # the first URL of an origin
        self._lock = threading.Lock()

    def follow(self, response: httpx.Response, asked: str) -> None:
        """Move to the leader a 503 names (``X-Prioqueue-Leader``), if it is listed. O(urls).

        A leader is followed only to a URL the user gave with the same origin (scheme, host
        and port); one not listed moves from ``asked`` (the URL that answered) to the next
        listed URL instead.
        """
        leader = response.headers.get("x-prioqueue-leader")
        if not leader:
            return
        listed = self._origins.get(_origin(leader))
        if listed is None:
            self.rotate(asked)
            return
        with self._lock:
            self.current = listed

    def rotate(self, failed: str) -> None:
        """After a refused connection to ``failed``, try the next configured URL. O(urls)."""
        with self._lock:
            if self.current != failed:
                return
            index = self.urls.index(failed) if failed in self.urls else -1
            self.current = self.urls[(index + 1) % len(self.urls)]


def _origin(url: str) -> tuple[str, str, int] | None:
    """``(scheme, host, port)`` of a URL (default ports filled in), or None if unreadable."""
    try:
        parsed = httpx.URL(url.strip())
    except (httpx.InvalidURL, TypeError, ValueError):
        return None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        return None
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    return parsed.scheme, parsed.host.lower(), port


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


class _Transport(ABC, Generic[_C]):
    """What both transports share: the endpoint, the key, the budgets, one attempt's logic.

    A subclass adds only the I/O: its client class and the retry loop that sends (sync or
    async); every decision about an answer is made here.
    """

    def __init__(
        self,
        url: str | Sequence[str],
        key: str,
        *,
        timeout: float,
        retry_timeout: float,
        client: _C | None,
    ) -> None:
        self.endpoint = Endpoint(url)
        self.key = key
        self.timeout = timeout
        self.retry_timeout = retry_timeout
        self.client: _C = client if client is not None else self._new_client(timeout)

    @abstractmethod
    def _new_client(self, timeout: float) -> _C:
        """The transport's own httpx client (sync or async), made when none is given."""

    def _send_options(self, options: RequestOptions) -> dict[str, Any]:
        """The keyword arguments of the client's ``request`` (but the URL) for ``options``."""
        headers = {"Authorization": f"Bearer {self.key}"}
        headers.update(options.get("headers") or {})
        return {
            "json": options.get("json"),
            "params": options.get("params"),
            "headers": headers,
            "timeout": self.timeout + options.get("wait", 0.0),
        }

    def _retries(self, options: RequestOptions) -> Any:
        """The retry context of one call (``for``/``async for`` over its attempts)."""
        budget = options.get("budget")
        return stamina.retry_context(
            on=_backoff,
            attempts=None,
            timeout=self.retry_timeout if budget is None else budget,
            wait_max=2.0,
        )

    def _base(self, attempt: Any, options: RequestOptions) -> str:
        """The URL to try this attempt (noting a retry in ``options["retried"]``)."""
        retried = options.get("retried")
        if attempt.num > 1 and retried is not None:
            retried.append(True)
        return self.endpoint.current

    def _answer(self, response: httpx.Response, base: str) -> httpx.Response:
        """``response``, or :class:`_Retry` for a 503/429 (following a named leader)."""
        if response.status_code in (429, 503):
            self.endpoint.follow(response, base)
            raise _Retry(response)
        return response

    @contextlib.contextmanager
    def _rotating(self, base: str) -> Iterator[None]:
        """A transport error while asking ``base`` moves to the next URL (and is retried)."""
        try:
            yield
        except httpx.TransportError:
            self.endpoint.rotate(base)
            raise

    @contextlib.contextmanager
    def _unavailable(self) -> Iterator[None]:
        """Out of retries: :class:`BrokerUnavailable` with the last status or error."""
        try:
            yield
        except _Retry as exc:
            raise BrokerUnavailable(exc.response.status_code, str(exc)) from None
        except httpx.TransportError as exc:
            raise BrokerUnavailable(0, f"no answer from {self.endpoint.current}: {exc!r}") from exc
        except httpx.HTTPError as exc:  # an answer httpx could not read (a bad encoding)
            raise BrokerError(
                0, f"unreadable answer from {self.endpoint.current}: {exc!r}"
            ) from exc


class SyncTransport(_Transport[httpx.Client]):
    """Blocking requests with retries (see the module docstring).

    Args:
        url: The broker's URL(s).
        key: The API key.
        timeout: Seconds for one request to connect and answer (long polls add their wait).
        retry_timeout: Seconds all the retries of one call may take before
            :class:`BrokerUnavailable`.
        client: An ``httpx.Client`` to use (tests); default a new one.
    """

    def _new_client(self, timeout: float) -> httpx.Client:
        return httpx.Client(timeout=timeout)

    def request(self, method: str, path: str, **options: Unpack[RequestOptions]) -> httpx.Response:
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
        send = self._send_options(options)
        with self._unavailable():
            for attempt in self._retries(options):
                with attempt:
                    base = self._base(attempt, options)
                    with self._rotating(base):
                        response = self.client.request(method, base + path, **send)
                    return self._answer(response, base)
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        """Close the connections."""
        self.client.close()


class AsyncTransport(_Transport[httpx.AsyncClient]):
    """:class:`SyncTransport` for asyncio (``httpx.AsyncClient``); same arguments."""

    def _new_client(self, timeout: float) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=timeout)

    async def request(
        self, method: str, path: str, **options: Unpack[RequestOptions]
    ) -> httpx.Response:
        """See :meth:`SyncTransport.request`."""
        send = self._send_options(options)
        with self._unavailable():
            async for attempt in self._retries(options):
                with attempt:
                    base = self._base(attempt, options)
                    with self._rotating(base):
                        response = await self.client.request(method, base + path, **send)
                    return self._answer(response, base)
        raise AssertionError("unreachable")  # pragma: no cover

    async def aclose(self) -> None:
        """Close the connections."""
        await self.client.aclose()
