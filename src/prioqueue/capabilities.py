"""Declarative worker capabilities and job needs: which worker of a fleet may run which job.

Theory of operation (the note is docs/design/capabilities.md):

* A worker declares what it can run, as data (:class:`Capabilities`): the largest image in
  pixels, the features it offers (:data:`FEATURES`), whether it runs NSFW work, a step limit
  and a word blacklist. A job declares what it needs (:class:`Needs`): its pixels, features,
  steps, whether it is NSFW, the text a blacklist is matched against, and the models it
  accepts (several: the grant chooses one).
* :func:`unfit` is the one rule: the first cause (:data:`CAPABILITY_CAUSES`, in order) that
  keeps a job from a worker, or None. ``FleetDispatcher.pop`` skips a job that does not fit,
  ``idle_reasons`` counts the skips by cause and ``explain`` lists, per live worker, why it
  cannot run a job. Both values are plain data, so a journal replays them and a snapshot
  keeps them (a callable ``accepts`` filter can be neither).
* :func:`chosen_model` is the model a grant of a multi-model job loads: the worker's resident
  model when the job accepts it (no swap), else the first of the job's models the worker
  serves. A lease is sized with that model.

Everything here is O(1) in the queue (O(features + blacklist words) per check).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any, Final, TypeVar

import attrs

from prioqueue._validate import count, flag

__all__ = [
    "CAPABILITY_CAUSES",
    "FEATURES",
    "Capabilities",
    "Needs",
    "chosen_model",
    "unfit",
]

FEATURES: Final = ("img2img", "inpainting", "controlnet", "lora", "post_processing")
"""The features a job may need and a worker may offer."""

CAPABILITY_CAUSES: Final = (
    "model",
    "undeclared",
    "max_pixels",
    "max_steps",
    *FEATURES,
    "nsfw",
    "blacklist",
)
"""Why a job does not fit a worker, in the order :func:`unfit` checks them."""


def _features(name: str, value: object) -> frozenset[str]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ValueError(f"{name} must be a collection of feature names, got {value!r}")
    items = frozenset(value)
    unknown = sorted(str(item) for item in items if item not in FEATURES)
    if unknown:
        raise ValueError(
            f"{name}: unknown feature(s) {', '.join(unknown)}; allowed: {', '.join(FEATURES)}"
        )
    return items


def _limit(name: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1 or None, got {value!r}")
    return value


def _words(value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ValueError(f"blacklist must be a collection of words, got {value!r}")
    words = []
    for word in value:
        if not isinstance(word, str) or not word.strip():
            raise ValueError(f"blacklist words must be non-empty strs, got {word!r}")
        words.append(word.strip().lower())
    return tuple(sorted(set(words)))


def _models(value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ValueError(f"models must be a list of model names, got {value!r}")
    models: list[str] = []
    for model in value:
        if not isinstance(model, str) or not model:
            raise ValueError(f"models must hold non-empty strs, got {model!r}")
        if model not in models:
            models.append(model)
    return tuple(models)


def _max_pixels(value: object) -> int | None:
    return _limit("max_pixels", value)


def _max_steps(value: object) -> int | None:
    return _limit("max_steps", value)


def _feature_set(value: object) -> frozenset[str]:
    return _features("features", value)


def _nsfw(value: object) -> bool:
    return flag("nsfw", value)


def _declared_only(value: object) -> bool:
    return flag("declared_only", value)


def _pixels(value: object) -> int:
    return count("pixels", value)


def _steps(value: object) -> int:
    return count("steps", value)


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"text must be a str, got {value!r}")
    return value


def _checked_keys(kind: str, data: object, allowed: Collection[str]) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ValueError(f"{kind} must be a mapping, got {data!r}")
    unknown = sorted(str(key) for key in data if key not in allowed)
    if unknown:
        raise ValueError(
            f"{kind}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}"
        )
    return data


@attrs.frozen(kw_only=True)
class Capabilities:
    """What a worker can run (declarative, so it is journaled and snapshotted).

    Attributes:
        max_pixels: The largest ``width * height`` it renders, or None for no limit.
        features: The features it offers (a subset of :data:`FEATURES`).
        nsfw: Whether it takes jobs marked NSFW.
        max_steps: The most sampler steps it runs, or None for no limit.
        blacklist: Words it refuses: a job whose text holds one (case-insensitive,
            substring) does not fit. Stored lower-case and sorted.
        declared_only: Take only jobs that declare their needs: a job without ``needs``
            (whose payload such a worker may not understand) does not fit (``"undeclared"``).

    Raises:
        ValueError: A value is out of range or a feature is unknown (the message lists the
            allowed ones).
    """

    max_pixels: int | None = attrs.field(default=None, converter=_max_pixels)
    features: frozenset[str] = attrs.field(default=frozenset(FEATURES), converter=_feature_set)
    nsfw: bool = attrs.field(default=True, converter=_nsfw)
    max_steps: int | None = attrs.field(default=None, converter=_max_steps)
    blacklist: tuple[str, ...] = attrs.field(default=(), converter=_words)
    declared_only: bool = attrs.field(default=False, converter=_declared_only)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Capabilities:
        """Build from :meth:`as_dict` data (a journal's or a snapshot's JSON). O(k).

        Raises:
            ValueError: Not a mapping, an unknown key, or a bad value.
        """
        fields = attrs.fields_dict(cls)
        return cls(**_checked_keys("capabilities", data, fields))

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (sorted features). O(k)."""
        return {
            "max_pixels": self.max_pixels,
            "features": sorted(self.features),
            "nsfw": self.nsfw,
            "max_steps": self.max_steps,
            "blacklist": list(self.blacklist),
            "declared_only": self.declared_only,
        }


