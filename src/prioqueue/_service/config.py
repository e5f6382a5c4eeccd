"""What the gateway's and the broker's TOML configurations share.

Theory of operation
-------------------
Both services read one TOML file, validated once at start, with the same rules: every value
is checked by a typed getter of :class:`Table` that names the key by its TOML path in its
error (``keys."abc".tier: unknown tier 'gold' (known: free, pro, max)``), and unknown keys
are errors (:meth:`Table.finish`). The ``[policy]``, ``[tiers]`` and ``[scoring]`` tables,
``listen``, ``charge`` and the API key table's names read the same in both.

Only the standard library and prioqueue's core are imported here (no optional extra), so
either service's configuration can be read and checked without the other's extras.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from prioqueue.errors import ConfigError
from prioqueue.priority import DEFAULT_ALIASES, PriorityPolicy
from prioqueue.scoring import DEFAULT_TIER_BONUSES, ScoringConfig

__all__ = [
    "Table",
    "api_key_entries",
    "charge_setting",
    "checked_number",
    "default_tier",
    "level_key",
    "listen_setting",
    "load_document",
    "load_seconds_setting",
    "parse_listen",
    "policy_setting",
    "read_toml",
    "scoring_setting",
    "start_document",
    "tier_setting",
]


_T = TypeVar("_T")


def _quote(name: str) -> str:
    """Quote a TOML key for a message when it is not a bare key."""
    if name and all(c.isascii() and (c.isalnum() or c in "-_") for c in name):
        return name
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


class Table:
    """A TOML table being read: typed getters that name the key in their errors.

    Every getter marks its key used; :meth:`finish` then refuses the keys nobody read. A
    getter's ``default`` is returned when the key is absent; a present value of the wrong
    type or range raises :class:`~prioqueue.ConfigError` naming the key by its TOML path.

    Args:
        data: The table's contents.
        path: Its TOML path (``""`` for the document).
        source: Prefix of every error message (``"broker.toml: "``).
    """

    def __init__(self, data: Mapping[str, Any], path: str, source: str) -> None:
        self.data = data
        self.path = path
        self.source = source
        self.used: set[str] = set()

    def name(self, key: str) -> str:
        """The TOML path of ``key`` in this table (quoted when not a bare key)."""
        return f"{self.path}.{_quote(key)}" if self.path else _quote(key)

    def fail(self, key: str, message: str) -> ConfigError:
        """The error for ``key``: ``source`` + path + ``message`` (the caller raises it)."""
        return ConfigError(f"{self.source}{self.name(key)}: {message}")

    def get(self, key: str) -> Any:
        """The raw value of ``key`` (None when absent), marked used."""
        self.used.add(key)
        return self.data.get(key)

    def string(self, key: str, default: str) -> str:
        """A non-empty string, or ``default`` when absent."""
        value = self.get(key)
        if value is None:
            return default
        if not isinstance(value, str) or not value:
            raise self.fail(key, f"must be a non-empty string, got {value!r}")
        return value

    def optional_string(self, key: str) -> str | None:
        """A non-empty string, or None when absent."""
        return None if self.get(key) is None else self.string(key, "")

    def boolean(self, key: str, default: bool) -> bool:
        """``true`` or ``false``, or ``default`` when absent."""
        value = self.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(key, f"must be true or false, got {value!r}")
        return value

    def integer(self, key: str, default: int | None, minimum: int | None = None) -> int | None:
        """An integer (not a bool) of at least ``minimum``, or ``default`` when absent."""
        value = self.get(key)
        if value is None:
            return default
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.fail(key, f"must be an integer, got {value!r}")
        if minimum is not None and value < minimum:
            raise self.fail(key, f"must be >= {minimum}, got {value}")
        return value

    def number(self, key: str, default: float | None, *, positive: bool = True) -> float | None:
        """A finite number (> 0, or >= 0 unless ``positive``), or ``default`` when absent."""
        value = self.get(key)
        if value is None:
            return default
        return checked_number(self, key, value, positive=positive)

    def table(self, key: str) -> Table:
        """The sub-table ``key`` (empty when absent)."""
        value = self.get(key)
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            raise self.fail(key, f"must be a table, got {value!r}")
        return Table(value, self.name(key), self.source)

    def finish(self) -> None:
        """Refuse the keys no getter read (the error names the first and the known ones)."""
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            known = ", ".join(sorted(self.used))
            raise self.fail(unknown[0], f"unknown key (known here: {known})")


def checked_number(table: Table, key: str, value: object, *, positive: bool = True) -> float:
    """``value`` of ``table``'s ``key`` as a finite float (> 0, or >= 0 unless ``positive``).

    Raises:
        ConfigError: Not a finite number, or out of range (names the key).
    """
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


def tier_setting(table: Table, key: str, tiers: Mapping[str, float], default: str) -> str:
    """A tier name (``default`` when absent) that ``tiers`` knows.

    Raises:
        ConfigError: An unknown tier (the message lists the known ones).
    """
    name = table.string(key, default)
    if name not in tiers:
        known = ", ".join(tiers) or "none"
        raise table.fail(key, f"unknown tier {name!r} (known: {known})")
    return name


def level_key(table: Table, key: str, policy: PriorityPolicy) -> int:
    """The priority level a table key names: a number or one of ``policy``'s aliases.

    Raises:
        ConfigError: Neither (the message lists the aliases).
    """
    text = key.strip()
    if text.lstrip("+-").isdigit():
        return int(text)
    if text.lower() in policy.aliases:
        return policy.aliases[text.lower()]
    known = ", ".join(policy.aliases)
    raise table.fail(key, f"not a priority level (a number or one of: {known})")


def policy_setting(root: Table) -> PriorityPolicy:
    """Read the ``[policy]`` table (``default``, ``minimum``, ``maximum``, ``[policy.aliases]``).

    Raises:
        ConfigError: A key is unknown or a value invalid (named by its path).
    """
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


def scoring_setting(root: Table) -> ScoringConfig:
    """Read the ``[tiers]`` and ``[scoring]`` tables into the score's weights.

    Raises:
        ConfigError: A key is unknown or a value invalid (named by its path).
    """
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


def _load_toml(text: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]
    data: dict[str, Any] = tomllib.loads(text)
    return data


def start_document(
    data: Mapping[str, Any], source: str
) -> tuple[Table, PriorityPolicy, ScoringConfig]:
    """Begin reading a service's document: its top table, ``[policy]``, ``[tiers]``/``[scoring]``.

    Args:
        data: The parsed document.
        source: Prefix of every error message (``"gateway.toml: "``).

    Returns:
        ``(root, policy, scoring)``: the caller reads the rest from ``root`` and calls its
        ``finish()``.

    Raises:
        ConfigError: A key of those tables is unknown or a value invalid (named).
    """
    root = Table(data, "", source)
    return root, policy_setting(root), scoring_setting(root)


def load_document(path: str | Path | None, parse: Callable[..., _T], **overrides: Any) -> _T:
    """Read the TOML file at ``path`` and build a configuration with ``parse``.

    Args:
        path: The file, or None for an empty document (the defaults).
        parse: The service's ``parse_config(data, *, source=..., **overrides)``.
        **overrides: The command line's overrides (``listen``...), passed to ``parse``.

    Returns:
        What ``parse`` returns; its errors name the file (``source`` is ``"PATH: "``).

    Raises:
        ConfigError: The file cannot be read, is not TOML, or ``parse`` refuses it.
    """
    if path is None:
        return parse({}, **overrides)
    return parse(read_toml(path), source=f"{path}: ", **overrides)


def read_toml(path: str | Path) -> dict[str, Any]:
    """Read and parse a TOML configuration file.

    Args:
        path: The file.

    Returns:
        The parsed document.

    Raises:
        ConfigError: The file cannot be read or is not TOML (the message names the file).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the configuration: {exc}") from None
    try:
        return _load_toml(text)
    except ValueError as exc:  # tomllib.TOMLDecodeError is a ValueError
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None


