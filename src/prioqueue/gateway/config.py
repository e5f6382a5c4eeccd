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

import math
import sys
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal
from urllib.parse import urlsplit

import attrs

from prioqueue._errors import ConfigError
from prioqueue.gateway.settings import (
    DEFAULT_ADMIN_PATHS,
    DEFAULT_GATED_METHODS,
    DEFAULT_GATED_PATHS,
    DEFAULT_LISTEN,
    DEFAULT_PASSTHROUGH_PATHS,
    DEFAULT_UPSTREAM,
    ApiKey,
    GatewayConfig,
    Limits,
    TrustedHeader,
    UpstreamConfig,
)
from prioqueue.priority import DEFAULT_ALIASES, PriorityPolicy
from prioqueue.scoring import DEFAULT_TIER_BONUSES, ScoringConfig

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

# --- reading -------------------------------------------------------------------------------


def _quote(name: str) -> str:
    """Quote a TOML key for a message when it is not a bare key."""
    if name and all(c.isascii() and (c.isalnum() or c in "-_") for c in name):
        return name
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


class _Table:
    """A TOML table being read: typed getters that name the key in their errors."""

    def __init__(self, data: Mapping[str, Any], path: str, source: str) -> None:
        self.data = data
        self.path = path
        self.source = source
        self.used: set[str] = set()

    def name(self, key: str) -> str:
        return f"{self.path}.{_quote(key)}" if self.path else _quote(key)

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.source}{self.name(key)}: {message}")

    def get(self, key: str) -> Any:
        self.used.add(key)
        return self.data.get(key)

    def string(self, key: str, default: str) -> str:
        value = self.get(key)
        if value is None:
            return default
        if not isinstance(value, str) or not value:
            raise self.fail(key, f"must be a non-empty string, got {value!r}")
        return value

    def optional_string(self, key: str) -> str | None:
        return None if self.get(key) is None else self.string(key, "")

    def boolean(self, key: str, default: bool) -> bool:
        value = self.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(key, f"must be true or false, got {value!r}")
        return value

    def integer(self, key: str, default: int | None, minimum: int | None = None) -> int | None:
        value = self.get(key)
        if value is None:
            return default
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.fail(key, f"must be an integer, got {value!r}")
        if minimum is not None and value < minimum:
            raise self.fail(key, f"must be >= {minimum}, got {value}")
        return value

    def number(self, key: str, default: float | None, *, positive: bool = True) -> float | None:
        value = self.get(key)
        if value is None:
            return default
        return _number(self, key, value, positive=positive)

    def table(self, key: str) -> _Table:
        value = self.get(key)
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            raise self.fail(key, f"must be a table, got {value!r}")
        return _Table(value, self.name(key), self.source)

    def finish(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            known = ", ".join(sorted(self.used))
            raise self.fail(unknown[0], f"unknown key (known here: {known})")


def _number(table: _Table, key: str, value: object, *, positive: bool = True) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise table.fail(key, f"must be a finite number, got {value!r}")
    if positive and value <= 0:
        raise table.fail(key, f"must be > 0, got {value!r}")
    if not positive and value < 0:
        raise table.fail(key, f"must be >= 0, got {value!r}")
    return float(value)


def parse_listen(value: str, *, where: str = "listen") -> tuple[str, int]:
    """Split ``host:port`` (``[v6]:port`` for IPv6; ``:port`` means 127.0.0.1).

    Args:
        value: The address.
        where: The key named in an error.

    Returns:
        ``(host, port)``.

    Raises:
        ConfigError: The value is not ``host:port`` with a port in 0..65535.
    """
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigError(f"{where}: expected 'host:port' with a port 0..65535, got {value!r}")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port_text)


