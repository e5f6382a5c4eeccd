"""Priority numbers: parsing the ``X-LlamaSwap-Priority`` header and bounding what callers ask for.

Theory of operation
-------------------
A job's priority is a signed integer: ``0`` is normal, higher is more urgent. The number *is*
the interface; the aliases ``interactive`` (+100), ``normal`` (0) and ``batch`` (-100) are a
convenience that resolves to numbers. The number also *is* the job's band in
:mod:`prioqueue.scoring`.

Parsing a header never fails a request. An absent, empty or unparseable value means the
default (0). The parser is built so that a hostile header cannot cost CPU: the length is
checked first (more than :data:`MAX_HEADER_LENGTH` characters is unparseable, whatever the
content), and only then is the short remainder matched against a precompiled ASCII pattern.
``int()`` is only ever called on at most 32 ASCII digits.

Accepted, after stripping surrounding ASCII spaces and tabs: an optional ``+``/``-`` sign
followed by ASCII digits (``"100"``, ``"-100"``, ``"+7"``, ``"007"``), or an alias matched
case-insensitively over ASCII only (``"Interactive"``). Everything else is unparseable:
Unicode digits (Arabic-Indic, fullwidth), ``1_000``, ``1.5``, ``1e3``, ``0x10``, ``"1,2"``
(several header values joined by a comma), a bare sign, inner whitespace, non-ASCII
look-alikes of alias letters (the Kelvin sign is not a ``k``), and bytes that are not ASCII.

Who may ask for what (the design's open question)
-------------------------------------------------
Clients may *not* freely self-assign large positive values. The header is a request, not an
entitlement: a caller that could send ``X-LlamaSwap-Priority: 1000000`` unchecked would jump
every band and starve everyone else. Two limits apply, in this order:

1. The policy's ``minimum``/``maximum``: a deployment-wide range (for instance
   ``[BATCH, INTERACTIVE]``). Values outside it are clamped, never rejected.
2. The per-caller ``ceiling``: the service maps each *trusted identity* (an API key, a
   member id, a network) to the highest priority it may use, and passes that ceiling with
   every parse. An anonymous caller might get ``ceiling=NORMAL``: it can lower its own
   priority (``batch`` is always allowed, it only yields) but never raise it above normal;
   the web UI where a human waits gets ``ceiling=INTERACTIVE``. The ceiling is applied last,
   so it wins even over ``minimum``: a caller never gets more than it is allowed.

The library does not authenticate anyone; mapping identities to ceilings is the service's job.

Complexity: every function here is O(1) in the header's length (bounded by 32 characters).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final, TypeGuard

import attrs

from prioqueue.errors import ConfigError

__all__ = [
    "BATCH",
    "DEFAULT_ALIASES",
    "HEADER",
    "INTERACTIVE",
    "MAX_HEADER_LENGTH",
    "NORMAL",
    "PriorityPolicy",
    "parse_priority",
]

INTERACTIVE: Final = 100
"""A human is waiting."""
NORMAL: Final = 0
"""The default priority (also what an absent or unparseable header means)."""
BATCH: Final = -100
"""Nobody is watching."""

DEFAULT_ALIASES: Final[Mapping[str, int]] = MappingProxyType(
    {"interactive": INTERACTIVE, "normal": NORMAL, "batch": BATCH}
)
"""The built-in aliases (read-only): ``interactive`` = 100, ``normal`` = 0, ``batch`` = -100."""

HEADER: Final = "X-LlamaSwap-Priority"
"""The HTTP header that carries a request's priority."""

MAX_HEADER_LENGTH: Final = 32
"""Longer header values (surrounding whitespace included) are unparseable, unread."""

# ASCII digits spelled out: ``\d`` would also match Arabic-Indic or fullwidth digits.
_NUMBER: Final = re.compile(r"[+-]?[0-9]+")
# Visible ASCII, no whitespace: what an alias name may contain.
_ALIAS_NAME: Final = re.compile(r"[!-~]+")
# The optional whitespace HTTP allows around a field value (RFC 9110 OWS).
_OWS: Final = " \t"


