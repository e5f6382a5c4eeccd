"""What a submit takes, written once (private).

Every ``submit`` in the library (the dispatchers, the asyncio driver, the gateway's gate, the
reference models, the simulator's queues) takes ``job_id``, ``member`` and ``now`` by name and
the rest of a job's description as ``**options: Unpack[SubmitOptions]``, so the list of what a
job may carry is spelled here and nowhere else. The core validates the options into a
``JobSpec`` (see below) before it changes any state.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, NamedTuple, TypedDict

from prioqueue._validate import checked_name, finite, positive_or_none
from prioqueue.capabilities import Needs, checked_needs
from prioqueue.lifecycle import Backoff

#: The largest magnitude of a priority level (after the policy's clamp).
LEVEL_LIMIT = 10**9

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
    needs: Needs | Mapping[str, Any] | None


#: The names ``SubmitOptions`` allows, for the run-time check of ``**options``.
SUBMIT_OPTIONS: frozenset[str] = frozenset(SubmitOptions.__annotations__)


def check_options(
    options: Mapping[str, Any],
    *,
    call: str = "submit()",
    named: str = "job_id, member, now",
    allowed: Collection[str] = SUBMIT_OPTIONS,
) -> None:
    """Refuse a keyword that ``allowed`` (by default ``SubmitOptions``) does not name. O(k).

    Args:
        options: The call's ``**options``.
        call: The call's name, for the message (``turn()`` checks the same options).
        named: Its named arguments, listed before the options as allowed ("" for none).
        allowed: The option names the call takes (the keys of its ``TypedDict``).

    Raises:
        TypeError: ``options`` holds an unknown name (the message lists the allowed ones).
    """
    unknown = sorted(set(options).difference(allowed))
    if unknown:
        names = ", ".join(filter(None, [named, *sorted(allowed)]))
        raise TypeError(
            f"{call} got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; "
            f"allowed: {names}"
        )


class JobSpec(NamedTuple):
    """A submit's options, validated (frozen): what the core (``Core``) files, before any change.

    ``checked`` is the one place a submit's options are validated; ``queue.submit`` makes the
    stored ``Job`` from it once the state has given it its arrival and sequence number.
    """

    member: str
    level: int
    tier: str
    tier_bonus: float
    model: str | None
    estimate: float | None
    payload: Any
    group: str | None
    ttl: float | None
    not_before: float | None
    max_attempts: int | None
    backoff: Backoff | None
    needs: Needs | None

    @classmethod
    def checked(
        cls,
        policy: Any,
        scorer: Any,
        job_id: object,
        member: object,
        /,
        *,
        priority: int | str | bytes | None = 0,
        tier: str = "free",
        model: str | None = None,
        estimate: float | None = None,
        payload: Any = None,
        group: str | None = None,
        ceiling: int | None = None,
        ttl: float | None = None,
        not_before: float | None = None,
        max_attempts: int | None = None,
        backoff: Backoff | Mapping[str, Any] | None = None,
        needs: Needs | Mapping[str, Any] | None = None,
    ) -> JobSpec:
        """Validate ``submit(job_id, member=..., **options)`` (see ``FleetDispatcher.submit``).

        The keywords are ``SubmitOptions``' (a test keeps the two lists equal); the caller
        refuses unknown ones first (``check_options``). Keyword binding is done by the
        interpreter: the hot path reads no option by name.

        Raises:
            TypeError: A ``priority`` no header could have, a ``ceiling`` that is not an int,
                or a ``backoff`` of the wrong type.
            ValueError: An option is out of range.
        """
        if not isinstance(job_id, str) or not job_id:
            raise ValueError(f"job_id must be a non-empty str, got {job_id!r}")
        member = checked_name("member", member)
        level = policy.parse(priority, ceiling)
        if not -LEVEL_LIMIT <= level <= LEVEL_LIMIT:
            shown = str(level) if len(str(level)) <= 30 else f"{str(level)[:27]}..."
            raise ValueError(
                f"priority must resolve to a level within +-{LEVEL_LIMIT}, got {shown} "
                "(bound it with PriorityPolicy(minimum=..., maximum=...))"
            )
        tier_bonus = scorer.tier_bonus(tier)
        if model is not None:
            model = checked_name("model", model)
        estimate = positive_or_none("estimate", estimate)
        if group is not None:
            group = checked_name("group", group)
        ttl = positive_or_none("ttl", ttl)
        if not_before is not None:
            not_before = finite("not_before", not_before)
        if max_attempts is not None and (
            not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1
        ):
            raise ValueError(f"max_attempts must be an int >= 1 or None, got {max_attempts!r}")
        backoff = backoff if backoff is None else _backoff(backoff)
        needs = needs if needs is None else _needs(needs, model)
        fields = (member, level, tier, tier_bonus, model, estimate, payload, group, ttl)
        return new_spec(cls, (*fields, not_before, max_attempts, backoff, needs))


new_spec = tuple.__new__  # builds a JobSpec without its Python-level __new__


def _needs(needs: object, model: str | None) -> Needs | None:
    checked = checked_needs(needs)
    if checked is not None and model is not None and checked.models not in ((), (model,)):
        raise ValueError(
            f"needs.models {list(checked.models)!r} disagrees with model={model!r}: a job "
            "that accepts several models is submitted with model=None"
        )
    return checked


def _backoff(backoff: object) -> Backoff | None:
    if backoff is None or isinstance(backoff, Backoff):
        return backoff
    if isinstance(backoff, Mapping):  # JSON data (a journal keeps calls as JSON)
        return Backoff.from_mapping(backoff)
    raise TypeError(f"backoff must be a Backoff or None, got {type(backoff).__name__}")
