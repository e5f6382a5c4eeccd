"""The services' job lifecycle settings: ``[budgets.<level>]`` and ``[backoff]`` (private).

Shared by the gateway's and the broker's TOML (docs/design/lifecycle.md)::

    [budgets.interactive]      # a level: an alias or a number
    max_queued = 50            # 429 beyond
    max_wait = 30              # forecast wait over it: 503 with Retry-After
    ttl = 120                  # a queued job still waiting after 120 s expires

    [backoff]                  # the broker's retry delays (fail with "retry": true)
    kind = "exponential"       # constant | linear | exponential
    base = 5
    max = 300
    jitter = true

Every error names the key by its TOML path (``budgets.interactive.max_wait: must be > 0``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prioqueue._service.config import Table, checked_number, level_key
from prioqueue.lifecycle import BACKOFF_KINDS, Backoff, LevelBudget

if TYPE_CHECKING:
    from prioqueue.priority import PriorityPolicy

__all__: list[str] = []  # private module


def budgets_setting(root: Table, policy: PriorityPolicy) -> dict[int, LevelBudget]:
    """Read ``[budgets.<level>]`` tables (none: no budget). O(levels).

    Raises:
        ConfigError: A level is unknown, a key unknown or a value out of range (named).
    """
    table = root.table("budgets")
    budgets: dict[int, LevelBudget] = {}
    for key in list(table.data):
        level = level_key(table, key, policy)
        entry = table.table(key)
        if level in budgets:
            raise table.fail(key, f"level {level} has two budget tables")
        max_queued = entry.integer("max_queued", None, minimum=1)
        max_wait = entry.number("max_wait", None)
        ttl = entry.number("ttl", None)
        entry.finish()
        budget = LevelBudget(max_queued=max_queued, max_wait=max_wait, ttl=ttl)
        if not budget.empty:
            budgets[level] = budget
    table.finish()
    return budgets


def backoff_setting(root: Table) -> Backoff | None:
    """Read the ``[backoff]`` table (absent: None). O(1).

    Raises:
        ConfigError: A key is unknown or a value out of range (named by its path).
    """
    if root.data.get("backoff") is None:
        root.used.add("backoff")
        return None
    table = root.table("backoff")
    kind = table.string("kind", "constant")
    if kind not in BACKOFF_KINDS:
        raise table.fail("kind", f"must be one of {', '.join(BACKOFF_KINDS)}, got {kind!r}")
    kwargs: dict[str, Any] = {"kind": kind, "jitter": table.boolean("jitter", False)}
    for key in ("base", "max"):
        value = table.get(key)
        if value is not None:
            kwargs[key] = checked_number(table, key, value, positive=False)
    table.finish()
    return Backoff(**kwargs)
