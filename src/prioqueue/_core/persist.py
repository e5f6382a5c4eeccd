"""Snapshot and restore: a dispatcher's state as plain JSON data (private).

``dump`` writes every queued job in lane order, each lane's settled start, every held job
with its worker, lease and up-front charge, the workers and the groups; ``load`` rebuilds them
without lifting anything (no queued job, lane age or lease is lost). Counters and the grant
history are not kept.

``SizeOneDispatcher`` keeps its format (``prioqueue.dispatcher/1``: one ``running`` job and the
``resident_model``); ``FleetDispatcher`` writes ``prioqueue.fleet/1`` (``held`` and
``workers``). Every value read back is checked (issue 11): finite times within ``+-1e15``,
no lane start after ``taken_at``, unique ids and sequence numbers, attempts >= 1, ints where
ints belong.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Mapping
from typing import Any

import attrs

from prioqueue._core.config import LEVEL_LIMIT, RECENT_PER_KEY
from prioqueue._core.core import Core
from prioqueue._core.persist_workers import _int, dump_workers, granted_as, load_workers
from prioqueue._lanes import PARKED, _Entry
from prioqueue._validate import checked_name, finite, flag, positive_or_none
from prioqueue.capabilities import checked_needs
from prioqueue.errors import DuplicateJob
from prioqueue.lease import Lease
from prioqueue.lifecycle import Backoff
from prioqueue.records import Expired, Grant, Job
from prioqueue.scoring import ScoreBreakdown

__all__: list[str] = []  # private module

SNAPSHOT_FORMAT = "prioqueue.dispatcher/1"
FLEET_FORMAT = "prioqueue.fleet/1"


def dump(d: Core, t: float) -> dict[str, Any]:
    """Return ``d``'s state at time ``t`` as JSON-serialisable data. O(n)."""
    lanes = []
    queued = []
    for lane in d.lanes.by_key.values():
        if d.config.fair_share:
            lanes.append({"member": lane.member, "level": lane.level, "s": lane.settled})
        for entry in lane.queued():
            queued.append(_job_record(entry))
    held = []
    for worker in d.workers.by_name.values():
        for entry in worker.held:
            record = _job_record(entry)
            grant = entry.grant
            record["worker"] = worker.name
            record["granted_at"] = grant.granted_at
            record["lease_seconds"] = None if grant.lease is None else grant.lease.seconds
            record["score"] = attrs.asdict(grant.score)
            record["swap"] = grant.swap
            if grant.job.model != entry.job.model:  # a multi-model job: the grant's choice
                record["granted_model"] = grant.job.model
            record["charged"] = entry.charged
            record["capacity"] = entry.capacity
            moved = d.lanes.crossings.get(entry)
            if moved is not None:
                record["crossing"] = {"weight": moved[0], "basis": moved[1]}
            record["expected_end"] = entry.expected_end
            held.append(record)
    state: dict[str, Any] = {
        "taken_at": t,
        "seq": d.seq,
        "fair_share": d.config.fair_share,
        "lanes": lanes,
        "queued": queued,
        # The crossing credit (bounded crossings): restoring it makes the next deferrals the
        # same as without the restart.
        "crossing_credit": d.lanes.credit,
        "crossing_share": d.config.share,
        # Each level's recent service (the share gate): restoring it makes the next
        # crossings the same as without the restart. Levels that never ran are left out.
        "level_service": {
            str(number): [level.served, level.served_at]
            for number, level in d.lanes.levels.items()
            if level.served
        },
        # The runtimes behind the expected charge: restoring them makes the next grants the
        # same as without the restart.
        "recent": {
            "models": {model: list(r) for model, r in d.lifecycle.runtimes.by_model.items()},
            "levels": {str(level): list(r) for level, r in d.lifecycle.runtimes.by_level.items()},
        },
    }
    # The job lifecycle (docs/design/lifecycle.md): delayed jobs with their release times,
    # and the ttl expiries no ``expire`` has reported yet. Absent when there are none.
    parked = [
        {**_job_record(e), "release_at": e.queued_at}
        for e in d.entries.values()
        if e.state == PARKED
    ]
    if parked:
        state["delayed"] = parked
    if not d.config.fair_share:
        # Each job's own lane, in the order they were made (see ``_in_lane_order``).
        state["lane_order"] = list(d.lanes.by_key)
    if d.lifecycle.timers.lapsed:
        state["lapsed"] = [
            {"job": _job_record_of(x.job, x.attempt), "deadline": x.deadline}
            for x in d.lifecycle.timers.lapsed
        ]
    if d.config.name_in_grants:
        state["format"] = FLEET_FORMAT
        state["held"] = held
        state["workers"] = dump_workers(d)
    else:
        state["format"] = SNAPSHOT_FORMAT
        state["running"] = held[0] if held else None
        state["resident_model"] = next(iter(d.workers.by_name.values())).resident
    state["groups"] = d.groups.dump()
    return state


