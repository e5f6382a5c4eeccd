"""The broker's request and response bodies (pydantic models, published in its OpenAPI).

Every request model forbids unknown fields, so a typo is a 422 naming the field rather than a
silently ignored value, and its numbers and flags are strict (``true`` or ``"2"`` is no
number, ``"yes"`` or ``1`` no flag). Sizes are bounded: names 1..200 characters, at most 64
models per worker, 1..16 slots, ``payload`` and ``result`` nested at most
:data:`MAX_JSON_DEPTH` deep (with ``image``, they must also be strict JSON: no lone
surrogates, no NaN or Infinity).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, StringConstraints

from prioqueue.capabilities import FEATURES
from prioqueue.jobfields import checked_labels, field_named

__all__ = [
    "MAX_JSON_DEPTH",
    "BackoffBody",
    "ErrorBody",
    "FailRequest",
    "FinishRequest",
    "Granted",
    "GroupCancelled",
    "GroupView",
    "HeartbeatReply",
    "HeartbeatRequest",
    "HeldJob",
    "JobCreated",
    "JobView",
    "NeedsBody",
    "PopRequest",
    "StatusView",
    "SubmitRequest",
]

Name = Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f]+$")]


def _path_segment(value: str) -> str:
    if "/" in value:
        raise ValueError(
            "a group label may not contain '/' (it is one path segment of /v1/groups/{id})"
        )
    return value


Label = Annotated[Name, AfterValidator(_path_segment)]
JobState = Literal["queued", "running", "done", "failed", "cancelled", "expired"]

MAX_JSON_DEPTH = 64
"""How deep ``payload`` and ``result`` may nest (arrays and objects). The broker answers them
back (pop, job view), and pydantic cannot serialize past 255 levels: a deeper value would be
stored and then turn every answer that carries it into a 500."""


def _sendable(value: Any) -> Any:
    """``value`` unchanged if the broker can answer it back as JSON. O(size), no recursion.

    Raises:
        ValueError: It nests more than :data:`MAX_JSON_DEPTH` deep, or a string (value or
            key) holds a lone surrogate (such as U+D800), which UTF-8 cannot encode, or a
            number is NaN or infinite (Python's parser takes them; a store's journal, JSON,
            refuses them, and the broker would stop).
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    raise ValueError(
                        "a string holds a lone surrogate (\\ud800-\\udfff), not UTF-8 text"
                    ) from None
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise ValueError(f"{item} is no JSON number (NaN and Infinity are refused)")
        elif isinstance(item, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise ValueError(f"nested more than {MAX_JSON_DEPTH} deep (arrays and objects)")
            if isinstance(item, dict):
                stack.extend((key, depth) for key in item)
                stack.extend((child, depth + 1) for child in item.values())
            else:
                stack.extend((child, depth + 1) for child in item)
    return value


OpaqueJson = Annotated[Any, AfterValidator(_sendable)]


def _about(name: str) -> str:
    """The declared description of job field ``name`` (``prioqueue.jobfields``)."""
    return field_named(name).doc


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BackoffBody(_Request):
    """A job's retry delays (docs/design/lifecycle.md)."""

    kind: Literal["constant", "linear", "exponential"] = Field(
        default="constant", description="constant: base; linear: base * n; exponential: "
        "base * 2**(n-1), after failed attempt n."
    )  # fmt: skip
    base: float = Field(default=0.0, ge=0, le=1e9, strict=True, description="Seconds.")
    max: float = Field(default=3600.0, ge=0, le=1e9, strict=True, description="Cap, seconds.")
    jitter: bool = Field(
        default=False, strict=True,
        description="Spread delays by x0.5..1, derived from the job id and attempt.",
    )  # fmt: skip


def _features(value: list[str]) -> list[str]:
    unknown = [name for name in value if name not in FEATURES]
    if unknown:
        raise ValueError(f"unknown features {unknown!r}; allowed: {', '.join(FEATURES)}")
    return value


class NeedsBody(_Request):
    """What a job needs from the worker that runs it (``prioqueue.capabilities.Needs``).

    A worker whose declared capabilities do not cover them is never granted the job; its
    pop's idle reasons name the cause (``max_pixels``, ``lora``, ...).
    """

    models: list[Name] = Field(
        default_factory=list, max_length=100,
        description="The models the job accepts, in order of preference (submit it with "
        "model=null for several; with model set, [] or [model]).",
    )  # fmt: skip
    pixels: int = Field(default=0, ge=0, le=10**12, strict=True, description="width * height.")
    steps: int = Field(default=0, ge=0, le=10**6, strict=True, description="Sampler steps.")
    features: Annotated[list[str], AfterValidator(_features)] = Field(
        default_factory=list, max_length=len(FEATURES),
        description=f"Features it needs, of: {', '.join(FEATURES)}.",
    )  # fmt: skip
    nsfw: bool = Field(default=False, strict=True, description="Marked NSFW.")
    text: str = Field(
        default="", max_length=100_000, description="Text a worker's blacklist is matched against."
    )


class SubmitRequest(_Request):
    """``POST /v1/jobs``: one job."""

    # Each field is declared in prioqueue.jobfields (its description comes from there;
    # tests/test_jobfields.py keeps the two lists equal): what is written here is its wire rule.
    priority: StrictInt | str | None = Field(default=None, description=_about("priority"))
    model: Name | None = Field(default=None, description=_about("model"))
    estimate: float | None = Field(
        default=None, gt=0, le=1e9, strict=True, description=_about("estimate")
    )
    group: Label | None = Field(default=None, description=_about("group"))
    image: Annotated[dict[str, Any], AfterValidator(_sendable)] | None = Field(
        default=None, description=_about("image")
    )
    payload: OpaqueJson = Field(default=None, description=_about("payload"))
    ttl: float | None = Field(default=None, gt=0, le=1e9, strict=True, description=_about("ttl"))
    not_before: float | None = Field(
        default=None, ge=0, le=1e12, strict=True, description=_about("not_before")
    )
    max_attempts: int | None = Field(
        default=None, ge=1, le=1000, strict=True, description=_about("max_attempts")
    )
    backoff: BackoffBody | None = Field(default=None, description=_about("backoff"))
    needs: NeedsBody | None = Field(default=None, description=_about("needs"))
    labels: Annotated[dict[str, str], AfterValidator(checked_labels)] | None = Field(
        default=None, description=_about("labels")
    )


class JobCreated(BaseModel):
    """``201``/``200`` of a submit."""

    id: str


class JobView(BaseModel):
    """``GET /v1/jobs/{id}``."""

    id: str
    state: JobState
    position: int | None = Field(
        description="1-based place in the predicted order; 0 running; null when finished or "
        "more than 100 jobs are ahead."
    )
    explanation: str | None = Field(description="Why the job waits (score terms, jobs ahead).")
    result: Any = Field(description="The worker's result (done or failed), else null.")
    priority: int
    model: str | None
    group: str | None
    attempt: int
    submitted_at: float
    finished_at: float | None
    not_before: float | None = Field(
        default=None,
        description="A queued job that is delayed (not_before, or a retry's backoff): the Unix "
        "time it becomes eligible; else null.",
    )
    expires_at: float | None = Field(
        default=None, description="Unix time at which the job expires if still queued (ttl)."
    )
    labels: dict[str, str] | None = Field(default=None, description=_about("labels"))


class PopRequest(_Request):
    """``POST /v1/workers/{id}/pop``: what the worker serves."""

    models: list[Name] | None = Field(
        default=None, max_length=64, description="Models it serves; null: every model."
    )
    resident: Name | None = Field(default=None, description="The model loaded now.")
    slots: int = Field(default=1, ge=1, le=16, strict=True, description="Jobs it may hold at once.")
    slow: bool = Field(default=False, strict=True, description="Extra-slow worker: leases are 3x.")
    capabilities: dict[str, Any] | None = Field(
        default=None,
        description="What it can run (prioqueue.capabilities.Capabilities: max_pixels, "
        "features, nsfw, max_steps, blacklist, declared_only); null: anything.",
    )


class Granted(BaseModel):
    """``200`` of a pop: the job and its lease."""

    id: str
    payload: Any
    image: dict[str, Any] | None
    model: str | None
    attempt: int
    lease_seconds: float
    deadline: float = Field(description="Unix time at which the lease runs out.")


class FinishRequest(_Request):
    """``POST /v1/jobs/{id}/complete`` and ``/fail``."""

    worker: Name
    attempt: int = Field(ge=1, strict=True)
    result: OpaqueJson = Field(
        default=None, description="The job's result, opaque JSON (at most 64 levels deep)."
    )


class FailRequest(FinishRequest):
    """``POST /v1/jobs/{id}/fail``."""

    retry: bool = Field(
        default=False,
        strict=True,
        description="Queue the job again after its backoff while attempts remain (else: "
        "failed for good).",
    )


class HeartbeatRequest(_Request):
    """``POST /v1/workers/{id}/heartbeat``."""

    resident: Name | None = None


class HeldJob(BaseModel):
    """A job a worker holds, with its grant."""

    id: str
    attempt: int
    deadline: float | None


class HeartbeatReply(BaseModel):
    """The jobs the worker holds: a worker that lost a pop's answer learns them here.

    ``waiting``: the worker's long-poll pops still waiting in the broker (0: none left that
    could be granted a job; a stopping worker need not watch an abandoned poll any longer).
    """

    jobs: list[HeldJob]
    waiting: int = 0


class StatusView(BaseModel):
    """``GET /v1/status``."""

    role: Literal["leader", "standby"]
    leader: str | None
    jobs: dict[str, int]
    workers: int
    totals: dict[str, int]


class GroupView(BaseModel):
    """``GET /v1/groups/{id}``: a group's jobs by state, GPU time and forecast finish."""

    group: str
    member: str = Field(description="Whose group it is (the key's member, or ?member=).")
    queued: int
    running: int
    done: int
    failed: int
    cancelled: int
    gpu_seconds: float = Field(
        description="Seconds its jobs held a worker: every finished attempt, expired leases "
        "included (the running attempts count once they end)."
    )
    mean_runtime: float | None = Field(description="Mean runtime of its done jobs.")
    forecast_finish: float | None = Field(
        description="Broker wall-clock (Unix) time at which its last queued or running job "
        "should finish at the current load (the dispatcher's forecast dry run: no new "
        "arrivals, runtimes from estimates or recent means); null when nothing of it is "
        "queued or running, or a runtime on the way is unknown."
    )
    forecast_seconds: float | None = Field(
        description="Seconds from now to forecast_finish (never negative); null with it."
    )
    now: float = Field(description="The broker's wall-clock time of this answer.")


class GroupCancelled(BaseModel):
    """``DELETE /v1/groups/{id}``: the jobs cancelled."""

    group: str
    member: str = Field(description="Whose group it is (the key's member, or ?member=).")
    cancelled: list[str] = Field(description="The cancelled jobs, oldest submission first.")


class ErrorBody(BaseModel):
    """Every 4xx and 503: what went wrong and, when one is, the field at fault."""

    error: str
    field: str | None = None
    leader: str | None = None
