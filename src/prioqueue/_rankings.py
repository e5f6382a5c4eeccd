"""The rankings that order the backlogged lanes (private; the lanes are ``prioqueue._lanes``).

Theory of operation (see docs/design/dispatcher.md for the model):

* A ``_Ranking`` orders backlogged lanes by one key function: a main heap (no affinity) and one
  heap per model holding the lanes eligible for that model's affinity bonus, keyed with the
  bonus included. The dispatcher keeps one ranking for the real score and, for its reorder
  statistics, one per counterfactual score (without aging, without tier, without fair share).

Every heap item is ``(neg_key, tie, seq, version, lane)``: the highest key first, then the
smaller tie (the lane's ``s``, or the job's arrival), then the smaller submission sequence.
The version makes items unique per lane, so two lanes are never compared.
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heapify, heappop, heappush

from prioqueue._lanes import _Candidate, _Entry, _Lane

__all__: list[str] = []  # private module

# (neg_key, tie, seq, version, lane)
_Item = tuple[float, float, int, int, _Lane]


_BONUS_CACHE = 4096  # models whose affinity bonus is memoised


class _BonusCache(dict[str, float]):
    """``model -> affinity bonus``, memoised (private).

    The scorer is immutable and the bonus is read for every model of every lane touched. At
    most ``_BONUS_CACHE`` models are kept.
    """

    __slots__ = ("_bonus",)

    def __init__(self, bonus: Callable[[str], float]) -> None:
        super().__init__()
        self._bonus = bonus

    def __missing__(self, model: str) -> float:
        value = self._bonus(model)
        if len(self) < _BONUS_CACHE:
            self[model] = value
        return value


#: The rankings: the real score, and the score without one of its terms.
REAL = 0
NO_AGING = 1
NO_TIER = 2
NO_FAIR = 3


class _Ranking:
    """Backlogged lanes ordered by one score (``REAL`` or a counterfactual), with affinity.

    Args:
        kind: The score, with its key and tie-breaker:

            * ``REAL``: ``level + tier + affinity - s / d``, ties by ``s``.
            * ``NO_AGING``: ``level + tier + affinity``, ties by ``s``.
            * ``NO_TIER``: ``level + affinity - s / d``, ties by ``s``.
            * ``NO_FAIR`` (per-job aging): ``level + tier + affinity - arrival / d``, ties by
              the offered job's arrival.

            ``tier`` is the lane head's bonus. The expressions are evaluated exactly as the
            reference model writes them, so float rounding cannot make the two disagree.
        divisor: The aging divisor.
        affinity: ``model -> bonus``.
        window: The affinity window in seconds, or None for "any job of the model".
    """

    __slots__ = ("affinity", "divisor", "kind", "main", "models", "pushed", "window")

    def __init__(
        self, kind: int, divisor: float, affinity: Callable[[str], float], window: float | None
    ) -> None:
        self.kind = kind
        self.divisor = divisor
        self.affinity = affinity
        self.window = window
        self.main: list[_Item] = []
        self.models: dict[str, list[_Item]] = {}
        self.pushed = 0  # items pushed since the last compaction

    def candidate(self, lane: _Lane, model: str) -> _Entry | None:
        """Return the lane's affinity job for ``model`` under this ranking, or None."""
        entry = lane.first_for(model)
        if entry is None:
            return None
        window = self.window
        if window is not None and entry.job.arrival > lane.head().job.arrival + window:
            return None
        return entry

    def push(self, lane: _Lane, head: _Entry, candidates: list[_Candidate]) -> None:
        """Push the lane's main item and one item per affinity candidate. O(M log n).

        The keys are computed inline: this is the dispatcher's hottest loop.
        """
        version = lane.version
        kind = self.kind
        level = lane.level
        s = lane.s
        d = self.divisor
        seq = head.job.seq
        if kind == REAL:
            base = level + head.job.tier_bonus
            heappush(self.main, (-(base + 0.0 - s / d), s, seq, version, lane))
        elif kind == NO_AGING:
            base = level + head.job.tier_bonus
            heappush(self.main, (-(base + 0.0), s, seq, version, lane))
        elif kind == NO_TIER:
            base = level
            heappush(self.main, (-(level + 0.0 - s / d), s, seq, version, lane))
        else:
            base = level + head.job.tier_bonus
            arrival = head.job.arrival
            heappush(self.main, (-(base + 0.0 - arrival / d), arrival, seq, version, lane))
        self.pushed += 1 + len(candidates)
        models = self.models
        for model, aff, entry in candidates:
            if kind in (REAL, NO_TIER):
                item = (-(base + aff - s / d), s, entry.job.seq, version, lane)
            elif kind == NO_AGING:
                item = (-(base + aff), s, entry.job.seq, version, lane)
            else:
                arrival = entry.job.arrival
                item = (-(base + aff - arrival / d), arrival, entry.job.seq, version, lane)
            heap = models.get(model)
            if heap is None:
                models[model] = heap = []
            heappush(heap, item)

    def best(self, resident: str | None) -> tuple[_Lane, _Entry, float] | None:
        """Return ``(lane, entry, affinity)`` of the winner, or None when nothing is queued.

        Every backlogged lane offers its head (the main heap) and, for each model it is
        eligible for, its affinity job with the bonus (that model's heap); the winner is the
        best offer for the resident model. A lane's own affinity offer beats its head offer
        whenever the bonus adds to the same lane key, so taking the better of the two tops is
        exact. Amortised O(log n).
        """
        main = self.main
        while main:
            top = main[0]
            _, _, _, version, lane = top
            if version == lane.version and lane.live:
                break
            heappop(main)
        else:
            return None
        if resident is not None:
            heap = self.models.get(resident)
            while heap:
                other = heap[0]
                _, _, _, version, other_lane = other
                if version == other_lane.version and other_lane.live:
                    if other[:3] < top[:3]:
                        found = self.candidate(other_lane, resident)
                        assert found is not None  # a current item: the lane is eligible
                        return other_lane, found, self.affinity(resident)
                    break
                heappop(heap)
        return lane, lane.head(), 0.0

    def compact(self, live_lanes: int) -> None:
        """Drop stale items when they outnumber live ones. Amortised O(1) per push.

        Each heap holds at most one current item per lane, so once more items were pushed
        since the last compaction than four times the live lanes, most items are stale.
        """
        limit = 4 * live_lanes + 64
        if self.pushed <= limit:
            return
        self.pushed = 0
        if len(self.main) > limit:
            self.main = self._valid(self.main)
        for model, heap in list(self.models.items()):
            if len(heap) > limit:
                kept = self._valid(heap)
                if kept:
                    self.models[model] = kept
                else:
                    del self.models[model]

    @staticmethod
    def _valid(heap: list[_Item]) -> list[_Item]:
        kept = [item for item in heap if item[3] == item[4].version and item[4].live]
        heapify(kept)
        return kept


def rankings(
    divisor: float, affinity: Callable[[str], float], window: float, *, track: bool
) -> tuple[_Ranking, tuple[_Ranking, ...]]:
    """The real ranking, and the counterfactual ones behind the reorder counts when ``track``.

    The counterfactuals: without aging, without the tier bonus, without fair share (the real
    ranking without affinity is its main heap).
    """
    real = _Ranking(REAL, divisor, affinity, window)
    if not track:
        return real, ()
    return real, (
        _Ranking(NO_AGING, divisor, affinity, window),
        _Ranking(NO_TIER, divisor, affinity, window),
        _Ranking(NO_FAIR, divisor, affinity, None),
    )
