"""What a submit takes, written once (private).

Every ``submit`` in the library (the dispatchers, the asyncio driver, the gateway's gate, the
reference models, the simulator's queues) takes ``job_id``, ``member`` and ``now`` by name and
the rest of a job's description as ``**options: Unpack[SubmitOptions]``, so the list of what a
job may carry is spelled here and nowhere else. The core validates the options into a
``JobSpec`` (see below) before it changes any state.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from prioqueue.lifecycle import Backoff

__all__: list[str] = []  # private module


class SubmitOptions(TypedDict, total=False):
    """The optional keyword arguments of every ``submit`` (see ``FleetDispatcher.submit``)."""

    priority: int | str | bytes | None
    tier: str
    model: str | None
    estimate: float | None
    payload: Any
    group: str | None
    ceiling: int | None
    ttl: float | None
    not_before: float | None
    max_attempts: int | None
    backoff: Backoff | Mapping[str, Any] | None


#: The names ``SubmitOptions`` allows, for the run-time check of ``**options``.
SUBMIT_OPTIONS: frozenset[str] = frozenset(SubmitOptions.__annotations__)


def check_options(options: Mapping[str, Any]) -> None:
    """Refuse a keyword that ``SubmitOptions`` does not name.

    Raises:
        TypeError: ``options`` holds an unknown name (the message lists the allowed ones).
    """
    unknown = sorted(set(options) - SUBMIT_OPTIONS)
    if unknown:
        raise TypeError(
            f"submit() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; "
            f"allowed: job_id, member, now, {', '.join(sorted(SUBMIT_OPTIONS))}"
        )
