"""Groups: a label on jobs that belong together (a film's shots), counted state by state.

Theory of operation (the contract is docs/design/chains.md):

* A **group** is a label given at ``submit(..., group=...)``. It changes no score and no lane:
  the dispatcher ranks a grouped job exactly as an ungrouped one. The book only counts.
* The dispatcher calls :meth:`GroupBook.add` after a grouped job is queued and
  :meth:`GroupBook.move` at every later state change of it (grant, requeue, completion,
  cancellation, failure). Those are the only hooks; the book never calls the dispatcher.
* Every job of a group is counted **exactly once, in exactly one state**: ``queued`` or
  ``running`` while the dispatcher holds it, then ``done``, ``failed`` or ``cancelled`` for
  good. A job id reused after its job finished is a new job (counted again).
* ``gpu_seconds`` adds up the time every attempt held the resource (completions, cancels and
  failures while running, and expired leases); ``mean_runtime`` is the mean runtime of the
  ``done`` jobs.
* Groups are kept after their last job finishes (their counts stay readable) until
  :meth:`GroupBook.forget`.

Costs: ``add`` and ``move`` are O(1); ``status`` is O(1) plus the caller's forecast;
``live`` is O(k) for the k jobs queued or running in the group.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from prioqueue._lanes import RUNNING
from prioqueue._validate import checked_name, finite
from prioqueue.errors import UnknownGroup
from prioqueue.views import GroupStatus

if TYPE_CHECKING:
    from prioqueue._lanes import _Entry

__all__ = ["CancelRunning", "GroupState", "group_key", "split_group"]

#: The states a job of a group is counted in.
GroupState = Literal["queued", "running", "done", "failed", "cancelled"]
#: What ``cancel_group`` does with the group's running job.
CancelRunning = Literal["keep", "cancel"]

_LIVE = ("queued", "running")
_FINAL = ("done", "failed", "cancelled")
_STATES = (*_LIVE, *_FINAL)


def group_key(member: str, label: str) -> str:
    """The dispatcher's group for ``member``'s ``label``: how both services key groups. O(len).

    The member's length prefix makes the key unambiguous, so two members' groups with the
    same label never mix (``"a/b"`` of member ``"x"`` is not ``"b"`` of member ``"x/a"``);
    :func:`split_group` reads it back.
    """
    return f"{len(member)}:{member}/{label}"


def split_group(key: str) -> tuple[str, str] | None:
    """``(member, label)`` of a :func:`group_key`, or None for a key of another form. O(len)."""
    size, colon, rest = key.partition(":")
    if not colon or not size.isdigit() or len(rest) <= int(size) or rest[int(size)] != "/":
        return None
    return rest[: int(size)], rest[int(size) + 1 :]


def checked_group(group: object) -> str:
    """Return a group label; ValueError unless it is a non-empty str."""
    return checked_name("group", group)


def checked_running(running: object) -> CancelRunning:
    """Return ``"keep"`` or ``"cancel"``; ValueError otherwise."""
    if isinstance(running, str) and running in ("keep", "cancel"):
        return "keep" if running == "keep" else "cancel"
    raise ValueError(f"running must be 'keep' or 'cancel', got {running!r}")


class _Group:
    """One group's counters and its live jobs (private, mutable)."""

    __slots__ = ("done", "gpu_seconds", "jobs", "members", "name", "runtime", "tally")

    def __init__(self, name: str) -> None:
        self.name = name
        self.members: set[str] = set()
        # Live jobs in submission order (a requeue keeps the place): job id -> its state.
        self.jobs: dict[str, str] = {}
        self.tally = dict.fromkeys(_FINAL, 0)
        self.gpu_seconds = 0.0
        self.runtime = 0.0  # sum of the done jobs' runtimes
        self.done = 0


