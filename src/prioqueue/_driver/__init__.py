"""The asyncio driver of the core, for one worker or many (private).

:class:`Driver` (``_driver.py``) holds the rules every asyncio front end keeps: one waiter per
job, pull after every change, one lease timer, one attempt per turn, leaving frees the
resource. :class:`~prioqueue.asyncio.AsyncDispatcher` is its one-worker case (over a
``SizeOneDispatcher``); the gateway's ``FleetGate`` its case of one worker per upstream (over
a ``FleetDispatcher``). ``_turn.py`` holds the turn both hand out, ``_core.py`` what the driver
needs of a core. See ``docs/design/driver.md``.
"""

from __future__ import annotations

from prioqueue._driver._core import DrivenCore
from prioqueue._driver._driver import Clock, Driver, ExpiryCallback
from prioqueue._driver._turn import Turn

__all__ = ["Clock", "DrivenCore", "Driver", "ExpiryCallback", "Turn"]
