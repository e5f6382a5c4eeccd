"""``prioqueue.testing``: what its reference models refuse, and the package's public names.

The models' decisions are checked against the real dispatchers by the stateful harness
(``stateful_support.py``) and the scenario tests; this module checks the edges of their API.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

import prioqueue.testing
from prioqueue import FleetDispatcher, SizeOneDispatcher
from prioqueue.testing import ManualClock, ReferenceDispatcher, ReferenceFleet
from prioqueue.testing._options import DEFAULTS


def test_the_public_names_are_the_three_helpers() -> None:
    assert prioqueue.testing.__all__ == ["ManualClock", "ReferenceDispatcher", "ReferenceFleet"]
    for name in prioqueue.testing.__all__:
        assert getattr(prioqueue.testing, name).__module__.startswith("prioqueue.testing.")


@pytest.mark.parametrize("real", [FleetDispatcher, SizeOneDispatcher])
def test_the_models_defaults_are_the_dispatchers(real: type) -> None:
    """The models keep their own copy of the defaults (the crossing share among them).

    ``ReferenceFleet`` takes ``scorer`` and ``**options``; the options' defaults are its table
    ``DEFAULTS``, which names every option of the dispatchers but the history sizes.
    """
    assert inspect.signature(ReferenceFleet).parameters["scorer"].default is None
    mine: dict[str, Any] = {"scorer": None, **DEFAULTS}
    theirs = inspect.signature(real).parameters
    assert set(theirs) - set(mine) == {"history", "history_bytes"}
    for name, parameter in theirs.items():
        if name in mine:
            assert mine[name] == parameter.default, name


def test_the_reference_dispatcher_takes_only_the_size_one_options() -> None:
    options: dict[str, Any] = {"warm_hold": 30.0}  # a FleetDispatcher option
    with pytest.raises(TypeError, match="warm_hold"):
        ReferenceDispatcher(**options)
    ReferenceDispatcher(max_attempts=2, fair_share=False)  # SizeOneDispatcher's are taken


def test_a_reference_submit_refuses_an_unknown_option_and_keeps_a_group_label() -> None:
    fleet = ReferenceFleet()
    unknown: dict[str, Any] = {"colour": "red"}
    with pytest.raises(TypeError, match="colour"):
        fleet.submit("a", member="ann", now=0.0, **unknown)
    with pytest.raises(ValueError, match="group"):
        fleet.submit("a", member="ann", now=0.0, group="")
    assert len(fleet) == 0
    assert fleet.submit("a", member="ann", now=0.0, group=None).job.id == "a"
    fleet.submit("b", member="ann", now=0.0, group="film")  # for pop_many(siblings=True)
    assert (fleet.group_of("a"), fleet.group_of("b")) == (None, "film")


def test_the_size_one_submit_passes_its_options_on() -> None:
    clock = ManualClock(10.0)
    reference = ReferenceDispatcher()
    ticket = reference.submit("a", member="ann", now=clock(), priority=100, estimate=4.0)
    assert (ticket.job.priority, ticket.job.estimate, ticket.job.arrival) == (100, 4.0, 10.0)
    grant = reference.dispatch(clock.advance(1.0))
    assert grant is not None
    assert (grant.job.id, grant.worker) == ("a", None)