def listen_setting(root: Table, listen: str | None, default: str) -> tuple[str, int]:
    """Read ``listen`` (``host:port``), or take the ``--listen`` override when given.

    Args:
        root: The document's top table.
        listen: The ``--listen`` option, or None to read the file's (``default`` if absent).
        default: The address when neither gives one.

    Returns:
        ``(host, port)``.

    Raises:
        ConfigError: The address is not ``host:port``; the message names ``--listen`` or the
            file's key.
    """
    where = "--listen" if listen is not None else f"{root.source}listen"
    host, port = parse_listen(
        listen if listen is not None else root.string("listen", default), where=where
    )
    root.used.add("listen")
    return host, port


def charge_setting(root: Table) -> str | float:
    """Read ``charge``: ``"runtime"`` (the default), ``"estimate"`` or seconds (> 0).

    Raises:
        ConfigError: Neither of those; the message names the key.
    """
    value = root.get("charge")
    if value is None:
        return "runtime"
    if value in ("runtime", "estimate"):
        return str(value)
    return checked_number(root, "charge", value)


def load_seconds_setting(root: Table) -> dict[str, float]:
    """Read ``[load_seconds]``: each model's cold-load time in seconds (absent: none known).

    The dispatcher's ``load_seconds`` (docs/design/fleet.md, "Affinity as a priced trade";
    docs/design/dispatcher.md, "Issue 26, seventh round" and "eighth round"): on a fleet a
    model's affinity is priced by its load, and on one worker a crossing is weighed against
    the loads it costs. A model without an entry keeps the scorer's affinity. O(models).

    Raises:
        ConfigError: ``load_seconds`` is not a table, a model name is empty or holds only
            whitespace, or a value is not a finite number >= 0 (the message names the key).
    """
    table = root.table("load_seconds")
    loads: dict[str, float] = {}
    for model in list(table.data):
        if not model.strip():
            raise table.fail(model, "a model name must not be empty or blank")
        loads[model] = checked_number(table, model, table.get(model), positive=False)
    table.finish()
    return loads


def api_key_entries(root: Table) -> Iterator[tuple[str, Table]]:
    """Yield each ``[keys."KEY"]`` table of the document with its key, checked by name.

    The caller reads each entry's values and calls its ``finish()``.

    Raises:
        ConfigError: ``keys`` is not a table, or a key is empty or holds whitespace.
    """
    table = root.table("keys")
    for key in table.data:
        if not key.strip() or any(c.isspace() for c in key):
            raise table.fail(key, "an API key must be non-empty and have no whitespace")
        yield key, table.table(key)


def default_tier(tiers: Mapping[str, float]) -> str:
    """The tier a key gets when it names none: the first configured, else ``"free"``."""
    return next(iter(tiers), "free")
