"""What the gateway's parts share: the gateway as they see it, and an upstream's state.

:class:`Host` is the part of :class:`~prioqueue.gateway.app.Gateway` that its helper modules
(``_observe``, ``_dashboard``, ``_metrics``, ``_paths``, ``_upstreams``, ``_idle``) read and
change. They take a ``Host`` instead of importing the application module, so the import graph
runs one way: ``app`` imports them, they import this module.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

import attrs

from prioqueue.gateway._loaded import Loaded
from prioqueue.gateway.settings import UpstreamConfig

if TYPE_CHECKING:
    import aiohttp

    from prioqueue._driver import Driver
    from prioqueue.dispatcher import SizeOneDispatcher
    from prioqueue.fleet import FleetDispatcher
    from prioqueue.gateway._fleetgate import FleetGate
    from prioqueue.gateway._health import Breaker, HttpStats
    from prioqueue.gateway._history import JobHistory
    from prioqueue.gateway._record import Recorder
    from prioqueue.gateway.settings import GatewayConfig
    from prioqueue.records import Grant
    from prioqueue.ui.model import ForecastCache, Recent

__all__ = ["Host", "Upstream"]


class Host(Protocol):
    """The gateway as its helper modules see it (see ``Gateway`` for each attribute)."""

    config: GatewayConfig
    upstreams: dict[str, Upstream]
    gate: Driver[SizeOneDispatcher | FleetDispatcher]
    dispatcher: SizeOneDispatcher | FleetDispatcher
    fleet_gate: FleetGate | None
    client: aiohttp.ClientSession | None
    started_at: float
    grants: collections.deque[Grant]
    history: JobHistory
    dashboard_state: tuple[Recent, ForecastCache]
    """What the dashboard keeps between two reads (``_dashboard.memory``)."""
    http_stats: HttpStats
    breaker: Breaker
    queued_body_bytes: int
    metrics: Callable[[], bytes] | None
    recorder: Recorder | None
    record_loads: Mapping[str, float]
    loaded: Loaded
    """The single upstream's loaded models and swaps (each fleet upstream has its own)."""
    poll_error: str | None
    """Why the single upstream's last ``/running`` poll failed, or None."""

    def take_out(self, upstream: Upstream, why: str) -> None:
        """Take an upstream out of the fleet (see ``Routes.take_out``)."""


@attrs.define(eq=False)
class Upstream:
    """One upstream's state, as the gateway knows it.

    Attributes:
        config: Its ``[[upstreams]]`` entry.
        origin: ``scheme://host:port`` of its URL.
        path: The path prefix of its URL.
        up: Whether it is in the fleet now.
        models: The models it serves (configured or last read), None: not known yet.
        loaded: The model the dispatcher counts as resident on it (``tracker.primary``).
        swaps: Grants of a model it had not loaded (``tracker.swaps``).
        last_error: Why it was last taken out, or None.
        outages: Times it was taken out.
        models_read_at: When ``/v1/models`` was last read (monotonic).
    """

    config: UpstreamConfig
    origin: str
    path: str
    up: bool = False
    models: tuple[str, ...] | None = None
    loaded: str | None = None
    swaps: int = 0
    last_error: str | None = None
    outages: int = 0
    models_read_at: float = -math.inf
    tracker: Loaded = attrs.field(factory=Loaded)
    """What it has loaded (several models with llama-swap's groups), see ``_loaded``."""

    @classmethod
    def of(cls, config: UpstreamConfig, persistent: frozenset[str] = frozenset()) -> Upstream:
        """Build the state of a configured upstream (down until its first poll).

        ``persistent``: the models ``[resident] persistent`` names (see ``_loaded``).
        """
        parts = urlsplit(config.url)
        origin = f"{parts.scheme}://{parts.netloc}"
        return cls(config, origin, parts.path, models=config.models, tracker=Loaded(persistent))

    @property
    def name(self) -> str:
        """The upstream's name."""
        return self.config.name

    def granted(self, grant: Grant) -> bool:
        """Count a swap when the granted job needs a model it has not loaded; return it."""
        swap = self.tracker.granted(grant.job.model)
        self.swaps = self.tracker.swaps
        self.loaded = self.tracker.primary
        return swap

    def went_down(self, why: str) -> bool:
        """Take it out of the fleet for ``why``; True when it was up (an outage begins)."""
        was_up = self.up
        if was_up:
            self.up = False
            self.outages += 1
        self.last_error = why
        return was_up

    def read_models(self, now: float) -> None:
        """Note that ``/v1/models`` was read at ``now`` (monotonic)."""
        self.models_read_at = now

    def came_up(self, models: tuple[str, ...] | None) -> bool:
        """Put it in the fleet serving ``models``; True when that changed anything."""
        if self.up and models == self.models:
            return False
        self.models = models
        self.up = True
        return True

    def polled(self, models: list[str]) -> str | None:
        """Take the loaded models its ``/running`` lists; return the primary one."""
        self.loaded = self.tracker.polled(models)
        return self.loaded

    def as_dict(self, gateway: Host, *, observer: bool) -> dict[str, Any]:
        """What ``/prioqueue/status`` shows of it (URL and resident model to observers only)."""
        gate = gateway.fleet_gate
        assert gate is not None
        busy = gate.busy_seconds.get(self.name, 0.0)
        held = gate.holding(self.name)
        elapsed = max(1e-9, gate.now() - gateway.started_at)
        return {
            "name": self.name,
            "url": self.config.url if observer else None,
            "state": "up" if self.up else "down",
            "resident_model": self.loaded if observer else None,
            "loaded_models": sorted(self.tracker.models) if observer else None,
            "models": list(self.models) if self.models is not None else None,
            "slots": self.config.slots,
            "slow": self.config.slow,
            "running": held,
            "granted": gate.grants.get(self.name, 0),
            "busy_seconds": round(busy, 3),
            "utilisation": round(min(1.0, busy / elapsed), 4),
            "swaps": self.swaps,
            "outages": self.outages,
            "last_error": self.last_error,
        }
