"""A consumer's lane package: map request kinds and subscription tiers onto prioqueue.

A consumer (a chat bot, a web app) knows *what* each GPU request is for and *who* asked; it
does not want to know about scores. This module is the whole mapping, in one place:

* film shots are batch work (nobody is watching), images and videos are interactive (a human
  is waiting), tool calls are normal;
* the member's subscription tier (free, pro, max) becomes prioqueue's tier, whose bonus orders
  members inside a band;
* a film is a ``Chain`` of shots under one group: it is submitted one shot at a time (the next
  shot when the previous one finishes), so an interactive request never waits for more than
  one shot, and ``group_status`` tells how far the film has got and when it should finish.

The same mapping serves both ways of reaching the GPU: in process, as keyword arguments of
``SizeOneDispatcher.submit`` (or ``AsyncDispatcher.turn``), and over HTTP, as the
``X-LlamaSwap-Priority`` header the gateway reads (there the tier comes from the API key).

Run it: ``python examples/lane_consumer.py``. It replays a small evening on a simulated clock
and prints who got the GPU, when, and why, and the film's status as it goes.
"""

from __future__ import annotations

import enum
from collections import deque
from typing import Any

import attrs

from prioqueue import BATCH, HEADER, INTERACTIVE, NORMAL, PriorityPolicy, SizeOneDispatcher
from prioqueue.chain import Chain


class Kind(enum.Enum):
    """What a GPU request is for."""

    FILM_SHOT = "film shot"
    IMAGE = "image"
    VIDEO = "video"
    TOOL_CALL = "tool call"


#: The band of each kind of request: the number is the interface, the names are ours.
KIND_PRIORITY: dict[Kind, int] = {
    Kind.FILM_SHOT: BATCH,
    Kind.IMAGE: INTERACTIVE,
    Kind.VIDEO: INTERACTIVE,
    Kind.TOOL_CALL: NORMAL,
}

#: Our subscription plans -> prioqueue's tiers (whose bonuses are free 0, pro 1, max 2).
PLAN_TIER: dict[str, str] = {"starter": "free", "creator": "pro", "studio": "max"}

#: The model each kind of request needs loaded.
KIND_MODEL: dict[Kind, str] = {
    Kind.FILM_SHOT: "wan-video",
    Kind.IMAGE: "flux",
    Kind.VIDEO: "wan-video",
    Kind.TOOL_CALL: "qwen-llm",
}

#: Untrusted callers (anything not from our own code) are bounded by this policy.
POLICY = PriorityPolicy(minimum=BATCH, maximum=INTERACTIVE)


