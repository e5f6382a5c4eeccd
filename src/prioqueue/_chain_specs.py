"""The checks of a chain's arguments, before anything is submitted (private to ``chain``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prioqueue._spec import SUBMIT_OPTIONS
from prioqueue.errors import ConfigError

__all__ = ["RESERVED", "check_spec_keys", "checked_policy", "checked_specs"]

RESERVED = ("now", "group")
"""Keys a spec may not set: the chain passes them."""


def checked_policy(policy: object) -> tuple[str, int]:
    """Return the failure policy as ``(kind, retries)``.

    Raises:
        ConfigError: Not ``"stop"``, ``"skip"`` or ``("retry", n)`` with an int n >= 0.
    """
    if policy == "stop" or policy == "skip":  # noqa: PLR1714 (policy may be unhashable)
        return (str(policy), 0)
    if (
        isinstance(policy, tuple)
        and len(policy) == 2
        and policy[0] == "retry"
        and isinstance(policy[1], int)
        and not isinstance(policy[1], bool)
        and policy[1] >= 0
    ):
        return ("retry", policy[1])
    raise ConfigError(
        f"on_failure must be 'stop', 'skip' or ('retry', n) with an int n >= 0, got {policy!r}"
    )


def checked_specs(specs: object) -> list[tuple[str, dict[str, Any]]]:
    """Return the specs as ``(job_id, keyword arguments)`` pairs, in order.

    Raises:
        TypeError: ``specs`` is not an iterable of mappings with str keys.
        ValueError: No spec, a missing or repeated ``job_id``, or a reserved key.
    """
    if isinstance(specs, (str, bytes, Mapping)) or not isinstance(specs, Iterable):
        raise TypeError(
            f"specs must be an iterable of mappings (submit()'s keyword arguments plus "
            f"job_id), got {type(specs).__name__}"
        )
    checked: list[tuple[str, dict[str, Any]]] = []
    seen: set[str] = set()
    for index, spec in enumerate(specs):
        if not isinstance(spec, Mapping):
            raise TypeError(f"spec {index} must be a mapping, got {type(spec).__name__}")
        kwargs = dict(spec)
        job_id = kwargs.pop("job_id", None)
        if not isinstance(job_id, str) or not job_id:
            raise ValueError(f"spec {index} needs a job_id, a non-empty str; got {job_id!r}")
        if job_id in seen:
            raise ValueError(f"spec {index}: job_id {job_id!r} appears twice in the chain")
        for key in kwargs:
            if not isinstance(key, str):
                raise TypeError(f"spec {index} ({job_id!r}): keys must be str, got {key!r}")
            if key in RESERVED:
                raise ValueError(
                    f"spec {index} ({job_id!r}) may not set {key!r}: the chain passes "
                    f"{'its group' if key == 'group' else 'the time of each call'}"
                )
        seen.add(job_id)
        checked.append((job_id, kwargs))
    if not checked:
        raise ValueError("a chain needs at least one spec")
    return checked


def check_spec_keys(submit: Callable[..., Any], specs: list[tuple[str, dict[str, Any]]]) -> None:
    """Refuse a spec key ``submit`` does not take, or a spec missing one it requires.

    Read from ``submit``'s signature (skipped when it takes ``**kwargs`` or has none), so a
    bad spec fails when the chain is built, not halfway through it.
    """
    try:
        parameters = list(inspect.signature(submit).parameters.values())[1:]  # after job_id
    except (TypeError, ValueError):
        return
    # ``**options: Unpack[SubmitOptions]`` (the contract of issue 20) takes SUBMIT_OPTIONS.
    extra = SUBMIT_OPTIONS if any(p.name == "options" for p in parameters) else None
    if extra is None and any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return
    named = [
        p
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        and p.name not in RESERVED
    ]
    allowed = {p.name for p in named} | (extra or set())
    required = [p.name for p in named if p.default is inspect.Parameter.empty]
    for index, (job_id, spec) in enumerate(specs):
        unknown = sorted(set(spec) - allowed)
        if unknown:
            raise ValueError(
                f"spec {index} ({job_id!r}): {', '.join(map(repr, unknown))} is not an "
                f"argument of submit(); allowed: job_id, {', '.join(sorted(allowed))}"
            )
        missing = [name for name in required if name not in spec]
        if missing:
            raise ValueError(
                f"spec {index} ({job_id!r}) needs {', '.join(map(repr, missing))} "
                "(submit() requires it)"
            )