@attrs.frozen(kw_only=True)
class Needs:
    """What a job needs from the worker that runs it (declarative, journaled).

    Attributes:
        models: The models it accepts, in order of preference; empty: the job's ``model``
            decides alone (a job with several models is submitted with ``model=None``).
        pixels: Its ``width * height`` (0: no image).
        steps: Its sampler steps (0: none).
        features: The features it needs (a subset of :data:`FEATURES`).
        nsfw: Whether it is marked NSFW.
        text: The text a worker's blacklist is matched against (its prompt).

    Raises:
        ValueError: A value is out of range or a feature is unknown.
    """

    models: tuple[str, ...] = attrs.field(default=(), converter=_models)
    pixels: int = attrs.field(default=0, converter=_pixels)
    steps: int = attrs.field(default=0, converter=_steps)
    features: frozenset[str] = attrs.field(default=frozenset(), converter=_feature_set)
    nsfw: bool = attrs.field(default=False, converter=_nsfw)
    text: str = attrs.field(default="", converter=_text)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Needs:
        """Build from :meth:`as_dict` data. O(k).

        Raises:
            ValueError: Not a mapping, an unknown key, or a bad value.
        """
        return cls(**_checked_keys("needs", data, attrs.fields_dict(cls)))

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (sorted features). O(k)."""
        return {
            "models": list(self.models),
            "pixels": self.pixels,
            "steps": self.steps,
            "features": sorted(self.features),
            "nsfw": self.nsfw,
            "text": self.text,
        }


_Checked = TypeVar("_Checked", Needs, Capabilities)


def _checked(value: object, kind: type[_Checked], name: str) -> _Checked | None:
    """``value`` as a ``kind``: itself, from its mapping form, or None. O(k).

    Raises:
        ValueError: Not one of those (``name`` says whose), or a bad value.
    """
    if value is None or isinstance(value, kind):
        return value
    if isinstance(value, Mapping):
        return kind.from_mapping(value)
    raise ValueError(
        f"{name} must be a {kind.__name__}, a mapping of its fields or None, got {value!r}"
    )


def checked_needs(value: object) -> Needs | None:
    """A submit's ``needs``: a :class:`Needs`, its mapping form, or None. O(k).

    Raises:
        ValueError: Not one of those, or a bad value.
    """
    return _checked(value, Needs, "needs")


def checked_capabilities(value: object) -> Capabilities | None:
    """A join's ``capabilities``: a :class:`Capabilities`, its mapping form, or None. O(k).

    Raises:
        ValueError: Not one of those, or a bad value.
    """
    return _checked(value, Capabilities, "capabilities")


def unfit(
    served: frozenset[str] | None, capabilities: Capabilities | None, needs: Needs | None
) -> str | None:
    """The first cause (:data:`CAPABILITY_CAUSES` order) that keeps a job from a worker.

    Args:
        served: The models the worker serves (None: every model).
        capabilities: What it declared (None: it runs anything).
        needs: What the job needs (None: it declared nothing).

    Returns:
        The cause, or None when the job fits. O(models + features + blacklist x text).
    """
    if needs is None:
        declared_only = capabilities is not None and capabilities.declared_only
        return "undeclared" if declared_only else None
    models = needs.models
    if models and served is not None and not any(model in served for model in models):
        return "model"
    caps = capabilities
    if caps is None:
        return None
    if caps.max_pixels is not None and needs.pixels > caps.max_pixels:
        return "max_pixels"
    if caps.max_steps is not None and needs.steps > caps.max_steps:
        return "max_steps"
    missing = needs.features - caps.features
    if missing:
        return next(feature for feature in FEATURES if feature in missing)
    if needs.nsfw and not caps.nsfw:
        return "nsfw"
    if caps.blacklist and needs.text:
        text = needs.text.lower()
        if any(word in text for word in caps.blacklist):
            return "blacklist"
    return None


def chosen_model(
    models: tuple[str, ...], served: frozenset[str] | None, resident: str | None
) -> str:
    """The model a grant of a job accepting ``models`` loads on a worker (it must fit).

    The resident model when the job accepts it and the worker serves it (no swap), else the
    first of the job's models the worker serves. O(models).
    """
    if resident is not None and resident in models and (served is None or resident in served):
        return resident
    for model in models:
        if served is None or model in served:
            return model
    raise ValueError(f"no model of {models!r} is served (call unfit first)")