def load(
    d: Core, state: Mapping[str, Any], now: float | None, *, require_lease: bool = False
) -> None:
    """Fill the new dispatcher ``d`` from ``state`` (``restore.restored`` then loads its groups).

    Raises:
        ValueError: The state is not a valid snapshot; the message says what is wrong.
    """
    fleet = d.config.name_in_grants
    fair = d.config.fair_share
    expected_format = FLEET_FORMAT if fleet else SNAPSHOT_FORMAT
    try:
        if state.get("format") != expected_format:
            raise ValueError(f"format is {state.get('format')!r}, expected {expected_format!r}")
        taken_at = finite("taken_at", state["taken_at"])
        shift = 0.0 if now is None else finite("now", now) - taken_at
        snapshot_fair = flag("fair_share", state["fair_share"])
        top_seq = _int("seq", state["seq"], 0)
        d.restore_start(top_seq, finite("taken_at + shift", taken_at + shift))
        if fair:
            _load_lanes(d, state["lanes"], taken_at, shift)
        seqs: set[int] = set()
        _load_recent(d, finite("crossing_credit", state.get("crossing_credit", 0.0)), state)
        _load_service(d, state.get("level_service", {}), shift)
        if fleet:
            load_workers(d, state["workers"], shift)
        held = [r for r in (state["held"] if fleet else [state["running"]]) if r is not None]
        held_ids = {id(record) for record in held}
        for record in _in_lane_order(d, state, held):
            if id(record) in held_ids:
                _restore_held(d, record, shift, seqs, top_seq, require_lease)
                continue
            job = _job_from_record(d, record, shift, seqs, top_seq)
            if snapshot_fair and fair and (job.member, job.priority) not in d.lanes.by_key:
                raise ValueError(f"job {job.id!r} has no lane record")
            # From a snapshot without fair share, a new lane starts at its oldest job's
            # arrival (an enqueue without a lift does that).
            entry = d.enqueue(
                job,
                attempt=_int("attempt", record["attempt"], 1),
                now=d.now,
                requeue=False,
                lift=False,
            )
            queued_at = record.get("queued_at")
            if queued_at is not None:  # a requeued job's warm hold counts from its requeue
                entry.requeued(finite("queued_at", finite("queued_at", queued_at) + shift))
        if not fair:
            _held_in_grant_order(d, held)
        _load_lifecycle(d, state, shift, seqs, top_seq)
        if not fleet:
            resident = state["resident_model"]
            one = next(iter(d.workers.by_name.values()))
            d.workers.set_resident(
                one, None if resident is None else checked_name("model", resident)
            )
    except KeyError as exc:
        raise ValueError(
            f"invalid snapshot: missing key {exc.args[0]!r} (KeyError; every field snapshot() "
            "writes is needed)"
        ) from exc
    except (TypeError, AttributeError) as exc:
        raise ValueError(
            f"invalid snapshot: a field has the wrong type ({type(exc).__name__}: {exc}); "
            "pass what snapshot() returned"
        ) from exc
    except ValueError as exc:
        raise ValueError(f"invalid snapshot: {exc}") from exc


