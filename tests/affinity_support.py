"""A scenario shared by ``test_dispatcher_scenarios.py`` and the lift-refund prototype's test."""

from __future__ import annotations

from typing import Any

__all__ = ["film_passed_by_newcomers"]


def film_passed_by_newcomers(d: Any) -> float:
    """When a film's job for ``wan`` goes while one-off members keep asking for ``flux``.

    ``flux`` is resident. The film's job arrives at 0; each minute a new member submits a job
    for ``flux``, and each job runs a minute. ``d`` is a fresh dispatcher (the real one or the
    reference model, at the default scoring: a divisor of 60 s, an affinity of 10). Returns
    the time of the film's grant.
    """
    d.set_resident_model("flux")
    d.submit("film", member="film", model="wan", estimate=60.0, now=0.0)
    now = 0.0
    for i in range(200):
        d.submit(f"u{i}", member=f"u{i}", model="flux", estimate=60.0, now=now)
        grant = d.dispatch(now)
        assert grant is not None
        if grant.job.id == "film":
            return now
        now += 60.0
        d.complete(grant.job.id, now=now)
    raise AssertionError("the film's job never went")
