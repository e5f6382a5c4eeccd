"""The broker's values: job records, refusals and the checks every operation shares (private).

Nothing here holds state: the owners (:mod:`prioqueue.broker.jobbook`, the engine) and the
operation modules import these, and :mod:`prioqueue.broker.engine` re-exports the public ones.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, TypedDict

import attrs

from prioqueue.jobfields import JOB_FIELDS

__all__ = [
    "AHEAD_LIMIT",
    "FINISHED",
    "MAX_IMAGE_LEASE",
    "SNAPSHOT_FORMAT",
    "JobRecord",
    "JobStatus",
    "PopResult",
    "PopSpec",
    "Rejected",
    "check_types",
    "fingerprint",
    "now_past",
    "pop_spec",
    "redacted",
    "submit_digest",
]


SNAPSHOT_FORMAT: Final = "prioqueue.broker/1"
AHEAD_LIMIT: Final = 100
"""How far ahead ``GET /v1/jobs/{id}`` forecasts a job's position (the gateway's bound too).

A forecast step costs about 15 us with a few hundred lanes: 1,000 steps made a read cost
20 ms (issue 21); 100 keep it near 2 ms at 5,000 queued."""
JobStatus = Literal["queued", "running", "done", "failed", "cancelled", "expired"]
FINISHED: Final = frozenset(("done", "failed", "cancelled", "expired"))
MAX_IMAGE_LEASE: Final = 1e9
"""The longest lease (seconds, on a slow worker) a job's ``image`` inputs may give: past it
the inputs are absurd, and past a float's range every pop would fail on the job."""


class Rejected(Exception):
    """An operation the engine refused before changing anything.

    Attributes:
        status: The HTTP status that says why (404, 409, 413, 422, 429, 503).
        field: The request field at fault, when one is.
        retry_after: Seconds to wait before retrying (429 and 503 only).
    """

    def __init__(
        self, status: int, message: str, *, field: str | None = None, retry_after: float = 0.0
    ) -> None:
        super().__init__(message)
        self.status = status
        self.field = field
        self.retry_after = retry_after


@attrs.define
class JobRecord:
    """What the broker knows of one job beyond the dispatcher's view."""

    id: str
    member: str
    priority: int
    model: str | None
    estimate: float | None
    group: str | None
    image: dict[str, Any] | None
    payload: Any
    submitted_at: float
    state: JobStatus = "queued"
    attempt: int = 0
    worker: str | None = None
    deadline: float | None = None
    granted_at: float | None = None
    lease_seconds: float | None = None
    result: Any = None
    finished_at: float | None = None
    idempotency_key: str | None = None
    expires_at: float | None = None
    """When the job expires if still queued (its ttl), or None."""
    max_attempts: int | None = None
    """The job's own grant budget (None: the configuration's ``max_attempts``)."""
    labels: dict[str, str] | None = None
    """The job's labels (``prioqueue.jobfields``), or None."""

    # The record owns its transitions: the engine's modules call these, never assign.

    def grant(self, worker: str, attempt: int, model: str | None, lease: Any, now: float) -> None:
        """A worker was granted the job at ``attempt`` under ``lease`` (``seconds``, ``deadline``).

        ``model``: the one the fleet chose (a job that accepts several models). O(1).
        """
        self.state = "running"
        self.attempt = attempt
        self.worker = worker
        self.model = model
        self.lease_seconds = lease.seconds
        self.deadline = lease.deadline
        self.granted_at = now

    def requeue(self) -> None:
        """The running job went back to the queue: no worker, no deadline. O(1)."""
        self.state = "queued"
        self.worker = None
        self.deadline = None

    def finish(self, state: JobStatus, result: Any, now: float) -> None:
        """The job ended in ``state`` with ``result`` at ``now``; its payload is dropped. O(1).

        No answer returns a finished job's payload (a worker got it with its grant), so it is
        not kept for the result's retention outside the byte budget (issue 30).
        """
        self.state = state
        self.result = result
        self.finished_at = now
        self.deadline = None
        self.payload = None

    def note_result(self, result: Any) -> None:
        """Keep the result of a failed attempt that was requeued (its last word). O(1)."""
        self.result = result

    def drop_payload(self) -> None:
        """Forget the payload (a finished record loaded from an old snapshot). O(1)."""
        self.payload = None

    def shift(self, by: float) -> None:
        """Every time the record holds moves ``by`` seconds earlier (a rebase). O(1)."""
        for name in _RECORD_TIMES:
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value - by)


