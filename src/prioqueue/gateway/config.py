"""The gateway's configuration: a TOML file, validated when it is read.

Theory of operation
-------------------
Everything the gateway needs is in one frozen :class:`GatewayConfig`, built by
:func:`load_config` (a file, plus the command line's overrides) or :func:`parse_config` (an
already-parsed mapping, for tests and embedding). Validation happens once, at start: a bad value
raises :class:`~prioqueue.ConfigError` whose message names the offending key by its TOML path,
for instance ``keys."abc".tier: unknown tier 'gold' (known: free, pro, max)``. Unknown keys are
errors too (a typo must not silently fall back to a default).

A minimal file::

    upstream = "http://127.0.0.1:8080"
    listen = "127.0.0.1:8090"
    allow_anonymous = false

    [keys."sk-alice"]
    member = "alice"
    tier = "pro"
    max_priority = 100

``examples/gateway.toml`` documents every key.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal
from urllib.parse import urlsplit

import attrs

from prioqueue._service.config import (
    Table,
    api_key_entries,
    charge_setting,
    checked_number,
    default_tier,
    level_key,
    listen_setting,
    load_document,
    load_seconds_setting,
    parse_listen,
    start_document,
    tier_setting,
)
from prioqueue._service.lifecycle import budgets_setting
from prioqueue.errors import ConfigError
from prioqueue.gateway.settings import (
    DEFAULT_ADMIN_PATHS,
    DEFAULT_GATED_METHODS,
    DEFAULT_GATED_PATHS,
    DEFAULT_LISTEN,
    DEFAULT_OBSERVER_PATHS,
    DEFAULT_PASSTHROUGH_PATHS,
    DEFAULT_UPSTREAM,
    ApiKey,
    GatewayConfig,
    Limits,
    TrustedHeader,
    UpstreamConfig,
)
from prioqueue.priority import PriorityPolicy

__all__ = [
    "DEFAULT_ADMIN_PATHS",
    "DEFAULT_GATED_METHODS",
    "DEFAULT_GATED_PATHS",
    "DEFAULT_LISTEN",
    "DEFAULT_PASSTHROUGH_PATHS",
    "DEFAULT_UPSTREAM",
    "ApiKey",
    "GatewayConfig",
    "Limits",
    "TrustedHeader",
    "load_config",
    "parse_config",
    "parse_listen",
]


def _check_upstream(value: str, where: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{where}: expected an http:// or https:// URL, got {value!r}")
    if parts.query or parts.fragment:
        raise ConfigError(f"{where}: must not have a query or fragment, got {value!r}")
    return value.rstrip("/")


@attrs.frozen
class _Busy:
    """What happens after a request the gateway closed early: top level or per upstream."""

    aborts: bool
    busy_timeout: float
    idle_path: str | None


def _busy(table: Table, default: _Busy) -> _Busy:
    idle_path = table.optional_string("idle_path")
    if idle_path is not None and not idle_path.startswith(("/", "http://", "https://")):
        raise table.fail(
            "idle_path", f"must be a path starting with '/' or a URL, got {idle_path!r}"
        )
    return _Busy(
        aborts=table.boolean("aborts", default.aborts),
        busy_timeout=table.number("busy_timeout", default.busy_timeout),  # type: ignore[arg-type]
        idle_path=idle_path if idle_path is not None else default.idle_path,
    )


def _upstreams(root: Table, busy: _Busy, default_key: str | None) -> tuple[UpstreamConfig, ...]:
    """Read ``[[upstreams]]``: ``url``, ``name``, ``models``, ``slots``, ``slow`` and more.

    ``aborts``, ``busy_timeout``, ``idle_path`` and ``upstream_api_key`` default to the top
    level's.
    """
    value = root.get("upstreams")
    if value is None:
        return ()
    if not isinstance(value, list) or not value:
        raise root.fail("upstreams", f"must be a non-empty array of tables, got {value!r}")
    result: list[UpstreamConfig] = []
    names: set[str] = set()
    for index, entry in enumerate(value):
        if not isinstance(entry, Mapping):
            raise root.fail("upstreams", f"entry {index} must be a table, got {entry!r}")
        table = Table(entry, f"{root.name('upstreams')}[{index}]", root.source)
        url_value = table.get("url")
        if not isinstance(url_value, str):
            raise table.fail("url", f"is required: an http:// or https:// URL, got {url_value!r}")
        url = _check_upstream(url_value, f"{table.source}{table.name('url')}")
        parts = urlsplit(url)
        name = table.string("name", f"{parts.hostname}:{parts.port or 80}")
        if name in names:
            raise table.fail("name", f"{name!r} names two upstreams (give each a unique name)")
        names.add(name)
        models_raw = table.get("models")
        models: tuple[str, ...] | None = None
        if models_raw is not None:
            if (
                not isinstance(models_raw, list)
                or not models_raw
                or not all(isinstance(m, str) and m for m in models_raw)
            ):
                raise table.fail(
                    "models", f"must be a non-empty array of model names, got {models_raw!r}"
                )
            models = tuple(models_raw)
        slots = table.integer("slots", 1, minimum=1)
        slow = table.boolean("slow", False)
        own = _busy(table, busy)
        api_key = table.optional_string("upstream_api_key")
        table.finish()
        result.append(
            UpstreamConfig(
                url,
                name,
                models,
                slots or 1,
                slow,
                aborts=own.aborts,
                busy_timeout=own.busy_timeout,
                idle_path=own.idle_path,
                api_key=api_key if api_key is not None else default_key,
            )
        )
    return tuple(result)


def _routing(root: Table) -> Literal["warm", "round-robin", "least-busy"]:
    value = root.string("routing", "warm")
    if value == "round-robin":
        return "round-robin"
    if value == "least-busy":
        return "least-busy"
    if value != "warm":
        raise root.fail("routing", f"must be warm, round-robin or least-busy, got {value!r}")
    return "warm"


_LIMIT_INTEGERS = (
    "max_body_bytes",
    "max_queued_body_bytes",
    "max_header_bytes",
    "max_headers_bytes",
    "max_header_count",
    "breaker_failures",
)
_LIMIT_NUMBERS = (
    ("lease_seconds", True),
    ("retry_after_seconds", True),
    ("connect_timeout", True),
    ("first_byte_timeout", True),
    ("drain_seconds", True),
    ("shutdown_grace_seconds", False),
    ("header_timeout", True),
    ("body_timeout", True),
    ("breaker_cooldown_seconds", True),
)


def _paths(root: Table, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
    raw = root.get(key)
    if raw is None:
        return default
    if not isinstance(raw, list) or not all(isinstance(p, str) and p.startswith("/") for p in raw):
        raise root.fail(key, f"must be a list of paths starting with '/': {raw!r}")
    return tuple(raw)


def _methods(root: Table, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
    raw = root.get(key)
    if raw is None:
        return default
    if not isinstance(raw, list) or not all(
        isinstance(m, str) and m.isascii() and m.isalpha() for m in raw
    ):
        raise root.fail(key, f"must be a list of HTTP method names: {raw!r}")
    return tuple(m.upper() for m in raw)


def _limits(root: Table, policy: PriorityPolicy) -> Limits:
    table = root.table("limits")
    by_path = table.table("lease_seconds_by_path")
    lease_by_path: dict[str, float] = {}
    for path in by_path.data:
        if not path.startswith("/"):
            raise by_path.fail(path, "a path must start with '/'")
        if "*" in path[:-1]:
            raise by_path.fail(path, "'*' may only end a path")
        lease_by_path[path] = by_path.number(path, None)  # type: ignore[assignment]
    wait_default: float | None = None
    wait_by_level: dict[int, float | None] = {}
    raw_wait = table.data.get("max_wait_seconds")
    if isinstance(raw_wait, Mapping):
        waits = table.table("max_wait_seconds")
        for key in waits.data:
            value = waits.get(key)
            seconds = None if value == 0 else checked_number(waits, key, value)
            if key == "default":
                wait_default = seconds
            else:
                wait_by_level[level_key(waits, key, policy)] = seconds
    else:
        wait_default = table.number("max_wait_seconds", None)
    defaults = Limits()
    kwargs: dict[str, Any] = {}
    for key in _LIMIT_INTEGERS:
        kwargs[key] = table.integer(key, getattr(defaults, key), minimum=1)
    for key, positive in _LIMIT_NUMBERS:
        kwargs[key] = table.number(key, getattr(defaults, key), positive=positive)
    limits = Limits(
        max_queued=table.integer("max_queued", None, minimum=1),
        max_connections=table.integer("max_connections", None, minimum=1),
        max_idle_connections=table.integer("max_idle_connections", None, minimum=1),
        max_queued_per_member=table.integer("max_queued_per_member", None, minimum=1),
        lease_seconds_by_path=MappingProxyType(lease_by_path),
        max_wait_seconds=wait_default,
        max_wait_by_level=MappingProxyType(wait_by_level),
        **kwargs,
    )
    table.finish()
    return limits


def _keys(root: Table, tiers: Mapping[str, float]) -> dict[str, ApiKey]:
    keys: dict[str, ApiKey] = {}
    for key, entry in api_key_entries(root):
        member = entry.string("member", "")
        if not member:
            raise entry.fail("member", "is required")
        max_priority = entry.integer("max_priority", 0)
        admin = entry.boolean("admin", False)
        keys[key] = ApiKey(
            member=member,
            tier=tier_setting(entry, "tier", tiers, default_tier(tiers)),
            max_priority=max_priority,  # type: ignore[arg-type]
            observer=entry.boolean("observer", False) or admin,
            admin=admin,
        )
        entry.finish()
    return keys


def _trusted(root: Table, tiers: Mapping[str, float]) -> TrustedHeader | None:
    if root.data.get("trusted_header") is None:
        root.used.add("trusted_header")
        return None
    table = root.table("trusted_header")
    member = table.string("member", "")
    if not member:
        raise table.fail("member", "is required (the header that names the member)")
    tier = table.optional_string("tier")
    trusted = TrustedHeader(
        member=member.lower(),
        tier=tier.lower() if tier else None,
        default_tier=tier_setting(table, "default_tier", tiers, default_tier(tiers)),
        max_priority=table.integer("max_priority", 0),  # type: ignore[arg-type]
    )
    table.finish()
    return trusted


def parse_config(
    data: Mapping[str, Any],
    *,
    source: str = "",
    upstream: str | None = None,
    listen: str | None = None,
) -> GatewayConfig:
    """Validate a parsed TOML document and build the configuration.

    Args:
        data: The document (``tomllib.loads`` output).
        source: Prefix of error messages, e.g. ``"gateway.toml: "``.
        upstream: Overrides the file's ``upstream`` (the ``--upstream`` option).
        listen: Overrides the file's ``listen`` (the ``--listen`` option).

    Returns:
        The configuration.

    Raises:
        ConfigError: A value is invalid or a key is unknown; the message names the key.
    """
    root, policy, scoring = start_document(data, source)
    tiers = scoring.tier_bonuses
    up = upstream if upstream is not None else root.string("upstream", DEFAULT_UPSTREAM)
    root.used.add("upstream")
    up = _check_upstream(up, "--upstream" if upstream is not None else f"{source}upstream")
    host, port = listen_setting(root, listen, DEFAULT_LISTEN)
    charge = charge_setting(root)
    resident = root.table("resident")
    resident_poll = resident.number("poll_seconds", 0.0, positive=False)
    resident_path = resident.string("path", "/running")
    persistent = resident.get("persistent") or []
    if not isinstance(persistent, list) or not all(isinstance(m, str) and m for m in persistent):
        raise resident.fail("persistent", f"must be an array of model names, got {persistent!r}")
    resident.finish()
    estimate = root.number("estimate_seconds", None)
    busy = _busy(root, _Busy(aborts=False, busy_timeout=300.0, idle_path=None))
    api_key = root.optional_string("upstream_api_key")
    upstreams = _upstreams(root, busy, api_key)
    if upstreams and upstream is None and "upstream" in data:
        raise root.fail("upstream", "give either upstream or [[upstreams]], not both")
    if upstreams and upstream is not None:
        raise ConfigError(f"--upstream: {source}[[upstreams]] lists the upstreams; drop one")
    config = GatewayConfig(
        upstream=up,
        host=host,
        port=port,
        allow_anonymous=root.boolean("allow_anonymous", False),
        anonymous_member=root.string("anonymous_member", "anonymous"),
        anonymous_tier=tier_setting(root, "anonymous_tier", tiers, default_tier(tiers)),
        anonymous_max_priority=root.integer("anonymous_max_priority", 0),  # type: ignore[arg-type]
        keys=MappingProxyType(_keys(root, tiers)),
        trusted_header=_trusted(root, tiers),
        anonymous_observer=root.boolean("anonymous_observer", False),
        gated_paths=_paths(root, "gated_paths", DEFAULT_GATED_PATHS),
        gated_methods=_methods(root, "gated_methods", DEFAULT_GATED_METHODS),
        passthrough_paths=_paths(root, "passthrough_paths", DEFAULT_PASSTHROUGH_PATHS),
        admin_paths=_paths(root, "admin_paths", DEFAULT_ADMIN_PATHS),
        observer_paths=_paths(root, "observer_paths", DEFAULT_OBSERVER_PATHS),
        metrics_key=root.optional_string("metrics_key"),
        policy=policy,
        scoring=scoring,
        limits=_limits(root, policy),
        charge=charge,
        fair_share=root.boolean("fair_share", True),
        estimate_seconds=estimate,
        resident_poll_seconds=resident_poll,  # type: ignore[arg-type]
        resident_path=resident_path,
        resident_persistent=frozenset(persistent),
        upstream_api_key=api_key,
        job_history=root.integer("job_history", 1000, minimum=0),  # type: ignore[arg-type]
        job_history_bytes=root.integer("job_history_bytes", 16 * 1024 * 1024, minimum=0),  # type: ignore[arg-type]
        upstreams=upstreams,
        warm_hold=root.number("warm_hold", 15.0, positive=False),  # type: ignore[arg-type]
        max_attempts=root.integer("max_attempts", 2, minimum=1),  # type: ignore[arg-type]
        health_seconds=root.number("health_seconds", 1.0),  # type: ignore[arg-type]
        budgets=MappingProxyType(budgets_setting(root, policy)),
        load_seconds=MappingProxyType(load_seconds_setting(root)),
        routing=_routing(root),
        aborts=busy.aborts,
        busy_timeout=busy.busy_timeout,
        idle_path=busy.idle_path,
    )
    root.finish()
    return config


def load_config(
    path: str | Path | None, *, upstream: str | None = None, listen: str | None = None
) -> GatewayConfig:
    """Read and validate a TOML configuration file.

    Args:
        path: The file, or None for no file: the defaults with anonymous access allowed.
        upstream: Overrides the file's ``upstream``.
        listen: Overrides the file's ``listen``.

    Returns:
        The configuration.

    Raises:
        ConfigError: The file cannot be read, is not TOML, or holds an invalid value (the
            message names the file and the key).
    """
    config = load_document(path, parse_config, upstream=upstream, listen=listen)
    return config if path is not None else attrs.evolve(config, allow_anonymous=True)
