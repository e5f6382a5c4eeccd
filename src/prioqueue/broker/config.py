"""The broker's configuration: a TOML file, validated when it is read.

Theory of operation
-------------------
Everything the broker needs is in one frozen :class:`BrokerConfig`, built by
:func:`load_config` (a file plus the command line's overrides) or :func:`parse_config` (an
already-parsed mapping). Validation happens once, at start; a bad value raises
:class:`~prioqueue.ConfigError` whose message names the key by its TOML path, for instance
``keys."sk-w1".role: must be "submitter" or "worker", got 'admin'``. Unknown keys are errors.
The ``[policy]``, ``[tiers]`` and ``[scoring]`` tables read exactly as the gateway's.

A minimal file::

    listen = "127.0.0.1:8091"
    store = "sqlite:broker.db"

    [keys."sk-alice"]
    role = "submitter"
    member = "alice"
    tier = "pro"
    max_priority = 100

    [keys."sk-gpu"]
    role = "worker"
    workers_prefix = "gpu-"

A worker key must say which worker ids it may act as (``workers``, ``workers_prefix``, or
both; ``workers_prefix = ""`` allows any id): a key without either is a configuration error,
so an upgraded configuration never lets one worker act as another silently.

``examples/broker.toml`` documents every key.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Literal

import attrs

from prioqueue._service.config import (
    Table,
    api_key_entries,
    charge_setting,
    default_tier,
    listen_setting,
    load_document,
    load_seconds_setting,
    start_document,
    tier_setting,
)
from prioqueue._service.lifecycle import backoff_setting, budgets_setting
from prioqueue._service.serving import ConnectionSettings
from prioqueue.broker._horde_config import HordeConfig, horde_setting
from prioqueue.errors import ConfigError
from prioqueue.lease import LeaseCalculator
from prioqueue.lifecycle import Backoff, LevelBudget
from prioqueue.priority import PriorityPolicy
from prioqueue.scoring import ScoringConfig

__all__ = [
    "DEFAULT_LISTEN",
    "DEFAULT_STORE",
    "BrokerConfig",
    "BrokerKey",
    "Connections",
    "load_config",
    "parse_config",
]

DEFAULT_LISTEN: Final = "127.0.0.1:8091"
"""Where the broker listens unless told otherwise (loopback only)."""
DEFAULT_STORE: Final = "sqlite:prioqueue-broker.db"
"""The default store: an SQLite file in the working directory."""

Role = Literal["submitter", "worker"]
_LEASE_KEYS: Final = (
    "fixed_seconds",
    "seconds_per_work_pixel_unit",
    "controlnet_multiplier",
    "minimum_seconds",
    "lora_file_megabytes",
    "lora_bandwidth_mbps",
    "extra_slow_multiplier",
)


@attrs.frozen
class Connections(ConnectionSettings):
    """The broker's connection limits: the ``[connections]`` table (the gateway's names).

    Attributes:
        header_timeout: Seconds a connection may take to send a request's headers (and an
            idle new connection may wait before sending anything); closed after it.
        idle_timeout: Seconds an idle keep-alive connection stays open between requests.
        body_timeout: Seconds a client may take to send a request's whole body (408).
        max_header_bytes: Largest single header line, name and value (431 beyond).
        max_headers_bytes: Largest request line plus all headers together (431 beyond).
        max_header_count: Most headers in one request (431 beyond).
        max_connections: Most connections open at once, or None: the open-file limit at
            start (raised to its hard limit) less a reserve. One more closes the oldest idle
            connection, or is answered 503 and closed when none is idle.
        max_idle_connections: Most idle connections (no complete request yet); one more
            closes the oldest idle one. None: half of ``max_connections``.
        shutdown_grace_seconds: How long requests in flight may finish at shutdown.
    """

    idle_timeout: float = 5.0


@attrs.frozen
class BrokerKey:
    """Who an API key belongs to and what it may do.

    Attributes:
        role: ``"submitter"`` (submits, watches and cancels its member's jobs) or
            ``"worker"`` (pops, completes, fails and heartbeats).
        workers: The worker ids a worker key may act as (exact names), or None.
        workers_prefix: A worker key may also act as every id starting with this (``""``:
            any id), or None.
        member: The member a submitter's jobs are charged to (None for a worker).
        tier: The member's tier (None for a worker).
        max_priority: The highest priority a submitter may ask for; higher values are capped.
        observer: A submitter that may read any member's group (``GET /v1/groups/{id}``
            with ``?member=``); without it a key sees only its own member's groups.
        admin: A submitter that may also cancel any member's group (``DELETE
            /v1/groups/{id}`` with ``?member=``); implies ``observer``.
    """

    role: Role
    member: str | None = None
    tier: str | None = None
    max_priority: int = 0
    observer: bool = False
    admin: bool = False
    workers: frozenset[str] | None = None
    workers_prefix: str | None = None

    def may_act_as(self, worker: str) -> bool:
        """Whether this (worker) key may use worker id ``worker``. O(1) + O(len(prefix))."""
        if self.workers is not None and worker in self.workers:
            return True
        return self.workers_prefix is not None and worker.startswith(self.workers_prefix)

    def worker_rule(self) -> str:
        """The key's worker-id rule in words, for a 403 (names ids, never the key)."""
        rules = []
        if self.workers is not None:
            rules.append("workers = [" + ", ".join(f'"{w}"' for w in sorted(self.workers)) + "]")
        if self.workers_prefix is not None:
            rules.append(f'workers_prefix = "{self.workers_prefix}"')
        return " or ".join(rules) or "no worker ids"

    def may_read(self, member: str) -> bool:
        """Whether this key may read ``member``'s groups. O(1)."""
        return member == self.member or self.observer or self.admin

    def may_cancel(self, member: str) -> bool:
        """Whether this key may cancel ``member``'s groups. O(1)."""
        return member == self.member or self.admin


