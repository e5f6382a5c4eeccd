"""The exceptions prioqueue raises.

Misuse by the caller raises an exception that names what was wrong and what is allowed.
Every exception derives from :class:`PrioqueueError`; most also derive from the built-in
exception a caller would naturally catch (``ValueError``, ``LookupError``), so
``except ValueError`` keeps working.
"""

from __future__ import annotations

__all__ = [
    "ChargeError",
    "ConfigError",
    "DispatcherClosed",
    "DuplicateJob",
    "InvalidState",
    "JobCancelled",
    "LeaseError",
    "LeaseExpired",
    "Overloaded",
    "PrioqueueError",
    "QueueFull",
    "QueueTimeout",
    "UnknownGroup",
    "UnknownJob",
    "UnknownWorker",
]


class PrioqueueError(Exception):
    """Base class of every exception raised by prioqueue."""


class ConfigError(PrioqueueError, ValueError):
    """A configuration value breaks a documented rule (raised at construction time)."""


class DuplicateJob(PrioqueueError, ValueError):
    """A job id was submitted while a job with the same id is still known to the dispatcher."""


class UnknownJob(PrioqueueError, LookupError):
    """A job id is not known to the dispatcher (never submitted, or already finished)."""

    def __str__(self) -> str:  # LookupError would repr() the message; keep it readable.
        return str(self.args[0]) if self.args else "unknown job"


class UnknownWorker(PrioqueueError, LookupError):
    """A worker name is not known to the fleet (never joined, or it left)."""

    def __str__(self) -> str:  # LookupError would repr() the message; keep it readable.
        return str(self.args[0]) if self.args else ""


class InvalidState(PrioqueueError, RuntimeError):
    """The call does not fit the job's current state (e.g. completing a job that is queued)."""


class LeaseExpired(InvalidState):
    """A job was completed after its lease deadline; ``expire()`` owns it now."""


class LeaseError(PrioqueueError):
    """A dispatcher's ``lease_for`` raised, or returned no usable lease, for the job it granted.

    The dispatcher is unchanged (the job is still queued); the caller decides whether to cancel
    the job or fix ``lease_for`` and dispatch again. The original exception, if any, is the
    ``__cause__``.

    Attributes:
        job_id: The job whose lease could not be computed.
    """

    def __init__(self, message: str, *, job_id: str) -> None:
        super().__init__(message)
        self.job_id = job_id


class ChargeError(PrioqueueError, ValueError):
    """The charge model returned no finite number of seconds >= 0 for a job.

    Raised by a grant (for the expected charge) or a completion; nothing changed. ``job_id``
    names the job, so an adapter can cancel it or complete it with an explicit ``charge``.
    """

    def __init__(self, message: str, *, job_id: str) -> None:
        super().__init__(message)
        self.job_id = job_id


class QueueFull(PrioqueueError):
    """The queue (or one member's share of it) is at its configured limit.

    Attributes:
        retry_after: Seconds after which a retry is likely to be admitted, estimated from the
            recent service rate. Always a finite number >= 1.
        limit: The limit that was hit.
        scope: ``"queue"`` for the global limit, ``"member"`` for the per-member limit,
            ``"level"`` for a level's ``LevelBudget.max_queued``, ``"wait"`` for its
            ``max_wait`` (then the exception is an :class:`Overloaded`).
    """

    def __init__(self, message: str, *, retry_after: float, limit: int, scope: str) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.limit = limit
        self.scope = scope


class Overloaded(QueueFull):
    """A submit's forecast wait is over its level's ``LevelBudget.max_wait`` (HTTP 503).

    The job was not queued: it could not have left the queue in time. ``scope`` is ``"wait"``,
    ``limit`` the level's ``max_wait`` rounded up to whole seconds.

    Attributes:
        forecast_wait: The forecast wait in seconds that was over the budget.
        max_wait: The level's ``max_wait`` in seconds.
        level: The job's priority level.
    """

    def __init__(
        self, message: str, *, retry_after: float, forecast_wait: float, max_wait: float, level: int
    ) -> None:
        super().__init__(
            message, retry_after=retry_after, limit=int(-(-max_wait // 1)), scope="wait"
        )
        self.forecast_wait = forecast_wait
        self.max_wait = max_wait
        self.level = level


class UnknownGroup(PrioqueueError, LookupError):
    """A group label no job was ever submitted with (or one that was forgotten)."""

    def __str__(self) -> str:  # LookupError would repr() the message; keep it readable.
        return str(self.args[0]) if self.args else "unknown group"


class QueueTimeout(PrioqueueError, TimeoutError):
    """A job waited in the queue longer than its ``timeout``; it was removed from the queue.

    Raised to the waiter by :mod:`prioqueue.asyncio` (which re-exports it).

    Attributes:
        job_id: The job that timed out.
        timeout: The timeout it was given, in seconds.
    """

    def __init__(self, message: str, *, job_id: str, timeout: float) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.timeout = timeout

    @classmethod
    def ttl_ran_out(cls, job_id: str, ttl: float) -> QueueTimeout:
        """The error of a waiter whose job's ``ttl`` ran out while it was queued."""
        message = f"job {job_id!r} was still queued at its deadline (ttl {ttl:g} s); it expired"
        return cls(message, job_id=job_id, timeout=ttl)


class DispatcherClosed(PrioqueueError, RuntimeError):
    """The asyncio dispatcher was closed: no new turns, and queued waiters are failed."""


class JobCancelled(PrioqueueError, RuntimeError):
    """The job was cancelled through the asyncio dispatcher's ``cancel`` while its owner waited."""