class GroupBook:
    """The per-group counts of one dispatcher (private; see the module docstring)."""

    __slots__ = ("_active", "_groups", "_of")

    def __init__(self) -> None:
        self._groups: dict[str, _Group] = {}
        self._of: dict[str, _Group] = {}  # live grouped job id -> its group
        self._active = 0  # groups with a live job

    def __contains__(self, group: object) -> bool:
        return group in self._groups

    @property
    def active(self) -> int:
        """Groups with a job queued or running. O(1)."""
        return self._active

    def listing(self) -> list[tuple[str, bool]]:
        """Every known group and whether it is active (a job queued or running). O(groups)."""
        return [(name, bool(record.jobs)) for name, record in self._groups.items()]

    def group_of(self, job_id: str) -> str | None:
        """Return the group of a queued or running job, or None. O(1)."""
        record = self._of.get(job_id)
        return None if record is None else record.name

    def add(self, job_id: str, group: str, member: str) -> None:
        """Count a job of ``member`` just queued in ``group`` (checked by the caller). O(1)."""
        record = self._groups.get(group)
        if record is None:
            record = self._groups[group] = _Group(group)
        record.members.add(member)
        if not record.jobs:
            self._active += 1
        record.jobs[job_id] = "queued"
        self._of[job_id] = record

    def move(self, job_id: str, state: GroupState, used: float = 0.0) -> None:
        """Move a job to ``state``, adding ``used`` seconds on the resource. O(1).

        A job that belongs to no group is ignored, so the dispatcher may call this for every
        job. ``done`` adds ``used`` to the runtime behind ``mean_runtime`` too.
        """
        record = self._of.get(job_id)
        if record is None:
            return
        record.gpu_seconds += used
        if state in _LIVE:
            record.jobs[job_id] = state
            return
        del record.jobs[job_id]
        del self._of[job_id]
        if not record.jobs:
            self._active -= 1
        record.tally[state] += 1
        if state == "done":
            record.done += 1
            record.runtime += used

    def live(self, group: str) -> list[tuple[str, str]]:
        """Return ``(job id, state)`` of the group's queued and running jobs, oldest first.

        Raises:
            UnknownGroup: No job was ever submitted in the group.
        """
        return list(self._record(group).jobs.items())

    def status(self, group: str, *, now: float, finish: float | None) -> GroupStatus:
        """Return the group's status at ``now`` with a forecast computed by the caller.

        Raises:
            UnknownGroup: No job was ever submitted in the group.
        """
        record = self._record(group)
        queued = sum(1 for state in record.jobs.values() if state == "queued")
        tally = record.tally
        return GroupStatus(
            group=group,
            now=now,
            queued=queued,
            running=len(record.jobs) - queued,
            done=tally["done"],
            failed=tally["failed"],
            cancelled=tally["cancelled"],
            gpu_seconds=record.gpu_seconds,
            mean_runtime=record.runtime / record.done if record.done else None,
            forecast_finish=finish if record.jobs else None,
            members=tuple(sorted(record.members)),
        )

    def forget(self, group: str) -> None:
        """Drop a group whose jobs have all finished.

        Raises:
            UnknownGroup: No job was ever submitted in the group.
            ValueError: A job of the group is still queued or running.
        """
        record = self._record(group)
        if record.jobs:
            raise ValueError(
                f"group {group!r} still has {len(record.jobs)} job(s) queued or running; "
                "cancel_group() first"
            )
        del self._groups[group]

    def _record(self, group: str) -> _Group:
        record = self._groups.get(group)
        if record is None:
            raise UnknownGroup(f"no job was ever submitted in group {group!r}")
        return record

    # ------------------------------------------------------------------ persistence

    def dump(self) -> dict[str, Any]:
        """Return every group's counts and live jobs as plain JSON data. O(groups + jobs)."""
        return {
            name: {
                "jobs": [[job_id, state] for job_id, state in record.jobs.items()],
                **record.tally,
                "gpu_seconds": record.gpu_seconds,
                "members": sorted(record.members),
                "runtime": record.runtime,
            }
            for name, record in self._groups.items()
        }

    def load(self, data: object, entries: Mapping[str, _Entry]) -> None:
        """Fill an empty book from ``dump()`` data (None: a snapshot without groups).

        Args:
            data: What ``dump`` returned, possibly through JSON.
            entries: The restored dispatcher's queued and held entries by job id: every live
                job of a group must be there, in the same state.

        Raises:
            ValueError: The data is not a valid dump; the message says what is wrong.
        """
        if data is None:
            return
        state_of = _state_reader(entries)
        if not isinstance(data, Mapping):
            raise ValueError(f"groups must be a mapping, got {type(data).__name__}")
        for name, raw in data.items():
            group = checked_group(name)
            if not isinstance(raw, Mapping):
                raise ValueError(f"group {group!r} must be a mapping")
            record = self._groups[group] = _Group(group)
            for key in _FINAL:
                count = raw[key]
                if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                    raise ValueError(f"group {group!r}: {key} must be an int >= 0, got {count!r}")
                record.tally[key] = count
            record.done = record.tally["done"]
            record.gpu_seconds = finite("gpu_seconds", raw["gpu_seconds"])
            record.runtime = finite("runtime", raw["runtime"])
            members = raw.get("members", [])
            if not isinstance(members, list):
                raise ValueError(f"group {group!r}: members must be a list, got {members!r}")
            record.members = {checked_name("member", m) for m in members}
            for item in raw["jobs"]:
                job_id, state = item
                job_id = checked_name("job id", job_id)
                if state not in _LIVE or state_of(job_id) != state:
                    raise ValueError(
                        f"group {group!r}: job {job_id!r} is {state!r} in the group but "
                        f"{state_of(job_id)!r} in the dispatcher"
                    )
                if job_id in self._of:
                    raise ValueError(f"job {job_id!r} is in two groups")
                record.jobs[job_id] = state
                self._of[job_id] = record
            self._active += bool(record.jobs)

    def check(self, entries: Mapping[str, _Entry]) -> None:
        """Assert the book's invariants against the dispatcher's entries (for tests; O(jobs))."""
        state_of = _state_reader(entries)
        seen = 0
        for record in self._groups.values():
            for job_id, state in record.jobs.items():
                assert state in _LIVE
                assert state_of(job_id) == state, (job_id, state, state_of(job_id))
                assert self._of[job_id] is record
                seen += 1
            assert all(count >= 0 for count in record.tally.values())
            assert record.done == record.tally["done"]
            assert record.gpu_seconds >= 0
        assert seen == len(self._of)
        assert self._active == sum(1 for record in self._groups.values() if record.jobs)


def _state_reader(entries: Mapping[str, _Entry]) -> Callable[[str], str | None]:
    """``job id -> "queued" | "running" | None`` over a dispatcher's entries."""

    def state_of(job_id: str) -> str | None:
        entry = entries.get(job_id)
        if entry is None:
            return None
        return "running" if entry.state == RUNNING else "queued"

    return state_of


def restore_groups(book: GroupBook, data: object, entries: Mapping[str, _Entry]) -> None:
    """Fill a restored dispatcher's book from its snapshot's ``groups`` (None: none kept).

    Raises:
        ValueError: The data is not a valid dump (``invalid snapshot: groups: ...``).
    """
    try:
        book.load(data, entries)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"invalid snapshot: groups: {exc}") from None