def _load_lanes(d: Core, records: Any, taken_at: float, shift: float) -> None:
    """Make every lane of a fair-share snapshot again, at its settled start."""
    for record in records:
        member = checked_name("member", record["member"])
        level = _level(record["level"])
        s = finite("lane s", record["s"])
        if s > taken_at:
            raise ValueError(
                f"lane ({member!r}, {level}) starts at {s!r}, after the snapshot was "
                f"taken ({taken_at!r})"
            )
        if (member, level) in d.lanes.by_key:
            raise ValueError(f"lane ({member!r}, {level}) appears twice")
        d.lanes.lane_for((member, level), member, level, s + shift)


def _load_lifecycle(
    d: Core, state: Mapping[str, Any], shift: float, seqs: set[int], top_seq: int
) -> None:
    """The delayed jobs (parked again) and the ttl expiries not yet reported."""
    for record in state.get("delayed", ()):
        job = _job_from_record(d, record, shift, seqs, top_seq)
        release_at = finite("release_at", finite("release_at", record["release_at"]) + shift)
        d.park(job, _int("attempt", record["attempt"], 1), release_at)
    for record in state.get("lapsed", ()):
        # An expired job is gone: its id may be queued again (not "twice").
        job = _job_from_record(d, record["job"], shift, set(), top_seq, known=False)
        d.lifecycle.restore_report(
            Expired(
                job=job,
                attempt=_int("attempt", record["job"]["attempt"], 1),
                deadline=finite("deadline", finite("deadline", record["deadline"]) + shift),
                requeued=False,
                cause="ttl",
            )
        )


def _level(value: object) -> int:
    level = _int("level", value)
    if not -LEVEL_LIMIT <= level <= LEVEL_LIMIT:
        raise ValueError(f"level must lie within +-{LEVEL_LIMIT}, got {level}")
    return level


def _load_recent(d: Core, credit: float, state: Mapping[str, Any]) -> None:
    """Restore the crossing credit and the recent runtimes (older snapshots lack them)."""
    recent = state.get("recent")
    models: dict[str, deque[float]] = {}
    levels: dict[int, deque[float]] = {}
    if recent is not None:
        for model, runtimes in recent["models"].items():
            models[checked_name("model", model)] = _runtimes(runtimes)
        for level, runtimes in recent["levels"].items():
            levels[_level_key("recent levels", level)] = _runtimes(runtimes)
    d.restore_recent(credit, models, levels)


def _level_key(what: str, key: object) -> int:
    """A level written as a JSON object's key (``"-100"``), checked as ``_level`` does."""
    try:
        number = int(key)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise ValueError(f'{what}: a key must be a level number like "-100", got {key!r}') from None
    return _level(number)


def _load_service(d: Core, records: Any, shift: float) -> None:
    """Restore each level's recent service (older snapshots lack it: none)."""
    if not isinstance(records, dict):
        raise ValueError(f"level_service must be an object, got {type(records).__name__}")
    for level, pair in records.items():
        if not isinstance(pair, list) or len(pair) != 2:
            raise ValueError(f"level_service[{level!r}] must be [served, at], got {pair!r}")
        served = finite("level_service served", pair[0])
        if served < 0:
            raise ValueError(f"level_service[{level!r}] served must be >= 0, got {served!r}")
        at = finite("level_service at", finite("level_service at", pair[1]) + shift)
        d.lanes.level(_level_key("level_service", level)).restore_service(served, at)


def _runtimes(values: Any) -> deque[float]:
    runtimes = [finite("recent runtime", value) for value in values]
    if any(value < 0 for value in runtimes) or len(runtimes) > RECENT_PER_KEY:
        raise ValueError(
            f"recent runtimes must be at most {RECENT_PER_KEY} numbers >= 0, got {values!r}"
        )
    return deque(runtimes, maxlen=RECENT_PER_KEY)