def _is_int(value: object) -> TypeGuard[int]:
    """Return whether ``value`` is an integer and not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def _mapping_repr(mapping: Mapping[str, int]) -> str:
    return repr(dict(mapping))


def _parse(value: str | bytes | int | None, aliases: Mapping[str, int], default: int) -> int:
    """Parse a header value; see :func:`parse_priority`. ``aliases`` keys are lower-case."""
    if isinstance(value, str):
        if len(value) > MAX_HEADER_LENGTH:  # before any other work
            return default
        text = value
    elif value is None:
        return default
    elif isinstance(value, bytes):
        if len(value) > MAX_HEADER_LENGTH or not value.isascii():
            return default
        text = value.decode("ascii")
    elif _is_int(value):
        return int(value)  # an IntEnum member becomes a plain int
    else:
        raise TypeError(
            "a priority header value must be str, bytes, None or an int (not bool), "
            f"got {type(value).__name__}"
        )
    text = text.strip(_OWS)
    if _NUMBER.fullmatch(text):
        return int(text)  # at most 32 ASCII characters: cheap
    if text.isascii():  # ASCII case folding only: no Unicode look-alikes
        return aliases.get(text.lower(), default)
    return default


def parse_priority(value: str | bytes | int | None) -> int:
    """Parse an ``X-LlamaSwap-Priority`` header value with the default aliases.

    Absent (``None``), empty or unparseable values mean :data:`NORMAL` (0); parsing never
    fails on what a client sent. No clamping is applied: use :class:`PriorityPolicy` to bound
    the result (and always do so for untrusted callers).

    Args:
        value: The raw header value. ``bytes`` must be ASCII (anything else is unparseable).
            An ``int`` (not ``bool``) is accepted for programmatic callers and returned as is.

    Returns:
        The priority number.

    Raises:
        TypeError: ``value`` is of another type (a header value can only be text or bytes),
            including ``bool``, which is far more likely a bug than a priority.

    Complexity: O(1): at most :data:`MAX_HEADER_LENGTH` characters are ever examined.
    """
    return _parse(value, DEFAULT_ALIASES, NORMAL)


def _normalise_alias(name: object, value: object) -> str:
    """Check one alias entry and return its lower-cased name, or raise ConfigError."""
    if not isinstance(name, str) or not _ALIAS_NAME.fullmatch(name):
        raise ConfigError(
            f"aliases: name {name!r} must be a non-empty string of visible ASCII characters "
            "(no whitespace)"
        )
    if len(name) > MAX_HEADER_LENGTH:
        raise ConfigError(
            f"aliases: name {name!r} is longer than MAX_HEADER_LENGTH ({MAX_HEADER_LENGTH}), "
            "so no header could ever match it"
        )
    if _NUMBER.fullmatch(name):
        raise ConfigError(f"aliases: name {name!r} is a number; numbers always mean themselves")
    if not _is_int(value):
        raise ConfigError(f"aliases: value of {name!r} must be an int (not bool), got {value!r}")
    return name.lower()


def _freeze_aliases(aliases: Mapping[str, int]) -> Mapping[str, int]:
    """Attrs converter: validate alias entries and return a read-only, lower-cased copy."""
    if not isinstance(aliases, Mapping):
        raise ConfigError(f"aliases must be a mapping of name to int, got {type(aliases).__name__}")
    frozen: dict[str, int] = {}
    for name, value in aliases.items():
        key = _normalise_alias(name, value)
        if key in frozen:
            raise ConfigError(
                f"aliases: {name!r} duplicates another name (aliases are case-insensitive)"
            )
        frozen[key] = value
    return MappingProxyType(frozen)


def _int_field(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not _is_int(value):
        raise ConfigError(f"{attribute.name} must be an int (not bool), got {value!r}")


def _optional_int_field(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not _is_int(value):
        raise ConfigError(f"{attribute.name} must be an int (not bool) or None, got {value!r}")


def _check_ceiling(ceiling: object) -> None:
    if ceiling is not None and not _is_int(ceiling):
        raise TypeError(f"ceiling must be an int (not bool) or None, got {ceiling!r}")


@attrs.frozen
class PriorityPolicy:
    """How a service turns header values into priorities: aliases, default and limits.

    The result of :meth:`parse` and :meth:`clamp` is computed as: parse (aliases, default),
    clamp into ``[minimum, maximum]``, then cap at the per-caller ``ceiling``. Out-of-range
    values are clamped, never rejected: a header never fails a request. The ceiling comes
    last and therefore wins over ``minimum`` when ``ceiling < minimum``.

    Example:
        >>> policy = PriorityPolicy(minimum=BATCH, maximum=INTERACTIVE)
        >>> policy.parse("1000"), policy.parse("Batch"), policy.parse("interactive", NORMAL)
        (100, -100, 0)

    Attributes:
        aliases: Name-to-number aliases, matched case-insensitively (ASCII only). Stored
            read-only with lower-cased names. Names must be visible ASCII without whitespace,
            at most :data:`MAX_HEADER_LENGTH` characters, not themselves numbers, and unique
            ignoring case; values must be ints (not bool). Defaults to
            :data:`DEFAULT_ALIASES`.
        default: The priority of an absent or unparseable header (default :data:`NORMAL`).
            Must lie within ``[minimum, maximum]``.
        minimum: The lowest priority a header can produce, or ``None`` for no lower bound.
        maximum: The highest priority a header can produce, or ``None`` for no upper bound.

    Raises:
        ConfigError: A field breaks the rules above, or ``minimum > maximum``. The message
            names the field(s).
    """

    aliases: Mapping[str, int] = attrs.field(
        default=DEFAULT_ALIASES, converter=_freeze_aliases, hash=False, repr=_mapping_repr
    )
    default: int = attrs.field(default=NORMAL, validator=_int_field)
    minimum: int | None = attrs.field(default=None, validator=_optional_int_field)
    maximum: int | None = attrs.field(default=None, validator=_optional_int_field)

    def __attrs_post_init__(self) -> None:
        low, high = self.minimum, self.maximum
        if low is not None and high is not None and low > high:
            raise ConfigError(f"minimum ({low}) must not be greater than maximum ({high})")
        if (low is not None and self.default < low) or (high is not None and self.default > high):
            raise ConfigError(
                f"default ({self.default}) must lie within [minimum ({low}), maximum ({high})]"
            )

    def parse(self, value: str | bytes | int | None, ceiling: int | None = None) -> int:
        """Parse a header value with this policy's aliases, default and limits.

        Args:
            value: The raw header value (see :func:`parse_priority` for the accepted forms).
                An ``int`` (not ``bool``) is taken as the number itself, then bounded.
            ceiling: The highest priority this caller may have, or ``None`` for no
                per-caller cap. Applied last: it wins even when it is below ``minimum``.

        Returns:
            The bounded priority.

        Raises:
            TypeError: ``value`` is not str, bytes, int or None, or is a bool; or ``ceiling``
                is not an int or None (or is a bool).

        Complexity: O(1) (the header is bounded by :data:`MAX_HEADER_LENGTH`).
        """
        _check_ceiling(ceiling)
        return self._bound(_parse(value, self.aliases, self.default), ceiling)

    def parse_stated(self, value: str | int, ceiling: int | None = None) -> int:
        """Parse a priority a caller *stated* (a JSON field, an argument): strictly.

        A header that cannot be parsed means the default (:meth:`parse`): a header never fails
        a request. A value a caller wrote on purpose is another matter: a typo'd alias
        (``"interactiv"``) should not quietly run at the default level. The accepted forms are
        :meth:`parse`'s (an integer, or an alias of :attr:`aliases`, case-insensitive ASCII,
        surrounding spaces allowed); the result is bounded as by :meth:`parse`.

        Args:
            value: An ``int`` (not ``bool``) or a string.
            ceiling: The caller's cap, or ``None`` (as in :meth:`parse`).

        Returns:
            The bounded priority.

        Raises:
            ValueError: ``value`` is a string that is neither an integer nor an alias; the
                message lists the aliases and says that any integer is accepted.
            TypeError: ``value`` is neither an int nor a str (or is a bool), or a bad
                ``ceiling``.

        Complexity: O(1) (at most :data:`MAX_HEADER_LENGTH` characters are examined).
        """
        _check_ceiling(ceiling)
        if _is_int(value):
            return self._bound(int(value), ceiling)
        if not isinstance(value, str):
            raise TypeError(f"a priority must be an int (not bool) or a str, got {value!r}")
        if len(value) <= MAX_HEADER_LENGTH:  # before any other work
            text = value.strip(_OWS)
            if _NUMBER.fullmatch(text):
                return self._bound(int(text), ceiling)
            if text.isascii() and text.lower() in self.aliases:
                return self._bound(self.aliases[text.lower()], ceiling)
        shown = value if len(value) <= 40 else f"{value[:37]}..."
        known = sorted(self.aliases.items(), key=lambda item: (-item[1], item[0]))
        names = ", ".join(f"{name} ({number})" for name, number in known)
        raise ValueError(
            f"priority {shown!r} ({len(value)} characters) is neither an integer nor an alias: "
            f"send an integer (e.g. 100, 0, -100) or one of {names or 'no aliases'}"
        )

    def clamp(self, value: int, ceiling: int | None = None) -> int:
        """Bound an already-numeric priority: into ``[minimum, maximum]``, then under ``ceiling``.

        Args:
            value: The priority.
            ceiling: The caller's cap, or ``None``; it wins over ``minimum``.

        Returns:
            ``value`` clamped into the policy's range, then capped at ``ceiling``.

        Raises:
            TypeError: ``value`` is not an int, or ``ceiling`` is not an int or None (bools
                are refused for both).

        Complexity: O(1).
        """
        if not _is_int(value):
            raise TypeError(f"value must be an int (not bool), got {value!r}")
        _check_ceiling(ceiling)
        return self._bound(int(value), ceiling)

    def _bound(self, value: int, ceiling: int | None) -> int:
        if self.maximum is not None and value > self.maximum:
            value = self.maximum
        if self.minimum is not None and value < self.minimum:
            value = self.minimum
        if ceiling is not None and value > ceiling:
            value = int(ceiling)
        return value

    def with_aliases(
        self, aliases: Mapping[str, int] | None = None, /, **extra: int
    ) -> PriorityPolicy:
        """Return a copy of this policy with more aliases (new names win over old ones).

        Names are compared case-insensitively, so ``with_aliases(Batch=-50)`` replaces
        ``batch``. Use the positional mapping for names that are not Python identifiers
        (``with_aliases({"low-latency": 50})``).

        Args:
            aliases: Extra aliases as a mapping (optional, positional only).
            **extra: Extra aliases as keyword arguments (applied after ``aliases``).

        Returns:
            A new policy; this one is unchanged.

        Raises:
            ConfigError: An alias name or value breaks the rules of :attr:`aliases`, or
                ``aliases`` repeats a name ignoring case.

        Complexity: O(number of aliases).
        """
        merged = dict(self.aliases)
        merged.update(_freeze_aliases(aliases if aliases is not None else {}))
        merged.update(_freeze_aliases(extra))
        return attrs.evolve(self, aliases=merged)
