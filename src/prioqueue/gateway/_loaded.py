"""What an upstream has loaded, read from llama-swap's ``/running``, and the swaps it costs.

Theory of operation
-------------------
llama-swap may keep several models loaded at once: a ``persistent`` group (an embedding
model beside the chat models), a group with ``swap: false``. Its ``GET /running`` lists every
model that is not stopped, sorted by id: ``{"running": [{"model", "state", ...}, ...]}``. The
dispatcher's affinity term knows one resident model per upstream; :class:`Loaded` keeps the
whole picture and decides which model that is.

* ``models``: what is loaded (``ready`` entries; ``starting`` ones too, they are being
  loaded), from the last poll, updated at each grant.
* ``primary``: the model the dispatcher is told about, the one a swap replaces: the last
  model granted that was not already loaded beside another (a swap brought it in), or, from a
  poll that does not list it, the first listed model not known to stay.
* ``sticky``: models that stay loaded across a swap (a persistent group): those the
  configuration names (``[resident] persistent``), and those a poll after a swap to
  ``primary`` still lists beside it (learnt: until then, the first poll's choice of primary
  among several loaded models is a guess).

A grant is a swap when its model is not loaded (it is what llama-swap will start): then the
models loaded become the sticky ones plus the granted one. A grant of a loaded model that
is not the primary (an embedding request beside the chat model) is no swap and leaves the
primary as it is, so the dispatcher keeps favouring the chat model. Everything is O(entries)
per poll and O(1) per grant.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LOADED_STATES", "Loaded", "loaded_models"]

LOADED_STATES = frozenset({"ready", "starting"})
"""``/running`` states of a model that is (being) loaded."""


def loaded_models(report: Any) -> list[str] | None:
    """The loaded models a ``/running`` report lists (its order), or None if it is no report.

    An entry without ``state`` counts as ready (older llama-swaps). O(entries).
    """
    if not isinstance(report, dict) or not isinstance(report.get("running"), list):
        return None
    return [
        entry["model"]
        for entry in report["running"]
        if isinstance(entry, dict)
        and isinstance(entry.get("model"), str)
        and entry["model"]
        and entry.get("state", "ready") in LOADED_STATES
    ]


class Loaded:
    """One upstream's loaded models and the swaps counted against them (see the module)."""

    __slots__ = ("_swapped", "grants", "models", "persistent", "primary", "sticky", "swaps")

    def __init__(self, persistent: frozenset[str] = frozenset()) -> None:
        self.persistent = persistent
        """Models known to stay (``[resident] persistent``): sticky whatever a poll says."""
        self.models: frozenset[str] = frozenset()
        self.primary: str | None = None
        self.sticky: frozenset[str] = persistent
        self.swaps = 0
        self.grants = 0
        """Grants counted (a poll asked before one and answered after it is stale)."""
        self._swapped = False

    def polled(self, models: list[str]) -> str | None:
        """Take a poll's loaded models (in ``/running`` order); return the primary model."""
        listed = frozenset(models)
        if self._swapped and self.primary in listed:
            # What stayed loaded beside the model a swap brought in is sticky.
            self.sticky = self.sticky | (listed - {self.primary})
            self._swapped = False
        self.sticky = (self.sticky & listed) | self.persistent
        self.models = listed
        if self.primary not in listed:
            others = [m for m in models if m not in self.sticky]
            self.primary = others[0] if others else (models[0] if models else None)
            self._swapped = False
        return self.primary

    def granted(self, model: str | None) -> bool:
        """Count a grant of ``model``; return whether it is a swap (a model to load)."""
        self.grants += 1
        if model is None:
            return False
        if model in self.models:
            if model not in self.sticky:
                self.primary = model
            return False
        self.swaps += 1
        self.models = self.sticky | {model}
        self.primary = model
        self._swapped = True
        return True