def _check_upstream(value: str, where: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{where}: expected an http:// or https:// URL, got {value!r}")
    if parts.query or parts.fragment:
        raise ConfigError(f"{where}: must not have a query or fragment, got {value!r}")
    return value.rstrip("/")


def _upstreams(root: _Table) -> tuple[UpstreamConfig, ...]:
    """Read ``[[upstreams]]``: tables of ``url``, ``name``, ``models``, ``slots``, ``slow``."""
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
        table = _Table(entry, f"{root.name('upstreams')}[{index}]", root.source)
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
        table.finish()
        result.append(UpstreamConfig(url, name, models, slots or 1, slow))
    return tuple(result)


def _routing(root: _Table) -> Literal["warm", "round-robin", "least-busy"]:
    value = root.string("routing", "warm")
    if value == "round-robin":
        return "round-robin"
    if value == "least-busy":
        return "least-busy"
    if value != "warm":
        raise root.fail("routing", f"must be warm, round-robin or least-busy, got {value!r}")
    return "warm"


def _tier(table: _Table, key: str, tiers: Mapping[str, float], default: str) -> str:
    name = table.string(key, default)
    if name not in tiers:
        known = ", ".join(tiers) or "none"
        raise table.fail(key, f"unknown tier {name!r} (known: {known})")
    return name


def _level(table: _Table, key: str, policy: PriorityPolicy) -> int:
    text = key.strip()
    if text.lstrip("+-").isdigit():
        return int(text)
    if text.lower() in policy.aliases:
        return policy.aliases[text.lower()]
    known = ", ".join(policy.aliases)
    raise table.fail(key, f"not a priority level (a number or one of: {known})")


def _policy(root: _Table) -> PriorityPolicy:
    table = root.table("policy")
    aliases_table = table.table("aliases")
    aliases = dict(DEFAULT_ALIASES)
    for name in aliases_table.data:
        aliases[name] = aliases_table.integer(name, None)  # type: ignore[assignment]
    kwargs = {
        "default": table.integer("default", 0),
        "minimum": table.integer("minimum", None),
        "maximum": table.integer("maximum", None),
    }
    table.finish()
    try:
        return PriorityPolicy(aliases=aliases, **kwargs)  # type: ignore[arg-type]
    except ConfigError as exc:
        raise ConfigError(f"{root.source}policy: {exc}") from None


def _scoring(root: _Table) -> ScoringConfig:
    tiers_table = root.table("tiers")
    tiers: dict[str, float] = {}
    for name in tiers_table.data:
        tiers[name] = tiers_table.number(name, None, positive=False)  # type: ignore[assignment]
    table = root.table("scoring")
    by_model_table = table.table("affinity_by_model")
    by_model = {
        name: by_model_table.number(name, None, positive=False) for name in by_model_table.data
    }
    kwargs: dict[str, Any] = {
        "tier_bonuses": tiers or DEFAULT_TIER_BONUSES,
        "affinity_by_model": by_model,
    }
    for key, positive in (("band_spacing", True), ("max_affinity", False), ("aging_divisor", True)):
        value = table.number(key, None, positive=positive)
        if value is not None:
            kwargs[key] = value
    table.finish()
    try:
        return ScoringConfig(**kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{root.source}scoring: {exc}") from None


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


def _paths(root: _Table, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
    raw = root.get(key)
    if raw is None:
        return default
    if not isinstance(raw, list) or not all(isinstance(p, str) and p.startswith("/") for p in raw):
        raise root.fail(key, f"must be a list of paths starting with '/': {raw!r}")
    return tuple(raw)


def _methods(root: _Table, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
    raw = root.get(key)
    if raw is None:
        return default
    if not isinstance(raw, list) or not all(
        isinstance(m, str) and m.isascii() and m.isalpha() for m in raw
    ):
        raise root.fail(key, f"must be a list of HTTP method names: {raw!r}")
    return tuple(m.upper() for m in raw)


def _limits(root: _Table, policy: PriorityPolicy) -> Limits:
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
            seconds = None if value == 0 else _number(waits, key, value)
            if key == "default":
                wait_default = seconds
            else:
                wait_by_level[_level(waits, key, policy)] = seconds
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
        max_queued_per_member=table.integer("max_queued_per_member", None, minimum=1),
        lease_seconds_by_path=MappingProxyType(lease_by_path),
        max_wait_seconds=wait_default,
        max_wait_by_level=MappingProxyType(wait_by_level),
        **kwargs,
    )
    table.finish()
    return limits


def _keys(root: _Table, tiers: Mapping[str, float]) -> dict[str, ApiKey]:
    keys_table = root.table("keys")
    keys: dict[str, ApiKey] = {}
    for key in keys_table.data:
        if not key.strip() or any(c.isspace() for c in key):
            raise keys_table.fail(key, "an API key must be non-empty and have no whitespace")
        entry = keys_table.table(key)
        member = entry.string("member", "")
        if not member:
            raise entry.fail("member", "is required")
        max_priority = entry.integer("max_priority", 0)
        admin = entry.boolean("admin", False)
        keys[key] = ApiKey(
            member=member,
            tier=_tier(entry, "tier", tiers, next(iter(tiers), "free")),
            max_priority=max_priority,  # type: ignore[arg-type]
            observer=entry.boolean("observer", False) or admin,
            admin=admin,
        )
        entry.finish()
    return keys


def _trusted(root: _Table, tiers: Mapping[str, float]) -> TrustedHeader | None:
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
        default_tier=_tier(table, "default_tier", tiers, next(iter(tiers), "free")),
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
    root = _Table(data, "", source)
    policy = _policy(root)
    scoring = _scoring(root)
    tiers = scoring.tier_bonuses
    up = upstream if upstream is not None else root.string("upstream", DEFAULT_UPSTREAM)
    root.used.add("upstream")
    up = _check_upstream(up, "--upstream" if upstream is not None else f"{source}upstream")
    where = "--listen" if listen is not None else f"{source}listen"
    host, port = parse_listen(
        listen if listen is not None else root.string("listen", DEFAULT_LISTEN), where=where
    )
    root.used.add("listen")
    charge_raw = root.get("charge")
    charge: str | float = "runtime"
    if charge_raw is not None:
        if charge_raw in ("runtime", "estimate"):
            charge = charge_raw
        else:
            charge = _number(root, "charge", charge_raw)
    resident = root.table("resident")
    resident_poll = resident.number("poll_seconds", 0.0, positive=False)
    resident_path = resident.string("path", "/running")
    resident.finish()
    estimate = root.number("estimate_seconds", None)
    upstreams = _upstreams(root)
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
        anonymous_tier=_tier(root, "anonymous_tier", tiers, next(iter(tiers), "free")),
        anonymous_max_priority=root.integer("anonymous_max_priority", 0),  # type: ignore[arg-type]
        keys=MappingProxyType(_keys(root, tiers)),
        trusted_header=_trusted(root, tiers),
        anonymous_observer=root.boolean("anonymous_observer", False),
        gated_paths=_paths(root, "gated_paths", DEFAULT_GATED_PATHS),
        gated_methods=_methods(root, "gated_methods", DEFAULT_GATED_METHODS),
        passthrough_paths=_paths(root, "passthrough_paths", DEFAULT_PASSTHROUGH_PATHS),
        admin_paths=_paths(root, "admin_paths", DEFAULT_ADMIN_PATHS),
        metrics_key=root.optional_string("metrics_key"),
        policy=policy,
        scoring=scoring,
        limits=_limits(root, policy),
        charge=charge,
        fair_share=root.boolean("fair_share", True),
        estimate_seconds=estimate,
        resident_poll_seconds=resident_poll,  # type: ignore[arg-type]
        resident_path=resident_path,
        upstream_api_key=root.optional_string("upstream_api_key"),
        job_history=root.integer("job_history", 1000, minimum=0),  # type: ignore[arg-type]
        job_history_bytes=root.integer("job_history_bytes", 16 * 1024 * 1024, minimum=0),  # type: ignore[arg-type]
        upstreams=upstreams,
        warm_hold=root.number("warm_hold", 15.0, positive=False),  # type: ignore[arg-type]
        max_attempts=root.integer("max_attempts", 2, minimum=1),  # type: ignore[arg-type]
        health_seconds=root.number("health_seconds", 1.0),  # type: ignore[arg-type]
        routing=_routing(root),
    )
    root.finish()
    return config


def _load_toml(text: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]
    data: dict[str, Any] = tomllib.loads(text)
    return data


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
    if path is None:
        config = parse_config({}, upstream=upstream, listen=listen)
        return attrs.evolve(config, allow_anonymous=True)
    source = f"{path}: "
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the configuration: {exc}") from None
    try:
        data = _load_toml(text)
    except ValueError as exc:  # tomllib.TOMLDecodeError is a ValueError
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return parse_config(data, source=source, upstream=upstream, listen=listen)