@attrs.frozen
class LaneRequest:
    """One GPU request as the consumer sees it."""

    request_id: str
    member: str
    plan: str
    kind: Kind
    seconds: float  # how long it will take on the GPU (known here because we simulate)

    @property
    def priority(self) -> int:
        """The band of this request's kind."""
        return KIND_PRIORITY[self.kind]

    def submit_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``SizeOneDispatcher.submit`` / ``AsyncDispatcher.turn``."""
        return {
            "member": self.member,
            "priority": self.priority,
            "tier": PLAN_TIER[self.plan],
            "model": KIND_MODEL[self.kind],
            "estimate": self.seconds,
        }

    def headers(self) -> dict[str, str]:
        """HTTP headers for the gateway: the priority number (the API key carries the tier)."""
        return {HEADER: str(self.priority)}


def film_shots() -> list[LaneRequest]:
    """A 6-shot film: the chain submitted at the start of the evening."""
    return [
        LaneRequest(f"film-shot-{i}", "dora", "studio", Kind.FILM_SHOT, 240.0) for i in range(1, 7)
    ]


def evening() -> list[tuple[float, LaneRequest]]:
    """Arrivals of a small evening besides the film: images, a video and tool calls."""
    return [
        (30.0, LaneRequest("img-eve", "eve", "starter", Kind.IMAGE, 40.0)),
        (45.0, LaneRequest("img-finn", "finn", "creator", Kind.IMAGE, 40.0)),
        (300.0, LaneRequest("tool-gus", "gus", "starter", Kind.TOOL_CALL, 15.0)),
        (320.0, LaneRequest("video-eve", "eve", "starter", Kind.VIDEO, 480.0)),
        (600.0, LaneRequest("tool-hal", "hal", "studio", Kind.TOOL_CALL, 15.0)),
    ]


def main() -> None:
    """Replay the evening on a simulated clock and print the dispatch order."""
    gpu = SizeOneDispatcher()
    shots = film_shots()
    timed = deque(sorted(evening(), key=lambda a: a[0]))
    by_id = {request.request_id: request for _, request in timed}
    by_id.update((shot.request_id, shot) for shot in shots)
    # The film is one chain: its first shot is queued now, the next one after each finish.
    film = Chain(
        gpu,
        [{"job_id": shot.request_id, **shot.submit_kwargs()} for shot in shots],
        depth=1,
        group="film-dora",
    )

    print("header sent to the gateway for each kind:")
    for kind in Kind:
        print(f"  {kind.value:<10} {HEADER}: {KIND_PRIORITY[kind]}")
    # A header from an untrusted caller is clamped, and capped at that caller's ceiling.
    assert POLICY.parse("1000000") == INTERACTIVE
    assert POLICY.parse("interactive", ceiling=NORMAL) == NORMAL

    print("\n  start  end    job            member  plan     kind       score")
    waits: dict[Kind, list[float]] = {kind: [] for kind in Kind}
    running: tuple[LaneRequest, float] | None = None  # the request on the GPU, and its end
    now = 0.0
    film.start(now=now)  # queues the first shot
    # (time, shots done, predicted finish of the film) after each film event.
    forecasts = [(now, 0, film.forecast_finish(now=now))]
    while True:
        if running is None and (grant := gpu.dispatch(now)) is not None:
            request = by_id[grant.job.id]
            running = (request, now + request.seconds)
            waits[request.kind].append(grant.waited)
            print(
                f"  {now:5.0f}  {running[1]:5.0f}  {request.request_id:<13}  {request.member:<6}  "
                f"{request.plan:<7}  {request.kind.value:<9}  {grant.score}"
            )
        if running is None and not timed:
            break
        # The next event: the running request ends, or a request arrives (ends first on ties).
        if running is not None and (not timed or running[1] <= timed[0][0]):
            request, now = running
            running = None
            gpu.complete(request.request_id, now=now)
            if request.kind is Kind.FILM_SHOT:
                film.completed(request.request_id, now=now)  # queues the next shot
                forecasts.append((now, film.progress.done, film.forecast_finish(now=now)))
        else:
            now, request = timed.popleft()
            gpu.submit(request.request_id, now=now, **request.submit_kwargs())

    # Following the film: its group's status, and how good each finish forecast was.
    print(f"\n{film.status(now=now)}")
    print("film finish forecasts (other work arriving later makes them early):")
    for made_at, done, predicted in forecasts:
        assert predicted is not None  # every shot has an estimate
        print(
            f"  at {made_at:4.0f} s, {done} of {len(shots)} shots done: "
            f"finish at {predicted:4.0f} s (error {now - predicted:+4.0f} s)"
        )

    print("\nlongest wait by kind:")
    for kind, values in waits.items():
        print(f"  {kind.value:<10} {max(values):6.0f} s over {len(values)} request(s)")
    # An interactive request waits for the shot in progress and the interactive requests ahead
    # of it (here one 240 s shot and one 40 s image), never for the whole 24-minute film.
    worst = max(waits[Kind.IMAGE] + waits[Kind.VIDEO])
    assert worst <= 240.0 + 40.0, worst
    print(f"\nworst interactive wait {worst:.0f} s: one film shot plus one image, not the film")


if __name__ == "__main__":
    main()