@attrs.frozen
class BrokerConfig:
    """The whole broker configuration.

    Attributes:
        host: The address to listen on.
        port: The port to listen on (0: any free port).
        advertise: This replica's address as standbys report it (``http://host:port``).
        store: The store URL: ``sqlite:///relative/path.db`` (or ``sqlite:relative/path.db``),
            ``sqlite:////absolute/path.db`` (four slashes, SQLAlchemy's convention),
            ``postgresql://...`` or ``memory://``
            (nothing survives a restart; for tests and demos).
        store_schema: The PostgreSQL schema holding the broker's tables (None: the store's
            default).
        keys: API key -> who it is.
        policy: How priorities (body or ``X-LlamaSwap-Priority``) become numbers.
        scoring: The score's weights (tier bonuses included).
        lease: The image lease calculator (``[lease]`` overrides its constants).
        default_lease_seconds: The lease of a job without ``image`` lease inputs.
        max_attempts: Grants a job gets (expired leases and retried failures alike), for jobs
            that do not name their own ``max_attempts``.
        worker_timeout_seconds: A worker silent this long loses its jobs (None: never).
        max_queued: Most jobs waiting at once (429 beyond), or None.
        max_queued_per_member: Most jobs one member may have waiting, or None.
        max_running_per_member: Most jobs one member may have running, or None.
        max_queued_bytes: Most payload bytes (JSON-encoded ``payload`` plus ``image``) held
            by queued jobs together (429 beyond; a single job over it is a 413), or None.
        max_queued_bytes_per_member: The same, for one member's queued jobs, or None.
        warm_hold_seconds: How long a job is held for a worker with its model loaded.
        load_seconds: Each model's cold-load time in seconds (``[load_seconds]``): the fleet
            prices a model's affinity by it (a cold job is not held for more than the swap it
            saves; docs/design/fleet.md). Empty: none known (the scorer's affinity).
        fair_share: Whether fair share inside a level is on.
        charge: Fair-share charge model: ``"runtime"``, ``"estimate"`` or seconds per job.
        max_body_bytes: Largest request body read (413 beyond).
        result_max_bytes: Largest result (JSON-encoded) a worker may store (413 beyond).
        result_ttl_seconds: How long a finished job and its result stay readable.
        retry_after_seconds: The ``Retry-After`` of a standby's or a full queue's answer.
        leader_lease_seconds: How long a leader's lease lasts without renewal (PostgreSQL).
        snapshot_every: Take a snapshot after this many journal entries.
        sqlite_synchronous: ``"full"`` (fsync every commit: survives a power loss) or
            ``"normal"`` (survives a process crash, not a power loss; faster).
        metrics_public: Whether ``GET /metrics`` is served without a key (else it needs an
            ``observer`` or ``admin`` key: its labels name members).
        connections: Header size, count and time limits, the body timeout and the most
            connections at once (the ``[connections]`` table; the gateway's limits).
        forget_workers_seconds: A worker that holds no job and has not been seen for this
            long is forgotten (its id no longer counted, its spec dropped).
        budgets: Overload protection per level (``[budgets.<level>]``: ``max_queued`` 429,
            ``max_wait`` 503, ``ttl``); none by default (docs/design/lifecycle.md).
        backoff: The retry delays of ``fail`` with ``"retry": true`` for jobs without their own
            (``[backoff]``; None: retry at once).
        horde: The AI Horde compatible routes (``[horde]``; docs/horde.md).
    """

    host: str = "127.0.0.1"
    port: int = 8091
    advertise: str = "http://127.0.0.1:8091"
    store: str = DEFAULT_STORE
    store_schema: str | None = None
    keys: Mapping[str, BrokerKey] = attrs.field(factory=dict)
    policy: PriorityPolicy = attrs.field(factory=PriorityPolicy)
    scoring: ScoringConfig = attrs.field(factory=ScoringConfig)
    lease: LeaseCalculator = attrs.field(factory=LeaseCalculator)
    default_lease_seconds: float = 900.0
    max_attempts: int = 3
    worker_timeout_seconds: float | None = 120.0
    max_queued: int | None = None
    max_queued_per_member: int | None = None
    max_running_per_member: int | None = None
    max_queued_bytes: int | None = 256 * 1024 * 1024
    max_queued_bytes_per_member: int | None = None
    warm_hold_seconds: float = 0.0
    load_seconds: Mapping[str, float] = attrs.field(factory=dict)
    fair_share: bool = True
    charge: str | float = "runtime"
    max_body_bytes: int = 1024 * 1024
    result_max_bytes: int = 256 * 1024
    result_ttl_seconds: float = 86_400.0
    retry_after_seconds: float = 2.0
    leader_lease_seconds: float = 10.0
    snapshot_every: int = 10_000
    sqlite_synchronous: str = "full"
    metrics_public: bool = False
    connections: Connections = attrs.field(factory=Connections)
    forget_workers_seconds: float = 3600.0
    budgets: Mapping[int, LevelBudget] = attrs.field(factory=dict)
    backoff: Backoff | None = None
    horde: HordeConfig = attrs.field(factory=HordeConfig)

    @property
    def listen(self) -> str:
        """``host:port`` (IPv6 hosts in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def _check_store(value: str, where: str) -> str:
    if value == "memory://":
        return value
    if value.startswith("sqlite:"):
        from prioqueue.store import sqlite_path

        try:
            sqlite_path(value)
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        return value
    if value.startswith(("postgresql://", "postgres://")):
        return value
    raise ConfigError(
        f"{where}: expected 'sqlite:PATH' (sqlite:///relative.db, sqlite:////absolute.db), "
        f"'postgresql://...' or 'memory://', got {value!r}"
    )


def _keys(root: Table, tiers: Mapping[str, float]) -> dict[str, BrokerKey]:
    keys: dict[str, BrokerKey] = {}
    for key, entry in api_key_entries(root):
        role = entry.string("role", "")
        if role == "worker":
            for flag in ("observer", "admin"):
                if entry.get(flag) is not None:
                    raise entry.fail(
                        flag, "only a submitter key may have it (it is about members' groups)"
                    )
            workers, prefix = _worker_ids(entry)
            keys[key] = BrokerKey(role="worker", workers=workers, workers_prefix=prefix)
        elif role == "submitter":
            for name in ("workers", "workers_prefix"):
                if entry.get(name) is not None:
                    raise entry.fail(name, "only a worker key may have it")
            member = entry.string("member", "")
            if not member:
                raise entry.fail("member", "is required for a submitter")
            keys[key] = BrokerKey(
                role="submitter",
                member=member,
                tier=tier_setting(entry, "tier", tiers, default_tier(tiers)),
                max_priority=entry.integer("max_priority", 0),  # type: ignore[arg-type]
                observer=entry.boolean("observer", False),
                admin=entry.boolean("admin", False),
            )
        else:
            raise entry.fail("role", f'must be "submitter" or "worker", got {role or None!r}')
        entry.finish()
    return keys


def _worker_ids(entry: Table) -> tuple[frozenset[str] | None, str | None]:
    raw = entry.get("workers")
    prefix = entry.get("workers_prefix")
    workers: frozenset[str] | None = None
    if raw is not None:
        if not isinstance(raw, list) or not raw or not all(isinstance(w, str) and w for w in raw):
            raise entry.fail("workers", f"must be a non-empty list of worker ids, got {raw!r}")
        workers = frozenset(raw)
    if prefix is not None and not isinstance(prefix, str):
        raise entry.fail("workers_prefix", f"must be a string, got {prefix!r}")
    if workers is None and prefix is None:
        raise entry.fail(
            "workers",
            'a worker key names the worker ids it may act as: workers = ["gpu-a", "gpu-b"] '
            'and/or workers_prefix = "gpu-" (workers_prefix = "" allows any id: only for '
            "workers that all trust each other)",
        )
    return workers, prefix


def _connections(root: Table) -> Connections:
    table = root.table("connections")
    defaults = Connections()
    kwargs: dict[str, Any] = {}
    for name in ("header_timeout", "idle_timeout", "body_timeout", "shutdown_grace_seconds"):
        kwargs[name] = table.number(name, getattr(defaults, name))
    for name in ("max_header_bytes", "max_headers_bytes", "max_header_count"):
        kwargs[name] = table.integer(name, getattr(defaults, name), minimum=1)
    kwargs["max_connections"] = table.integer("max_connections", None, minimum=1)
    kwargs["max_idle_connections"] = table.integer("max_idle_connections", None, minimum=1)
    table.finish()
    return Connections(**kwargs)


def _lease(root: Table) -> LeaseCalculator:
    table = root.table("lease")
    kwargs: dict[str, Any] = {}
    for key in _LEASE_KEYS:
        value = table.number(key, None, positive=False)
        if value is not None:
            kwargs[key] = value
    strict = table.get("strict_samplers")
    if strict is not None:
        kwargs["strict_samplers"] = table.boolean("strict_samplers", False)
    slow = table.table("slow_baseline_multipliers")
    if slow.data:
        kwargs["slow_baseline_multipliers"] = {name: slow.number(name, None) for name in slow.data}
    table.finish()
    try:
        return LeaseCalculator(**kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{root.source}lease: {exc}") from None


def _synchronous(root: Table) -> str:
    value = root.string("sqlite_synchronous", "full")
    if value not in ("full", "normal"):
        raise root.fail("sqlite_synchronous", f'must be "full" or "normal", got {value!r}')
    return value


def _optional_int(root: Table, key: str) -> int | None:
    return root.integer(key, None, minimum=1)


def _bytes_limit(root: Table, key: str, default: int | None) -> int | None:
    """A byte budget: a positive integer, or 0 for none."""
    value = root.integer(key, default, minimum=0)
    return value or None


def parse_config(
    data: Mapping[str, Any],
    *,
    source: str = "",
    listen: str | None = None,
    store: str | None = None,
) -> BrokerConfig:
    """Validate a parsed TOML document and build the configuration.

    Args:
        data: The document (``tomllib.loads`` output).
        source: Prefix of error messages, e.g. ``"broker.toml: "``.
        listen: Overrides the file's ``listen`` (the ``--listen`` option).
        store: Overrides the file's ``store`` (the ``--store`` option).

    Returns:
        The configuration.

    Raises:
        ConfigError: A value is invalid or a key is unknown; the message names the key.
    """
    root, policy, scoring = start_document(data, source)
    host, port = listen_setting(root, listen, DEFAULT_LISTEN)
    where = "--store" if store is not None else f"{source}store"
    store_url = _check_store(
        store if store is not None else root.string("store", DEFAULT_STORE), where
    )
    root.used.add("store")
    shown = f"[{host}]" if ":" in host else host
    advertise = root.string("advertise", f"http://{shown}:{port}")
    if not advertise.startswith(("http://", "https://")):
        raise root.fail("advertise", f"expected an http:// or https:// URL, got {advertise!r}")
    charge = charge_setting(root)
    timeout = root.number("worker_timeout_seconds", 120.0, positive=False)
    config = BrokerConfig(
        host=host,
        port=port,
        advertise=advertise.rstrip("/"),
        store=store_url,
        store_schema=root.optional_string("store_schema"),
        keys=MappingProxyType(_keys(root, scoring.tier_bonuses)),
        policy=policy,
        scoring=scoring,
        lease=_lease(root),
        default_lease_seconds=root.number("default_lease_seconds", 900.0),  # type: ignore[arg-type]
        max_attempts=root.integer("max_attempts", 3, minimum=1),  # type: ignore[arg-type]
        worker_timeout_seconds=timeout or None,
        max_queued=_optional_int(root, "max_queued"),
        max_queued_per_member=_optional_int(root, "max_queued_per_member"),
        max_running_per_member=_optional_int(root, "max_running_per_member"),
        max_queued_bytes=_bytes_limit(root, "max_queued_bytes", 256 * 1024 * 1024),
        max_queued_bytes_per_member=_bytes_limit(root, "max_queued_bytes_per_member", None),
        warm_hold_seconds=root.number("warm_hold_seconds", 0.0, positive=False),  # type: ignore[arg-type]
        load_seconds=MappingProxyType(load_seconds_setting(root)),
        fair_share=root.boolean("fair_share", True),
        charge=charge,
        max_body_bytes=root.integer("max_body_bytes", 1024 * 1024, minimum=1024),  # type: ignore[arg-type]
        result_max_bytes=root.integer("result_max_bytes", 256 * 1024, minimum=0),  # type: ignore[arg-type]
        result_ttl_seconds=root.number("result_ttl_seconds", 86_400.0),  # type: ignore[arg-type]
        retry_after_seconds=root.number("retry_after_seconds", 2.0),  # type: ignore[arg-type]
        leader_lease_seconds=root.number("leader_lease_seconds", 10.0),  # type: ignore[arg-type]
        snapshot_every=root.integer("snapshot_every", 10_000, minimum=1),  # type: ignore[arg-type]
        sqlite_synchronous=_synchronous(root),
        metrics_public=root.boolean("metrics_public", False),
        connections=_connections(root),
        forget_workers_seconds=root.number("forget_workers_seconds", 3600.0),  # type: ignore[arg-type]
        budgets=MappingProxyType(budgets_setting(root, policy)),
        backoff=backoff_setting(root),
        horde=horde_setting(root, scoring.tier_bonuses),
    )
    root.finish()
    return config


def load_config(
    path: str | Path | None, *, listen: str | None = None, store: str | None = None
) -> BrokerConfig:
    """Read and validate a TOML configuration file.

    Args:
        path: The file, or None for the defaults (no keys: every request gets 401).
        listen: Overrides the file's ``listen``.
        store: Overrides the file's ``store``.

    Returns:
        The configuration.

    Raises:
        ConfigError: The file cannot be read, is not TOML, or holds an invalid value (the
            message names the file and the key).
    """
    return load_document(path, parse_config, listen=listen, store=store)
