"""A job's submit fields, declared once: name, rule, doc and the layers that carry each.

:data:`JOB_FIELDS` lists every field a submit may carry, in the order the broker journals
them. Each :class:`JobField` says which layers carry it (:data:`LAYERS`):

=========  ===========================================================================
core       an option of every ``submit`` of the library (``SubmitOptions``)
request    a field of the broker's ``POST /v1/jobs`` body (``SubmitRequest``)
engine     a keyword of the broker's journaled ``submit`` (a journal row's arguments)
record     kept on the broker's ``JobRecord`` (so in its snapshot: the store restores it)
view       answered by ``GET /v1/jobs/{id}`` (``JobView``)
client     a keyword of ``Broker.submit`` (``SubmitFields``)
cli        a flag of ``prioqueue jobs submit`` (:attr:`JobField.cli`)
=========  ===========================================================================

What forwards a field between layers reads this list and names no field: the broker's
request-to-journal step, its replay check, its idempotency digest, the record it keeps, its
job view, the client's body and the command line's flags. What types a field (the core's
``SubmitOptions``, the broker's pydantic models, ``JobRecord``, the client's
``SubmitFields``) is written out for the type checker and the OpenAPI document, and
``tests/test_jobfields.py`` checks each against this list: a field declared and not typed
(or typed and not declared) fails there. The recipe for a new field is in
``docs/design/state.md`` ("Adding a job field").

Complexity: the module's lookups are O(1) (tuples and sets built at import).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, cast

__all__ = [
    "JOB_FIELDS",
    "LABEL_KEY",
    "LAYERS",
    "MAX_LABELS",
    "MAX_LABEL_VALUE",
    "CliFlag",
    "JobField",
    "Layer",
    "checked_labels",
    "field_named",
    "fields_in",
    "names_in",
]

Layer = Literal["core", "request", "engine", "record", "view", "client", "cli"]
LAYERS: Final[tuple[Layer, ...]] = ("core", "request", "engine", "record", "view", "client", "cli")
"""Every layer a field may be carried by (see the module docstring)."""

MAX_LABELS: Final = 32
"""The most labels a job may carry."""
MAX_LABEL_VALUE: Final = 256
"""The longest label value (characters)."""
LABEL_KEY: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,62}")
"""A label key: 1..63 characters, letters, digits and ``._/-``, starting with a letter or
digit (a ``fullmatch``)."""


def checked_labels(value: object) -> dict[str, str] | None:
    """A job's ``labels`` as a new dict, or None: the rule of the ``labels`` field. O(size).

    At most :data:`MAX_LABELS` entries; each key matches :data:`LABEL_KEY`, each value is a
    string of at most :data:`MAX_LABEL_VALUE` characters without control characters.

    Raises:
        ValueError: ``value`` is neither None nor such a mapping (the message says what is
            wrong and with which key).
    """
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError(f"labels must be an object of strings, got {type(value).__name__}")
    if len(value) > MAX_LABELS:
        raise ValueError(f"at most {MAX_LABELS} labels, got {len(value)}")
    labels: dict[str, str] = {}
    for key, text in value.items():
        if not isinstance(key, str) or not LABEL_KEY.fullmatch(key):
            raise ValueError(
                f"label key {str(key)[:70]!r} must be 1..63 letters, digits or '._/-', "
                "starting with a letter or digit"
            )
        if not isinstance(text, str):
            raise ValueError(f"label {key!r} must be a string, got {type(text).__name__}")
        if len(text) > MAX_LABEL_VALUE or not text.isprintable():
            raise ValueError(
                f"label {key!r} must be at most {MAX_LABEL_VALUE} printable characters"
            )
        labels[key] = text
    return labels


@dataclass(frozen=True)
class CliFlag:
    """How ``prioqueue jobs submit`` takes a field.

    Attributes:
        help: The flag's help text.
        kind: ``text`` (the string), ``number`` (a float), ``json`` (JSON text),
            ``priority`` (an integer when it reads as one, else the alias) or ``pairs``
            (``KEY=VALUE``, repeatable, gathered into an object).
        flag: The flag's name without ``--`` (default: the field's name, ``_`` as ``-``).
        metavar: The value's name in the usage line (default: argparse's).
    """

    help: str
    kind: Literal["text", "number", "json", "priority", "pairs"] = "text"
    flag: str | None = None
    metavar: str | None = None


@dataclass(frozen=True)
class JobField:
    """One submit field of a job (see the module docstring).

    Attributes:
        name: The field's name in every layer that carries it.
        doc: What it means (the request body's and the job view's description).
        layers: The layers that carry it.
        sparse: The broker journals it, and counts it in the idempotency digest, only when
            it is set (not None): a row written before the field existed reads the same.
        required: The broker's ``submit`` needs it (the key gives ``member`` and ``tier``).
        journal: The JSON types the broker's ``submit`` accepts for it (a journal row
            edited by hand is refused naming it); () when its ``rule`` or the core checks it.
        rule: Checks a value and returns it normalised (raises ``ValueError``); the broker
            applies it to the request body and to every journaled ``submit``.
        digest: Its key in the idempotency digest (None: not part of it).
        cli: Its flag, when ``prioqueue jobs submit`` has one (else ``--field NAME=JSON``).
    """

    name: str
    doc: str
    layers: frozenset[Layer]
    sparse: bool = True
    required: bool = False
    journal: tuple[type, ...] = ()
    rule: Callable[[Any], Any] | None = None
    digest: str | None = None
    cli: CliFlag | None = field(default=None, compare=False)


def _field(name: str, doc: str, layers: str, **more: Any) -> JobField:
    chosen = frozenset(layers.split())
    unknown = chosen.difference(LAYERS)
    if unknown:  # pragma: no cover - a typo in the table below
        raise ValueError(f"{name}: unknown layers {sorted(unknown)}")
    return JobField(name, doc, cast("frozenset[Layer]", chosen), **more)


_NONE = type(None)

JOB_FIELDS: Final[tuple[JobField, ...]] = (
    _field(
        "member",
        "Who the job belongs to (the broker takes it from the API key).",
        "engine record",
        sparse=False,
        required=True,
        journal=(str,),
    ),
    _field(
        "tier",
        "The member's tier (the broker takes it from the API key).",
        "core engine",
        sparse=False,
        required=True,
        journal=(str,),
    ),
    _field(
        "priority",
        "A number or an alias (interactive, normal, batch); capped at the key's "
        "max_priority; anything else is a 422 that lists the aliases. Absent: the "
        "X-LlamaSwap-Priority header (unparseable there: the default), else the policy's "
        "default.",
        "core request engine record view client cli",
        sparse=False,
        required=True,
        journal=(int,),
        digest="p",
        cli=CliFlag("a number or an alias (interactive, batch...)", "priority"),
    ),
    _field(
        "model",
        "The model the job needs loaded.",
        "core request engine record view client cli",
        sparse=False,
        journal=(str, _NONE),
        digest="m",
        cli=CliFlag("the model the job needs"),
    ),
    _field(
        "estimate",
        "Expected runtime in seconds.",
        "core request engine record client cli",
        sparse=False,
        journal=(int, float, _NONE),
        digest="e",
        cli=CliFlag("expected runtime in seconds", "number"),
    ),
    _field(
        "group",
        "A label grouping jobs (a film); no '/' (it is a path segment).",
        "core request engine record view client cli",
        sparse=False,
        journal=(str, _NONE),
        digest="g",
        cli=CliFlag("a group label (a film)"),
    ),
    _field(
        "image",
        "Lease inputs (width, height, steps, sampler, controlnet, baseline, loras): the "
        "lease is computed from them at pop time.",
        "request engine record client",
        sparse=False,
        journal=(dict, _NONE),
        digest="i",
    ),
    _field(
        "payload",
        "Opaque JSON handed to the worker (at most 64 levels deep).",
        "core request engine record",
        sparse=False,
        digest="b",
    ),
    _field(
        "idempotency_key",
        "Names the submit: the same key with the same body replays its job (a header).",
        "engine record",
        sparse=False,
        journal=(str, _NONE),
    ),
    _field(
        "ceiling",
        "The caller's priority ceiling (the broker passes the resolved level).",
        "core",
    ),
    _field(
        "ttl",
        "Seconds the job may stay queued once eligible; then it is 'expired'. Absent: the "
        "level's budget ttl, else none.",
        "core request engine client",
        digest="t",
    ),
    _field(
        "not_before",
        "Unix time (the broker's clock) before which the job is not eligible: it is "
        "'queued' with not_before until then.",
        "core request engine client",
        digest="n",
    ),
    _field(
        "max_attempts",
        "Grants the job may get (expired leases and retried failures). Absent: the "
        "broker's max_attempts.",
        "core request engine record client",
        digest="a",
    ),
    _field(
        "backoff",
        "Retry delays of fail with retry=true (absent: the broker's).",
        "core request engine client",
        digest="k",
    ),
    _field(
        "needs",
        "What the job needs from its worker (pixels, steps, features, models); absent: "
        "nothing (any worker that serves its model).",
        "core request engine client cli",
        digest="q",
        cli=CliFlag(
            'what the job needs from its worker, e.g. \'{"features": ["lora"], '
            '"pixels": 1048576}\' (models, pixels, steps, features, nsfw, text)',
            "json",
            metavar="JSON",
        ),
    ),
    _field(
        "labels",
        f"The job's labels, shown with it (GET /v1/jobs/{{id}}, the dashboard): at most "
        f"{MAX_LABELS} keys of 1..63 letters, digits or '._/-', each with a string of at most "
        f"{MAX_LABEL_VALUE} printable characters.",
        "request engine record view client cli",
        rule=checked_labels,
        digest="l",
        cli=CliFlag("a label KEY=VALUE (repeatable)", "pairs", flag="label", metavar="KEY=VALUE"),
    ),
)
"""Every submit field, in the order the broker journals them."""

_BY_NAME: Final = {f.name: f for f in JOB_FIELDS}


def field_named(name: str) -> JobField:
    """The declared field ``name``. O(1).

    Raises:
        KeyError: No field has that name.
    """
    return _BY_NAME[name]


def fields_in(*layers: Layer) -> tuple[JobField, ...]:
    """The fields carried by every one of ``layers``, in declaration order. O(fields).

    Raises:
        ValueError: A layer that :data:`LAYERS` does not name.
    """
    unknown = set(layers).difference(LAYERS)
    if unknown:
        raise ValueError(f"unknown layers {sorted(unknown)}; known: {', '.join(LAYERS)}")
    return tuple(f for f in JOB_FIELDS if f.layers.issuperset(layers))


def names_in(*layers: Layer) -> tuple[str, ...]:
    """The names of :func:`fields_in` ``(*layers)``. O(fields).

    Raises:
        ValueError: A layer that :data:`LAYERS` does not name.
    """
    return tuple(f.name for f in fields_in(*layers))
