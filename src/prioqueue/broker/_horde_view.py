"""The ``/api/v2/`` routes' reads and answers, in the AI Horde's shapes (private).

Functions over the engine (run inside ``Broker.query``: they read, never change) and over the
request bodies of :mod:`prioqueue.broker._horde_models`. See docs/horde.md for the mapping.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from prioqueue.broker._groups import group_status
from prioqueue.broker._horde_models import (
    _JOB_TAG,
    AsyncRequest,
    PopRequest,
    SubmitRequest,
    job_uuid,
    worker_uuid,
)
from prioqueue.broker.config import BrokerConfig
from prioqueue.broker.engine import BrokerEngine
from prioqueue.broker.records import AHEAD_LIMIT, FINISHED, MAX_IMAGE_LEASE, JobRecord, Rejected
from prioqueue.lease import ImageRequest

__all__ = [
    "JOB_TAG",
    "SKIPPED",
    "check_request",
    "granted",
    "holder",
    "models",
    "no_job",
    "owner",
    "referenced_blobs",
    "request",
    "result",
    "version",
]

JOB_TAG: Final = _JOB_TAG

SKIPPED: Final[Mapping[str, str]] = {
    "model": "models", "max_pixels": "max_pixels", "max_steps": "step_count",
    "img2img": "img2img", "inpainting": "painting", "controlnet": "controlnet",
    "lora": "lora", "post_processing": "post-processing", "nsfw": "nsfw",
    "blacklist": "blacklist",
}  # fmt: skip
"""Our idle causes -> the Horde's ``skipped`` keys (``NoValidRequestFoundStable``). The
broker's own causes (``slots_full``, ``member_cap``, ``warm_hold``, ``accepts``) have no Horde
key and are left out."""


def check_request(body: AsyncRequest, config: BrokerConfig) -> None:
    """Refuse a request the broker will not queue, before anything changes.

    Raises:
        Rejected: 400 too many images or pixels, too many LoRAs, a lease input the lease
            refuses (an unknown sampler with ``strict_samplers``); 413 a source image or mask
            over ``max_image_bytes``.
    """
    horde = config.horde
    params = body.params
    if params.n > horde.max_images:
        raise Rejected(400, f"params.n is {params.n}, over [horde] max_images={horde.max_images}")
    if params.width * params.height > horde.max_pixels:
        raise Rejected(
            400,
            f"{params.width}x{params.height} is over [horde] max_pixels={horde.max_pixels}",
        )
    for name in ("source_image", "source_mask"):
        value = getattr(body, name)
        if value is not None and len(value) > horde.max_image_bytes:
            raise Rejected(
                413,
                f"{name} is {len(value)} characters, over [horde] "
                f"max_image_bytes={horde.max_image_bytes}",
            )
    image = body.image(horde)
    baselines = set(image.pop("baselines").values()) or {None}
    for baseline in baselines:
        try:
            slow = ImageRequest.from_mapping(
                {**image, "baseline": baseline, "extra_slow_worker": True}
            )
            longest = config.lease.for_request(slow)
        except (TypeError, ValueError) as exc:
            raise Rejected(400, f"params: {exc}") from None
        if longest > MAX_IMAGE_LEASE:
            raise Rejected(400, "params: these inputs give an absurd lease; check the size")


def _records(engine: BrokerEngine, label: str, ids: list[str]) -> list[JobRecord]:
    records = [engine.jobs.get(job_id) for job_id in ids]
    found = [r for r in records if r is not None and r.group == label]
    if len(found) != len(ids):
        raise Rejected(404, "no such request (or its results are past their retention)")
    return found


def owner(engine: BrokerEngine, label: str, ids: list[str]) -> str:
    """The member whose request this is. Raises Rejected: 404."""
    return _records(engine, label, ids)[0].member


def request(engine: BrokerEngine, label: str, ids: list[str], images: bool) -> dict[str, Any]:
    """``RequestStatusCheck`` (``images``: ``RequestStatusStable``, with the generations).

    Raises:
        Rejected: 404 the request is unknown or past its retention.
    """
    records = _records(engine, label, ids)
    states = [r.state for r in records]
    queued = [r for r in records if r.state == "queued"]
    position = wait = 0
    possible = True
    if queued:
        found, _ = engine.position(queued[0])
        position = AHEAD_LIMIT if found is None else found
        workers = [w for w in engine.fleet.workers() if not w.timed_out]
        if workers:
            explained = engine.fleet.explain(
                queued[0].id, now=engine.now, ahead_limit=0, overtakes_limit=0
            )
            possible = len(explained.unfit) < len(workers)
    if queued or "running" in states:
        finish = group_status(engine, label, records[0].member).forecast_finish
        wait = 0 if finish is None else max(0, round(finish - engine.now))
    view: dict[str, Any] = {
        "finished": states.count("done"), "processing": states.count("running"),
        "restarted": sum(max(0, r.attempt - 1) for r in records),
        "waiting": len(queued), "done": all(s in FINISHED for s in states),
        "faulted": any(s in ("failed", "expired") for s in states),
        "wait_time": wait, "queue_position": position, "kudos": 0.0, "is_possible": possible,
    }  # fmt: skip
    if images:
        view["generations"] = [_generation(r) for r in records if r.state == "done"]
        view["shared"] = False
    return view


def _generation(record: JobRecord) -> dict[str, Any]:
    done: Mapping[str, Any] = record.result if isinstance(record.result, dict) else {}
    worker = record.worker or ""
    image = {"img_blob": done["img_blob"]} if "img_blob" in done else {}
    return {
        **image, "id": job_uuid(record.id), "img": str(done.get("img", "")),
        "seed": str(done.get("seed", "")), "worker_id": worker_uuid(worker),
        "worker_name": worker, "model": record.model or "", "state": done.get("state", "ok"),
        "censored": bool(done.get("censored", False)),
        "gen_metadata": list(done.get("gen_metadata") or ()),
    }  # fmt: skip


def no_job(idle: Mapping[str, int]) -> dict[str, Any]:
    """The pop answer when nothing fits: ``id`` null and ``skipped`` counts by Horde cause."""
    skipped: dict[str, int] = {}
    for cause, count in idle.items():
        name = SKIPPED.get(cause)
        if name is not None:
            skipped[name] = skipped.get(name, 0) + count
    return {"id": None, "ids": [], "payload": {}, "skipped": skipped, "model": None}


def granted(
    record: JobRecord, body: PopRequest, siblings: Sequence[JobRecord] = ()
) -> dict[str, Any]:
    """``GenerationPayloadStable``: the job, its payload and its lease as ``ttl``.

    With ``siblings`` (``amount > 1``: further images of the same request, granted in the
    same pop, each with its own lease), ``ids`` lists them after the first and the payload's
    ``n_iter`` counts them; ``ttl`` is the shortest of their leases (the siblings share
    the payload's parameters and model, so their leases are equal).
    """
    assert record.lease_seconds is not None  # a grant has its lease
    horde = record.payload["horde"]
    params = dict(horde["params"])
    steps = params.pop("steps")
    seed = params.pop("seed") or str(int(record.id.rpartition("-")[2]) * 7919 % 2**32)
    ids = [job_uuid(record.id)] + [job_uuid(sibling.id) for sibling in siblings]
    leases = [record.lease_seconds] + [s.lease_seconds or record.lease_seconds for s in siblings]
    payload = {**params, "prompt": horde["prompt"], "ddim_steps": steps, "n_iter": len(ids),
               "seed": seed, "use_nsfw_censor": bool(horde["censor_nsfw"])}  # fmt: skip
    model = record.model or (sorted(body.models)[0] if body.models else None)
    return {
        "id": ids[0], "ids": ids, "payload": payload,
        "model": model, "skipped": {}, "ttl": int(min(leases)),
        "source_image": horde["source_image"], "source_processing": horde["source_processing"],
        "source_mask": horde["source_mask"], "r2_upload": None, "r2_uploads": None,
    }  # fmt: skip


def holder(engine: BrokerEngine, job_id: str) -> tuple[str, int]:
    """The worker and attempt that hold a job. Raises Rejected: 404 unknown; 409 not held."""
    record = engine.jobs.get(job_id)
    if record is None or record.worker is None:
        raise Rejected(404, f"no job {job_uuid(job_id)!r} is held")
    if record.state != "running":
        raise Rejected(409, f"job {job_uuid(job_id)} is {record.state}, not running")
    return record.worker, record.attempt


def result(body: SubmitRequest, blob: str | None = None) -> dict[str, Any]:
    """What the broker keeps of a submitted image (the job's ``result``).

    With ``blob`` the image itself is kept outside the journal, under that key.
    """
    image = {"img": body.generation} if blob is None else {"img_blob": blob}
    return {
        **image, "seed": str(body.seed), "censored": body.censored, "state": body.state,
        "gen_metadata": body.gen_metadata or [],
    }  # fmt: skip


def referenced_blobs(engine: BrokerEngine) -> set[str]:
    """The image keys the kept job records refer to (a sweep keeps them). O(jobs)."""
    return {
        r.result["img_blob"]
        for r in engine.jobs.values()
        if isinstance(r.result, dict) and isinstance(r.result.get("img_blob"), str)
    }


def models(engine: BrokerEngine, kind: str, least: int, most: int | None) -> list[dict[str, Any]]:
    """``GET status/models``: per model, its live workers and queued images. O(jobs + workers).

    ``count`` is the live workers that serve it (a worker serving every model counts for
    each), ``jobs`` its queued images, ``queued`` their megapixel-steps; ``eta`` and
    ``performance`` are not measured (0). Text models: none (this broker serves images).
    """
    if kind != "image":
        return []
    workers = [w for w in engine.fleet.workers() if not w.timed_out]
    jobs: dict[str, int] = {}
    work: dict[str, float] = {}
    for record in engine.jobs.values():
        if record.state != "queued" or not isinstance(record.payload, dict):
            continue
        image = record.image or {}
        names = list((image.get("baselines") or {}).keys()) or [record.model or ""]
        for name in filter(None, names):
            jobs[name] = jobs.get(name, 0) + 1
            size = image.get("width", 0) * image.get("height", 0) * image.get("steps", 0)
            work[name] = work.get(name, 0.0) + size / 1e6
    served = {name for w in workers for name in (w.models or ())} | set(jobs)
    answer = []
    for name in sorted(served):
        count = sum(1 for w in workers if w.models is None or name in w.models)
        if count < least or (most is not None and count > most):
            continue
        answer.append({"name": name, "count": count, "jobs": float(jobs.get(name, 0)),
                       "queued": work.get(name, 0.0), "eta": 0, "performance": 0.0,
                       "type": "image"})  # fmt: skip
    return answer


def version() -> str:
    """The broker's version (``prioqueue-lanes``), for the heartbeat."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("prioqueue-lanes")
    except PackageNotFoundError:  # pragma: no cover - a source checkout
        return "0"