def _job_from_record(
    d: Core,
    record: Mapping[str, Any],
    shift: float,
    seqs: set[int],
    top_seq: int,
    *,
    known: bool = True,
) -> Job:
    tier = str(record["tier"])
    model = record["model"]
    estimate = record["estimate"]
    job_id = checked_name("job id", record["id"])
    if known and job_id in d.entries:
        raise DuplicateJob(f"job {job_id!r} appears twice")
    seq = _int("seq", record["seq"], 1)
    if seq in seqs:
        raise ValueError(f"sequence number {seq} appears twice (job {job_id!r})")
    if seq > top_seq:
        raise ValueError(f"job {job_id!r} has seq {seq}, above the snapshot's seq {top_seq}")
    seqs.add(seq)
    arrival = finite("arrival", record["arrival"])
    deadline = record.get("deadline")
    not_before = record.get("not_before")
    max_attempts = record.get("max_attempts")
    backoff = record.get("backoff")
    return Job(
        id=job_id,
        member=checked_name("member", record["member"]),
        priority=_level(record["priority"]),
        tier=tier,
        tier_bonus=d.config.scorer.tier_bonus(tier),
        model=None if model is None else checked_name("model", model),
        estimate=positive_or_none("estimate", estimate),
        arrival=finite("arrival", arrival + shift),
        seq=seq,
        payload=record.get("payload"),
        deadline=None if deadline is None else finite("deadline", finite("d", deadline) + shift),
        not_before=(
            None if not_before is None else finite("not_before", finite("n", not_before) + shift)
        ),
        max_attempts=None if max_attempts is None else _int("max_attempts", max_attempts, 1),
        backoff=None if backoff is None else Backoff.from_mapping(backoff),
        needs=checked_needs(record.get("needs")),
    )


