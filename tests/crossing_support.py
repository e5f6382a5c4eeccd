"""Scenarios shared by ``test_crossings.py`` and the services' tests of ``load_seconds``."""

from __future__ import annotations

from typing import Any

from prioqueue.dispatcher import SizeOneDispatcher
from prioqueue.scoring import Scorer, ScoringConfig

__all__ = ["FAST", "ROUND_TRIP", "granted", "granted_affinity", "warm_size_one"]

FAST = Scorer(ScoringConfig(aging_divisor=1.0))  # a point of aging per second

#: Load times of the one-worker scenarios: a swap to ``flux`` and back to ``sd`` costs 150 s.
ROUND_TRIP = {"flux": 90.0, "sd": 60.0}


def granted(d: SizeOneDispatcher, now: float) -> str:
    """The id of the job ``d`` grants at ``now`` (there must be one)."""
    grant = d.dispatch(now=now)
    assert grant is not None
    return grant.job.id


def warm_size_one(d: Any) -> Any:
    """``d`` (a size-one dispatcher, a point of aging per second) after its first crossing.

    Films ``f``, ``g`` and ``h`` have a ``flux`` shot each (batch, at 0); ``f.0`` crossed an
    image at 300 s and finished at 400 s; ``img1`` (``sd``, interactive) has waited 5 s; the
    credit is negative. With ``ROUND_TRIP`` known the next grant is the warm crossing ``g.0``
    (5 s + 100 s < 150 s of loads); without, the deferral to ``img1``.
    """
    for film in ("f", "g", "h"):
        d.submit(f"{film}.0", member=film, priority="batch", model="flux", estimate=100.0, now=0.0)
    d.submit("img0", member="u", priority="interactive", model="sd", estimate=100.0, now=300.0)
    assert granted(d, 300.0) == "f.0"  # a crossing: the credit goes negative
    d.cancel("img0", now=395.0)
    d.submit("img1", member="u", priority="interactive", model="sd", estimate=100.0, now=395.0)
    d.complete("f.0", now=400.0)
    return d


def granted_affinity(fleet: Any, model: str) -> float:
    """The affinity term of a job for ``model`` granted to a worker that has it loaded."""
    fleet.join("gpu", resident=model, now=0.0)
    fleet.submit("j", member="m", model=model, now=0.0)
    grant = fleet.pop("gpu", now=0.0)
    assert grant is not None
    return float(grant.score.swap_affinity)
