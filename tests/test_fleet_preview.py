"""``FleetDispatcher.would_pop``: the side-effect-free preview of a pop (docs/design/state.md).

Property (the fleet's state machine, every pop previewed first): for random fleets, the
preview equals what the pop at the same ``now`` then returns, and it changes nothing a caller
can see: ``snapshot``, ``stats``, ``explain`` of the live jobs, ``workers()`` (last words
included), ``held``, ``len`` and ``next_deadline`` read the same before and after it. When a
lifecycle timer is due, the preview refuses (``InvalidState``) and still changes nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule, run_state_machine_as_test

from prioqueue import InvalidState, UnknownWorker
from prioqueue.fleet import FleetDispatcher
from prioqueue.records import Grant
from stateful_support import machine_tests, norm
from test_fleet_stateful import SETTINGS, FleetComparison, WithoutFairShare


class PreviewedPops(FleetComparison):
    """The fleet machine, each pop previewed first and checked against the pop."""

    def _light(self) -> Any:
        """What a caller sees without passing ``now`` (no call that could fire a timer)."""
        real = self.real
        return len(real), real.workers(), norm(real.held), real.next_deadline()

    def _full(self, now: float) -> Any:
        """Every read at ``now`` (they fire no timer: none is due when this is called)."""
        real = self.real
        explained = {
            sub.job_id: real.explain(sub.job_id, now=now, ahead_limit=8, overtakes_limit=8)
            for sub in self.live.values()
            if sub.job_id in real
        }
        return (
            self._light(),
            real.snapshot(now=now),
            norm(real.stats(now=now)),
            explained,
        )

    def pop_one(self, name: str) -> Grant | None:
        now = self.clock()
        before = self._light()
        try:
            preview = self.real.would_pop(name, now=now)
        except InvalidState:
            assert self._light() == before, "a refused preview changed the fleet"
            deadline = self.real.next_deadline()
            assert deadline is not None, "refused with no timer"
            assert deadline <= now, "refused with no timer due"
            return super().pop_one(name)
        assert self._light() == before, "the preview changed the fleet"
        full = self._full(now)  # ticks the clock to now: the preview must not need that
        again = self.real.would_pop(name, now=now)
        assert again == preview
        assert self._full(now) == full, "the preview changed the fleet"
        grant = super().pop_one(name)  # the reference's, equal to the real one's but for seq
        assert norm(grant) == norm(preview), (preview, grant)
        assert preview is None or preview in self.real.held  # exactly the real grant
        return grant

    @precondition(lambda self: self.ready and self.slots and self.real.next_deadline() is not None)
    @rule(data=st.data())
    def pop_as_a_timer_falls_due(self, data: st.DataObject) -> None:
        """The clock reaches the next deadline and a worker pops in the same step: no read
        fired the timers first (the invariants' reads do, between steps), so a delayed job's
        release or a ttl may be due and the preview must refuse."""
        deadline = self.real.next_deadline()
        assert deadline is not None
        self.clock.jump_to(max(deadline, self.clock()))
        self.pop_one(data.draw(st.sampled_from(sorted(self.slots))))


class PreviewedPopsWithoutFairShare(PreviewedPops, WithoutFairShare):
    """The same without fair share (every job its own lane)."""


test_previews = machine_tests(
    PreviewedPops, PreviewedPopsWithoutFairShare, machine_settings=SETTINGS
)


def test_an_empty_preview_leaves_the_workers_last_word_and_the_clock() -> None:
    fleet = FleetDispatcher(worker_timeout=100.0)
    fleet.join("w", now=0.0)
    assert fleet.would_pop("w", now=50.0) is None
    assert fleet.worker("w").last_seen == 0.0
    fleet.submit("a", member="ann", now=10.0)  # the clock did not move to 50
    assert fleet.would_pop("w", now=20.0) == fleet.pop("w", now=20.0)


def test_a_timed_out_worker_is_previewed_as_its_pop_revives_it() -> None:
    fleet = FleetDispatcher(worker_timeout=10.0)
    fleet.join("w", now=0.0)
    fleet.join("v", now=0.0)
    fleet.expire(20.0)
    assert fleet.worker("w").timed_out
    fleet.submit("a", member="ann", estimate=8.0, now=21.0)
    preview = fleet.would_pop("w", now=22.0)
    assert fleet.worker("w").timed_out  # the preview revived nothing
    assert preview is not None
    assert preview == fleet.pop("w", now=22.0)


def test_a_due_timer_makes_the_preview_refuse_and_change_nothing() -> None:
    fleet = FleetDispatcher()
    fleet.join("w", now=0.0)
    fleet.submit("later", member="ann", not_before=5.0, now=1.0)
    with pytest.raises(InvalidState, match="timer is due"):
        fleet.would_pop("w", now=6.0)
    assert fleet.not_before("later") == 5.0  # still delayed: nothing fired
    grant = fleet.pop("w", now=6.0)  # the pop fires the release, then grants it
    assert grant is not None
    assert grant.job.id == "later"


def test_bad_calls_raise_as_pop_does() -> None:
    fleet = FleetDispatcher()
    fleet.join("w", now=5.0)
    with pytest.raises(UnknownWorker):
        fleet.would_pop("nobody", now=5.0)
    with pytest.raises(ValueError, match="earlier"):
        fleet.would_pop("w", now=4.0)
    with pytest.raises(ValueError, match="finite"):
        fleet.would_pop("w", now=float("nan"))


@pytest.mark.slow
def test_preview_long_hunt() -> None:
    """A longer run (``-m slow``)."""
    from hypothesis import settings

    run_state_machine_as_test(
        PreviewedPops, settings=settings(SETTINGS, max_examples=300, stateful_step_count=60)
    )
