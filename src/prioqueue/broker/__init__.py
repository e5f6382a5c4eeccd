"""``prioqueue broker``: an HTTP/JSON job broker for a fleet of GPU workers (extra ``broker``).

An adapter: the core never imports it. :func:`create_app` builds the FastAPI application over
a :class:`Broker` (the single writer that journals every operation before acknowledging it)
and its :class:`BrokerEngine` (the deterministic state machine, whose ``@journaled`` methods
are the operations the store journals). See ``docs/broker.md``.

Layout, by role (private modules): the engine's values (``_records``), state (``_state``,
``_budget``) and operations (``_submit``, ``_workers``, ``_groups``, ``_snapshot``) under
``engine``; the driver (``service``, ``_changes``, ``_waiters``); the HTTP layer (``app``
composing ``_http``, ``_job_routes``, ``_worker_routes``, ``_client_routes``, ``_dashboard``,
``_limits``, ``_content``). ``docs/design/broker-store-layout.md`` has the table.
"""

from __future__ import annotations

from prioqueue.broker.app import create_app
from prioqueue.broker.config import BrokerConfig, BrokerKey, load_config, parse_config
from prioqueue.broker.engine import BrokerEngine, JobRecord, Rejected
from prioqueue.broker.journal import MemoryJournal
from prioqueue.broker.service import Broker, Standby

__all__ = [
    "Broker",
    "BrokerConfig",
    "BrokerEngine",
    "BrokerKey",
    "JobRecord",
    "MemoryJournal",
    "Rejected",
    "Standby",
    "create_app",
    "load_config",
    "parse_config",
]
