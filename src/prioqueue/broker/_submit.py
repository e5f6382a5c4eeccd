"""The broker's submits: one admission check for one job and for a batch (private).

Functions over the engine's parts (:class:`~prioqueue.broker._state.EngineParts`), called by
the journaled ``submit`` and ``submit_many`` of :class:`~prioqueue.broker.engine.BrokerEngine`;
they change the job records through the :class:`~prioqueue.broker.jobbook.JobBook`.

Theory of operation
-------------------
:func:`admit` is the broker's admission check of a batch, built from the two checks a single
``submit`` makes (no other): it refuses the batch, before anything changes, with what a
submit would answer (:class:`~prioqueue.broker.records.Rejected`), each job checked as if
the ones before it had been queued:

* the broker's own rules, per job (``_check``, which ``submit`` calls for its job): the
  arguments' types, a reused ``Idempotency-Key`` (a replay, or 422 for another body), the
  queued bytes (``max_queued_bytes`` and ``max_queued_bytes_per_member``: 413 / 429, counting
  the batch's earlier jobs), ``backoff`` (422);
* the core's: ``FleetDispatcher.admit`` over the batch (``max_queued``,
  ``max_queued_per_member``, a level's ``max_queued``: 429; its ``max_wait``: 503), the rule
  (``_core.queue.refusal``) the core's ``submit`` applies to one job.

The first job refused, in the batch's order, gives the answer; so a batch is admitted if
and only if its jobs, submitted one by one, would all be, and a refusal added to either
place applies to both paths. A batch's ``Idempotency-Key`` names the whole request: one key
space for single and batch submits, a digest of the whole body under the key.

Complexity: the fleet's O(log n + M) per job, O(b x levels) for the check of b jobs, plus
O(size of the arguments).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import attrs

from prioqueue.broker._budget import size_of
from prioqueue.broker._fleet import group_key
from prioqueue.broker._state import EngineParts
from prioqueue.broker.records import JobRecord, Rejected, check_types, fingerprint, submit_digest
from prioqueue.capabilities import Needs
from prioqueue.errors import ConfigError, DuplicateJob, Overloaded, QueueFull
from prioqueue.jobfields import fields_in, names_in
from prioqueue.lifecycle import Backoff

__all__ = ["admit", "submit", "submit_many"]

_KNOWN = fields_in("engine")  # the journaled submit's keywords (prioqueue.jobfields)
_REQUIRED = frozenset(f.name for f in _KNOWN if f.required)
_OPTIONAL = dict.fromkeys(f.name for f in _KNOWN if not f.required)
_KEYWORDS = _REQUIRED | _OPTIONAL.keys()
_TYPED = tuple((f.name, f.journal) for f in _KNOWN if f.journal)
_RULED = tuple((f.name, f.rule) for f in _KNOWN if f.rule is not None)
_TO_CORE = tuple(n for n in names_in("engine", "core") if n != "payload")  # the core's: image
_RECORDED = names_in("engine", "record")
_ALONE: tuple[dict[str, int], int, dict[tuple[str, str], tuple[int, str]]] = ({}, 0, {})
"""A job submitted alone: no batch before it (never written to)."""
_REUSED = "Idempotency-Key was already used with a different request body"


class Fresh(NamedTuple):
    """A job the check admitted: its arguments, their digest, its bytes, backoff and needs."""

    args: Mapping[str, Any]  # every keyword of ``submit`` (absent ones None)
    digest: str
    size: int
    backoff: Backoff | None
    needs: Needs | None


def submit(state: EngineParts, now: float, args: Mapping[str, Any]) -> tuple[JobRecord, bool]:
    """``BrokerEngine.submit``: queue a job, or return the one its idempotency key names."""
    item = _check(state, args, _ALONE)  # admit's check of one job, without its loop
    if isinstance(item, JobRecord):
        return item, False
    assert isinstance(item, Fresh)  # a batch's own replays need a batch
    return _queue(state, now, item, item.args["idempotency_key"]), True


def submit_many(
    state: EngineParts, now: float, jobs: Sequence[Mapping[str, Any]], key: str | None
) -> list[tuple[JobRecord, bool]]:
    """``BrokerEngine.submit_many``: queue every job or none; ``key`` names the whole batch.

    Raises:
        Rejected: what :func:`admit` raises; 422 an empty batch, a ``key`` over jobs of
            several members, or a ``key`` already used with another request.
    """
    if not jobs:
        raise Rejected(422, "jobs: a batch holds at least one job", field="jobs")
    digest = ""
    if key is not None:
        member = jobs[0].get("member")
        if any(args.get("member") != member or args.get("idempotency_key") for args in jobs):
            raise Rejected(
                422,
                "a batch's Idempotency-Key covers jobs of one member without keys of their own",
                field="jobs",
            )
        digest = fingerprint({"batch": [submit_digest(args) for args in jobs]})
        known = _known(state, str(member), key, digest)
        if known is not None:
            return [(record, False) for record in known]
    plan = admit(state, now, jobs)
    results: list[tuple[JobRecord, bool]] = []
    for index, item in enumerate(plan):
        if isinstance(item, JobRecord):
            results.append((item, False))
            continue
        if isinstance(item, int):  # the same key and body as the batch's job ``item``
            results.append((attrs.evolve(results[item][0]), False))
            continue
        try:
            record = _queue(state, now, item, key or item.args["idempotency_key"])
        except Rejected as exc:
            if index == 0:
                raise
            raise RuntimeError(f"a batch was refused half way (a bug): {exc}") from exc
        results.append((record, True))
    if key is not None:
        state.jobs.remember(str(jobs[0]["member"]), key, (r.id for r, _ in results), digest)
    return results


def admit(
    state: EngineParts, now: float, jobs: Sequence[Mapping[str, Any]]
) -> list[JobRecord | Fresh | int]:
    """The broker's admission check of a batch (see the module docstring): reads only.

    Each job gets :func:`_check`, the broker's rules that :func:`submit` applies to one job,
    with the batch's earlier jobs counted; then the core's ``admit`` checks them all, the
    rule the core's ``submit`` applies to one job. A refusal names the job (``jobs[i]``).

    Args:
        state: The engine.
        now: The time of the submit.
        jobs: ``submit``'s keywords, per job.

    Returns:
        Per job: the record its reused key names (a replay), the index of the batch's job
        with the same key and body (a replay of it), or what to queue.

    Raises:
        Rejected: the first refusal of a job, in order (see the module docstring).
    """
    plan: list[JobRecord | Fresh | int] = []
    fresh: list[tuple[int, Fresh]] = []  # the jobs to queue, with their index
    mine: dict[str, int] = {}  # the bytes of the batch's jobs so far, per member
    keys: dict[tuple[str, str], tuple[int, str]] = {}  # the batch's own keys so far
    everyone = 0
    refused: Rejected | None = None
    for index, args in enumerate(jobs):
        try:
            item = _check(state, args, (mine, everyone, keys))
        except Rejected as exc:
            refused = _named(exc, index)
            break
        plan.append(item)
        if isinstance(item, Fresh):
            fresh.append((index, item))
            mine[args["member"]] = mine.get(args["member"], 0) + item.size
            everyone += item.size
            if item.args["idempotency_key"] is not None:
                keys[(args["member"], item.args["idempotency_key"])] = (index, item.digest)
    if fresh:
        found = state.fleet.admit([_core_args(item) for _, item in fresh], now=now)
        if found is not None:
            raise _named(_refusal(found.error), fresh[found.index][0])
    if refused is not None:
        raise refused
    return plan


def _check(
    state: EngineParts,
    args: Mapping[str, Any],
    before: tuple[Mapping[str, int], int, Mapping[tuple[str, str], tuple[int, str]]],
) -> JobRecord | Fresh | int:
    """One job's broker rules: a replay (a kept job, or the batch's job ``int``), or a job.

    ``before``: the batch's jobs before it, their bytes per member and in all, and their keys
    (journals older than batch keys carry a key per job).
    """
    full = {**_OPTIONAL, **args}  # every keyword: read below without .get
    if full.keys() != _KEYWORDS:
        raise TypeError(
            f"submit takes {', '.join(sorted(_REQUIRED))} and optionally "
            f"{', '.join(sorted(_OPTIONAL))}; got {', '.join(sorted(args))}"
        )
    member = full["member"]
    check_types("submit", **{name: (full[name], types) for name, types in _TYPED})
    for name, rule in _RULED:
        try:
            full[name] = rule(full[name])
        except ValueError as exc:
            raise Rejected(422, f"{name}: {exc}", field=name) from None
    digest = ""
    key = full["idempotency_key"]
    if key is not None:
        digest = submit_digest(full)
        known = _known(state, member, key, digest)
        if known is not None:
            return known[0]
        earlier = before[2].get((member, key))
        if earlier is not None:
            if earlier[1] != digest:
                raise Rejected(422, _REUSED, field="Idempotency-Key")
            return earlier[0]
    mine, everyone, _ = before
    size = size_of(full["payload"], full["image"])
    state.jobs.admit_bytes(state.config, member, size, (mine.get(member, 0), everyone))
    backoff = full["backoff"]
    try:
        retry = None if backoff is None else Backoff.from_mapping(backoff)
    except ConfigError as exc:
        raise Rejected(422, str(exc), field="backoff") from None
    return Fresh(full, digest, size, retry, checked_needs(full["needs"], full["model"]))


def checked_needs(needs: dict[str, Any] | None, model: str | None) -> Needs | None:
    """A job's validated :class:`~prioqueue.capabilities.Needs` (None when it states none).

    Raises:
        Rejected: 422 when they are not valid, or name models that disagree with ``model``.
    """
    if needs is None:
        return None
    try:
        value = Needs.from_mapping(needs)
        if model is not None and value.models not in ((), (model,)):
            raise ValueError(f"needs.models {list(value.models)!r} disagrees with model={model!r}")
    except ValueError as exc:
        raise Rejected(422, f"needs: {exc}", field="needs") from None
    return value


def _known(state: EngineParts, member: str, key: str, digest: str) -> tuple[JobRecord, ...] | None:
    """Copies of the jobs ``member``'s ``key`` already names, or None (422: another body)."""
    known = state.jobs.idempotency.get((member, key))
    if known is None:
        return None
    ids, previous = known
    if previous != digest:
        raise Rejected(422, _REUSED, field="Idempotency-Key")
    return tuple(attrs.evolve(state.jobs[job_id]) for job_id in ids)


