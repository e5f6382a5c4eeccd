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

``examples/broker.toml`` documents every key.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Literal

import attrs

from prioqueue._errors import ConfigError
from prioqueue._lifecycle_config import backoff_setting, budgets_setting
from prioqueue._service_config import (
    _policy,
    _scoring,
    _Table,
    _tier,
    api_key_entries,
    charge_setting,
    default_tier,
    listen_setting,
    read_toml,
)
from prioqueue.lease import LeaseCalculator
from prioqueue.lifecycle import Backoff, LevelBudget
from prioqueue.priority import PriorityPolicy
from prioqueue.scoring import ScoringConfig

__all__ = [
    "DEFAULT_LISTEN",
    "DEFAULT_STORE",
    "BrokerConfig",
    "BrokerKey",
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
class BrokerKey:
    """Who an API key belongs to and what it may do.

    Attributes:
        role: ``"submitter"`` (submits, watches and cancels its member's jobs) or
            ``"worker"`` (pops, completes, fails and heartbeats).
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
        store: The store URL: ``sqlite:relative/path.db``, ``sqlite:///absolute/path.db``,
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
        warm_hold_seconds: How long a job is held for a worker with its model loaded.
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
        budgets: Overload protection per level (``[budgets.<level>]``: ``max_queued`` 429,
            ``max_wait`` 503, ``ttl``); none by default (docs/design/lifecycle.md).
        backoff: The retry delays of ``fail`` with ``"retry": true`` for jobs without their own
            (``[backoff]``; None: retry at once).
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
    warm_hold_seconds: float = 0.0
    fair_share: bool = True
    charge: str | float = "runtime"
    max_body_bytes: int = 1024 * 1024
    result_max_bytes: int = 256 * 1024
    result_ttl_seconds: float = 86_400.0
    retry_after_seconds: float = 2.0
    leader_lease_seconds: float = 10.0
    snapshot_every: int = 10_000
    sqlite_synchronous: str = "full"
    budgets: Mapping[int, LevelBudget] = attrs.field(factory=dict)
    backoff: Backoff | None = None

    @property
    def listen(self) -> str:
        """``host:port`` (IPv6 hosts in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def _check_store(value: str, where: str) -> str:
    if value == "memory://":
        return value
    if value.startswith("sqlite:") and value.strip("/") not in ("sqlite:", ""):
        if value.startswith("sqlite://") and not value.startswith("sqlite:///"):
            raise ConfigError(
                f"{where}: a sqlite URL has no host: use sqlite:///PATH, got {value!r}"
            )
        return value
    if value.startswith(("postgresql://", "postgres://")):
        return value
    raise ConfigError(
        f"{where}: expected 'sqlite:PATH', 'sqlite:///ABSOLUTE/PATH', 'postgresql://...' or "
        f"'memory://', got {value!r}"
    )


def _keys(root: _Table, tiers: Mapping[str, float]) -> dict[str, BrokerKey]:
    keys: dict[str, BrokerKey] = {}
    for key, entry in api_key_entries(root):
        role = entry.string("role", "")
        if role == "worker":
            for flag in ("observer", "admin"):
                if entry.get(flag) is not None:
                    raise entry.fail(
                        flag, "only a submitter key may have it (it is about members' groups)"
                    )
            keys[key] = BrokerKey(role="worker")
        elif role == "submitter":
            member = entry.string("member", "")
            if not member:
                raise entry.fail("member", "is required for a submitter")
            keys[key] = BrokerKey(
                role="submitter",
                member=member,
                tier=_tier(entry, "tier", tiers, default_tier(tiers)),
                max_priority=entry.integer("max_priority", 0),  # type: ignore[arg-type]
                observer=entry.boolean("observer", False),
                admin=entry.boolean("admin", False),
            )
        else:
            raise entry.fail("role", f'must be "submitter" or "worker", got {role or None!r}')
        entry.finish()
    return keys


def _lease(root: _Table) -> LeaseCalculator:
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


def _synchronous(root: _Table) -> str:
    value = root.string("sqlite_synchronous", "full")
    if value not in ("full", "normal"):
        raise root.fail("sqlite_synchronous", f'must be "full" or "normal", got {value!r}')
    return value


def _optional_int(root: _Table, key: str) -> int | None:
    return root.integer(key, None, minimum=1)


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
    root = _Table(data, "", source)
    policy = _policy(root)
    scoring = _scoring(root)
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
        warm_hold_seconds=root.number("warm_hold_seconds", 0.0, positive=False),  # type: ignore[arg-type]
        fair_share=root.boolean("fair_share", True),
        charge=charge,
        max_body_bytes=root.integer("max_body_bytes", 1024 * 1024, minimum=1024),  # type: ignore[arg-type]
        result_max_bytes=root.integer("result_max_bytes", 256 * 1024, minimum=0),  # type: ignore[arg-type]
        result_ttl_seconds=root.number("result_ttl_seconds", 86_400.0),  # type: ignore[arg-type]
        retry_after_seconds=root.number("retry_after_seconds", 2.0),  # type: ignore[arg-type]
        leader_lease_seconds=root.number("leader_lease_seconds", 10.0),  # type: ignore[arg-type]
        snapshot_every=root.integer("snapshot_every", 10_000, minimum=1),  # type: ignore[arg-type]
        sqlite_synchronous=_synchronous(root),
        budgets=MappingProxyType(budgets_setting(root, policy)),
        backoff=backoff_setting(root),
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
    if path is None:
        return parse_config({}, listen=listen, store=store)
    data = read_toml(path)
    return parse_config(data, source=f"{path}: ", listen=listen, store=store)
