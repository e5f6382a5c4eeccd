"""``restore``: a new dispatcher built from ``snapshot()`` data (private).

``restored`` builds the facade with the snapshot's ``fair_share`` (and crossing share), then
``persist.load`` fills its state and the group book is loaded against the restored entries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from prioqueue._core.config import restored_options
from prioqueue._core.core import Core
from prioqueue._core.persist import load
from prioqueue._groups import restore_groups
from prioqueue.scoring import Scorer

__all__: list[str] = []  # private module

_D = TypeVar("_D")


def restored(
    make: Callable[..., _D],
    core_of: Callable[[_D], Core],
    state: Mapping[str, Any],
    scorer: Scorer | None,
    now: float | None,
    require_lease: bool,
    options: dict[str, Any],
) -> _D:
    """A new dispatcher (``make(scorer, **options)``) filled from ``snapshot()`` data.

    ``persist.load`` fills its state, then its group book is loaded against the restored
    entries.

    Raises:
        ValueError: The state is not a valid snapshot; the message says what is wrong.
    """
    # The constructor's own errors (ConfigError, TypeError) are not the snapshot's fault.
    dispatcher = make(scorer, **restored_options(state, options))
    d = core_of(dispatcher)  # the facade's own reader of the state it holds
    load(d, state, now, require_lease=require_lease)
    restore_groups(d.groups, state.get("groups"), d.entries)
    return dispatcher