_RECORD_TIMES: Final = ("submitted_at", "deadline", "granted_at", "finished_at", "expires_at")


@attrs.frozen
class PopResult:
    """What a worker's pop gets: a job, or why there is none."""

    record: JobRecord | None
    idle: Mapping[str, int]
    siblings: tuple[JobRecord, ...] = ()
    """With ``amount > 1``: the further jobs of the record's group granted in the same pop."""


class PopSpec(TypedDict, total=False):
    """A worker's settings as its pop states them (``BrokerEngine.pop``'s keywords)."""

    models: list[str] | None
    resident: str | None
    slots: int
    slow: bool
    capabilities: dict[str, Any] | None


_POP_DEFAULTS: Final[dict[str, Any]] = {
    "models": None, "resident": None, "slots": 1, "slow": False, "capabilities": None,
}  # fmt: skip


def pop_spec(given: Mapping[str, Any]) -> dict[str, Any]:
    """A pop's settings with their defaults: the form the engine keeps and compares. O(1).

    Raises:
        TypeError: A keyword that is not a :class:`PopSpec` field.
    """
    unknown = set(given) - _POP_DEFAULTS.keys()
    if unknown:
        raise TypeError(f"unexpected keyword arguments for a pop: {', '.join(sorted(unknown))}")
    return {**_POP_DEFAULTS, **given}


def fingerprint(args: Mapping[str, Any]) -> str:
    """A stable digest of a submit's arguments, to tell a retry from a different request."""
    body = json.dumps(args, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(body.encode()).hexdigest()


def submit_digest(args: Mapping[str, Any]) -> str:
    """The fingerprint of a submit's arguments (``submit``'s keywords) for its idempotency key.

    Each declared field with a ``digest`` key counts (``prioqueue.jobfields``); a sparse one
    only when set, so a digest made before a field existed is unchanged. O(size of args).
    """
    return fingerprint(
        {
            short: value
            for short, name, sparse in _DIGESTED
            if (value := args.get(name)) is not None or not sparse
        }
    )


_DIGESTED: Final = tuple((f.digest, f.name, f.sparse) for f in JOB_FIELDS if f.digest is not None)


def check_types(op: str, **values: tuple[Any, type | tuple[type, ...]]) -> None:
    """Refuse an operation whose arguments do not have the types the HTTP layer guarantees.

    A live request never fails here (its body was validated); a journal row edited by hand
    does, so replay stops with a clear ``CorruptStore`` instead of serving a record that
    answers 500 later (issue 21). Booleans are not numbers. O(number of arguments).

    Raises:
        Rejected: 422 naming the first argument of the wrong type.
    """
    for name, (value, types) in values.items():
        if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else ()):
            ok = False
        else:
            ok = isinstance(value, types)
        if ok and isinstance(value, float) and not math.isfinite(value):
            ok = False
        if not ok:
            raise Rejected(422, f"{op}: {name} has the wrong type or value ({value!r})", field=name)


_HIDDEN_JOB: Final = "(hidden)"
_HIDDEN_MEMBER: Final = "(another member)"


def redacted(explanation: Any, sees: Callable[[str], bool]) -> Any:
    """``explanation`` with other members' jobs anonymised (ids and members). O(ahead)."""

    def hide(entry: Any) -> Any:
        if sees(entry.member):
            return entry
        return attrs.evolve(entry, job_id=_HIDDEN_JOB, member=_HIDDEN_MEMBER)

    return attrs.evolve(
        explanation,
        ahead=tuple(hide(entry) for entry in explanation.ahead),
        overtaken_by=tuple(hide(entry) for entry in explanation.overtaken_by),
    )


def now_past(now: float, deadline: float) -> bool:
    """Whether ``now`` is at or past a lease ``deadline`` (the lease has run out). O(1)."""
    return now >= deadline