def _in_lane_order(
    d: Core, state: Mapping[str, Any], held: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The queued and held records in the order their lanes must be made again.

    With fair share the lanes come from the snapshot's ``lanes`` list (made before any job), so
    queued jobs go first and held ones after. Without it every job has a lane of its own, made
    when the job entered it (its submit, or the release of a delayed or retried job), and the
    records go in the snapshot's ``lane_order`` (job ids): a lane made elsewhere would change
    the lane order, ``snapshot()["queued"]`` and the ties between lanes. A snapshot without
    that list (older ones) gives ``seq`` order.
    """
    records = [*state["queued"], *held]
    if d.config.fair_share:
        return records
    order = state.get("lane_order")
    if order is None:
        return sorted(records, key=lambda record: _int("seq", record["seq"], 0))
    rank = {job_id: i for i, job_id in enumerate(order)}

    def lane_rank(record: Mapping[str, Any]) -> int:
        found = rank.get(record["id"])
        if found is None:
            raise ValueError(f"job {record['id']!r} is not in lane_order")
        return found

    return sorted(records, key=lane_rank)


def _held_in_grant_order(d: Core, held: list[dict[str, Any]]) -> None:
    """Give each worker its held jobs in the snapshot's (grant) order, not in lane order."""
    position = {record["id"]: i for i, record in enumerate(held)}
    d.workers.order_held(lambda entry: position[entry.job.id])


def _restore_held(
    d: Core,
    record: Mapping[str, Any],
    shift: float,
    seqs: set[int],
    top_seq: int,
    require_lease: bool,
) -> None:
    job = _job_from_record(d, record, shift, seqs, top_seq)
    name = record.get("worker") if d.config.name_in_grants else None
    if d.config.name_in_grants and name is None:
        raise ValueError(f"held job {job.id!r} names no worker (each held job needs its 'worker')")
    found = next(iter(d.workers.by_name.values())) if name is None else d.workers.by_name.get(name)
    if found is None:
        raise ValueError(f"job {job.id!r} is held by unknown worker {name!r}")
    worker = found
    if len(worker.held) >= worker.slots:
        raise ValueError(f"worker {worker.name!r} holds more jobs than its slots")
    seconds = record["lease_seconds"]
    if seconds is None and require_lease:
        raise ValueError(
            f"running job {job.id!r} has no lease: nothing would ever free its resource "
            "(restore it with lease_for and a snapshot taken with leases, or cancel it first)"
        )
    if seconds is not None:
        seconds = finite("lease_seconds", seconds)
        if seconds <= 0:
            raise ValueError(f"lease_seconds must be > 0, got {seconds!r}")
    granted_at = finite("granted_at", finite("granted_at", record["granted_at"]) + shift)
    charged = finite("charged", record.get("charged", 0.0))
    capacity = _int("capacity", record.get("capacity", 1), 1)
    if charged < 0:
        raise ValueError(f"charged must be >= 0, got {charged!r}")
    key: tuple[str, int] | str = (job.member, job.priority) if d.config.fair_share else job.id
    lane = d.lanes.lane_for(key, job.member, job.priority, job.arrival)
    queued_at = record.get("queued_at")
    entry = _Entry(
        job,
        lane,
        _int("attempt", record["attempt"], 1),
        job.arrival if queued_at is None else finite("queued_at", finite("q", queued_at) + shift),
    )
    crossing = _crossing(job, record.get("crossing"))
    end = record.get("expected_end")  # absent in older snapshots: from the recent runtimes
    expected_end = (
        granted_at + d.expected_runtime(job)
        if end is None
        else finite("expected_end", finite("expected_end", end) + shift)
    )
    lease = None if seconds is None else Lease(granted_at=granted_at, seconds=seconds)
    granted_model = record.get("granted_model")
    grant = Grant(
        job=job if granted_model is None else granted_as(job, granted_model),
        score=ScoreBreakdown(**record["score"]),
        lease=lease,
        granted_at=granted_at,
        attempt=entry.attempt,
        waited=granted_at - job.arrival,
        swap=bool(record["swap"]),
        worker=worker.name if d.config.name_in_grants else None,
    )
    charged = charged if d.config.fair_share else 0.0
    entry.hand_to(worker, granted_at, charged, expected_end, capacity, grant)
    d.restore_held(entry, crossing)


def _crossing(job: Job, crossing: Any) -> tuple[float, float] | None:
    """A held job's move of the crossing credit (absent when its grant crossed nothing)."""
    if crossing is None:
        return None
    weight = finite("crossing weight", crossing["weight"])
    basis = finite("crossing basis", crossing["basis"])
    if not -1 <= weight <= 1 or basis < 0:
        raise ValueError(
            f"held job {job.id!r}: crossing weight must lie within [-1, 1] and its basis "
            f"be >= 0, got {crossing!r}"
        )
    return weight, basis


def _job_record(entry: _Entry) -> dict[str, Any]:
    record = _job_record_of(entry.job, entry.attempt)
    record["queued_at"] = entry.queued_at
    return record


def _job_record_of(job: Job, attempt: int) -> dict[str, Any]:
    payload = job.payload
    if payload is not None and not isinstance(payload, (str, int, float, bool)):
        try:
            json.dumps(payload)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"job {job.id!r} has a payload that is not JSON-serialisable: {exc}"
            ) from None
    return {
        "id": job.id,
        "member": job.member,
        "priority": job.priority,
        "tier": job.tier,
        "model": job.model,
        "estimate": job.estimate,
        "arrival": job.arrival,
        "seq": job.seq,
        "payload": payload,
        "attempt": attempt,
        # The lifecycle (None for a job without one; older snapshots lack the keys).
        "deadline": job.deadline,
        "not_before": job.not_before,
        "max_attempts": job.max_attempts,
        "backoff": None if job.backoff is None else job.backoff.as_dict(),
        "needs": None if job.needs is None else job.needs.as_dict(),
    }
