"""The terms of a grant in :class:`~prioqueue.testing.ReferenceFleet`: lease and charge (private).

``ReferenceCharges`` keeps the fleet's ``lease_for`` and charge model and applies them: the
lease of a grant (a ``LeaseCalculator`` gets the worker's ``slow`` flag) and the charge of a
run, both checked as the real dispatchers check them (``docs/design/fleet.md``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs

from prioqueue.dispatcher import ChargeModel
from prioqueue.errors import LeaseError
from prioqueue.lease import ImageRequest, Lease, LeaseCalculator
from prioqueue.records import Job, WorkerInfo
from prioqueue.testing._records import takes_worker

__all__: list[str] = []  # private module


class ReferenceCharges:
    """A grant's lease and a run's charge.

    Args:
        charge: ``"runtime"``, ``"estimate"``, a constant number of seconds, or a callable
            ``(job, runtime) -> seconds``.
        lease_for: ``(job, worker_info) -> seconds`` or ``job -> seconds``, or None.
    """

    def __init__(self, charge: ChargeModel, lease_for: Callable[..., float] | None) -> None:
        self._charge = charge
        self._lease_for = lease_for
        self._lease_takes_worker = lease_for is not None and takes_worker(lease_for)

    @property
    def leases(self) -> bool:
        """Whether grants carry a lease (``lease_for`` is given)."""
        return self._lease_for is not None

    def lease(self, job: Job, info: WorkerInfo, now: float) -> Lease:
        """The grant's lease; ``LeaseError`` (naming the job) when ``lease_for`` fails."""
        fn = self._lease_for
        assert fn is not None
        calculator: object = fn
        try:
            if isinstance(calculator, LeaseCalculator):  # the slow flag is its extra_slow_worker
                seconds: object = calculator(job)
                if info.slow:
                    payload = job.payload
                    request = (
                        payload
                        if isinstance(payload, ImageRequest)
                        else ImageRequest.from_mapping(payload)
                    )
                    request = attrs.evolve(request, extra_slow_worker=True)
                    seconds = calculator.for_request(request)
            elif self._lease_takes_worker:
                seconds = fn(job, info)
            else:
                seconds = fn(job)
        except Exception as exc:
            raise LeaseError(
                f"lease_for raised for job {job.id!r}: {exc!r}", job_id=job.id
            ) from exc
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, (int, float))
            or not 0 < seconds < math.inf
        ):
            raise LeaseError(f"lease_for returned {seconds!r} for job {job.id!r}", job_id=job.id)
        return Lease(now, seconds)

    def charge(self, job: Job, runtime: float) -> float:
        """The charge model's value for ``job`` run for ``runtime`` (ValueError when bad)."""
        if self._charge == "runtime":
            charge: object = runtime
        elif self._charge == "estimate":
            charge = runtime if job.estimate is None else job.estimate
        elif callable(self._charge):
            charge = self._charge(job, runtime)
        else:
            charge = float(self._charge)
        if isinstance(charge, bool) or not isinstance(charge, (int, float)):
            charge = math.nan
        if not (math.isfinite(charge) and charge >= 0):
            raise ValueError(
                f"the charge model returned {charge!r} for job {job.id!r}; a charge must be a "
                "finite number of seconds >= 0"
            )
        return float(charge)