def _core_args(item: Fresh) -> dict[str, Any]:
    """A job's keywords for the core (``FleetDispatcher.admit`` and ``submit``)."""
    args = item.args
    group = args["group"]
    core = {name: args[name] for name in _TO_CORE}
    core["member"] = args["member"]
    core["group"] = None if group is None else group_key(args["member"], group)
    core["ceiling"] = args["priority"]  # resolved under the key's ceiling: kept below the minimum
    core["backoff"] = item.backoff
    core["needs"] = item.needs
    return core


def _queue(state: EngineParts, now: float, item: Fresh, key: str | None) -> JobRecord:
    """Queue an admitted job in the fleet and keep its record; its copy is returned."""
    args = item.args
    member = args["member"]
    job_id = state.jobs.next_id()
    options = _core_args(item)
    del options["member"]
    try:
        ticket = state.fleet.submit(
            job_id, member=member, payload={"image": args["image"]}, now=now, **options
        )
    except QueueFull as exc:
        raise _refusal(exc) from None
    except DuplicateJob as exc:  # pragma: no cover - ids are never reused
        raise AssertionError(str(exc)) from None
    kept = {name: args[name] for name in _RECORDED}
    kept["idempotency_key"] = key  # the job's own, or its batch's
    record = JobRecord(id=job_id, submitted_at=now, expires_at=ticket.job.deadline, **kept)
    own = args["idempotency_key"] is not None  # a batch's key names the batch once queued
    state.jobs.add(record, item.size, item.digest if own else None)
    state.note_queued(record)
    return attrs.evolve(record)


def _refusal(exc: QueueFull) -> Rejected:
    """The core's refusal as the broker answers it: 429, or 503 for ``max_wait``."""
    if isinstance(exc, Overloaded):
        return Rejected(503, str(exc), field="max_wait", retry_after=exc.retry_after)
    field = "max_queued" if exc.scope == "level" else None
    return Rejected(429, str(exc), field=field, retry_after=exc.retry_after)


def _named(exc: Rejected, index: int) -> Rejected:
    """A refusal of a batch's job ``index``: the message names it, the field stays the limit's.

    The whole batch is refused; ``field`` is what a single submit's refusal names (as before
    batches were checked whole), so a client reads the limit the same way on both paths.
    """
    return Rejected(
        exc.status,
        f"jobs[{index}]: {exc} (the batch is refused whole: no job was queued)",
        field=exc.field,
        retry_after=exc.retry_after,
    )
