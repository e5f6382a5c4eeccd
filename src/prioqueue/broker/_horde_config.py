"""The ``[horde]`` table of the broker configuration: the AI Horde compatible routes (private).

See docs/horde.md ("Run a private Horde"). Every value has a default, so a broker without the
table serves ``/api/v2/`` with anonymous requests off and the ADR-13 model baselines.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

import attrs

from prioqueue._service.config import Table
from prioqueue.lease import SLOW_BASELINE_MULTIPLIERS

__all__ = ["ANONYMOUS_KEY", "DEFAULT_MODEL_BASELINES", "HordeConfig", "horde_setting"]

ANONYMOUS_KEY: Final = "0000000000"
"""The AI Horde's anonymous API key (ten zeros)."""

DEFAULT_MODEL_BASELINES: Final[Mapping[str, str]] = MappingProxyType(
    {
        **{name: name for name in SLOW_BASELINE_MULTIPLIERS},
        "Flux.1-Schnell fp8 (Compact)": "flux_1",
        "sdxl": "stable_diffusion_xl",
        "stable_diffusion": "stable_diffusion_1",
    }
)
"""Model name -> baseline when ``[horde.model_baselines]`` does not name the model.

Every slow baseline of ADR-13 (``flux_1``, ``qwen_image``, ``z_image_turbo``...: the lease's
``slow_baseline_multipliers``) is its own model name; a model in neither table has no
baseline (no slow factor)."""


@attrs.frozen
class HordeConfig:
    """How the ``/api/v2/`` routes map the AI Horde onto the broker.

    Attributes:
        anonymous_member: The member that requests with the anonymous key (``0000000000``)
            are charged to; None (the default) refuses them (401).
        anonymous_tier: That member's tier.
        priority: The priority level of ``/api/v2/generate/async`` requests (capped by the
            key's ``max_priority``).
        model_baselines: Model name -> the baseline its lease uses (ADR-13's slow factor);
            the configured table over :data:`DEFAULT_MODEL_BASELINES`.
        max_images: Most images (``params.n``) in one request.
        max_pixels: Largest ``width * height`` a request may ask for.
        max_image_bytes: Largest ``source_image`` / ``source_mask`` (base64 characters).
        max_generation_bytes: Largest submitted ``generation`` (base64 characters).
        limited_steps: The step limit of a worker that pops with ``limit_max_steps``.
        prefetch: Jobs a worker may hold beyond its ``threads`` (its look-ahead queue).
        inline_max_bytes: A submitted image larger than this (base64 characters) is kept
            outside the journal rows (``prioqueue.broker._horde_blobs``); 0: every image.
        sweep_every: Seconds between two sweeps of the images whose jobs are gone.
    """

    anonymous_member: str | None = None
    anonymous_tier: str = "free"
    priority: int = 0
    model_baselines: Mapping[str, str] = DEFAULT_MODEL_BASELINES
    max_images: int = 20
    max_pixels: int = 3072 * 3072
    max_image_bytes: int = 8 * 1024 * 1024
    max_generation_bytes: int = 16 * 1024 * 1024
    limited_steps: int = 50
    prefetch: int = 1
    inline_max_bytes: int = 64 * 1024
    sweep_every: float = 600.0

    def baseline(self, model: str) -> str | None:
        """The baseline of ``model``, or None (no slow factor). O(1)."""
        return self.model_baselines.get(model)


def horde_setting(root: Table, tiers: Mapping[str, float]) -> HordeConfig:
    """Read the ``[horde]`` table (absent: the defaults).

    Raises:
        ConfigError: A value is invalid or a key unknown (the message names the key).
    """
    table = root.table("horde")
    defaults = HordeConfig()
    member = table.optional_string("anonymous_member")
    tier = table.string("anonymous_tier", defaults.anonymous_tier)
    if tier not in tiers:
        raise table.fail("anonymous_tier", f"unknown tier {tier!r}; known: {', '.join(tiers)}")
    priority = table.get("priority")
    if priority is None:
        priority = 0
    elif not isinstance(priority, int) or isinstance(priority, bool):
        raise table.fail("priority", f"must be an integer, got {priority!r}")
    baselines = table.table("model_baselines")
    mapping = dict(DEFAULT_MODEL_BASELINES)
    for model in baselines.data:
        mapping[model] = baselines.string(model, "")
    baselines.finish()
    config = HordeConfig(
        anonymous_member=member,
        anonymous_tier=tier,
        priority=priority,
        model_baselines=MappingProxyType(mapping),
        max_images=_int(table, "max_images", defaults.max_images),
        max_pixels=_int(table, "max_pixels", defaults.max_pixels),
        max_image_bytes=_int(table, "max_image_bytes", defaults.max_image_bytes),
        max_generation_bytes=_int(table, "max_generation_bytes", defaults.max_generation_bytes),
        limited_steps=_int(table, "limited_steps", defaults.limited_steps),
        prefetch=_int(table, "prefetch", defaults.prefetch, minimum=0),
        inline_max_bytes=_int(table, "inline_max_bytes", defaults.inline_max_bytes, minimum=0),
        sweep_every=table.number("sweep_every", defaults.sweep_every) or defaults.sweep_every,
    )
    table.finish()
    return config


def _int(table: Table, key: str, default: int, minimum: int = 1) -> int:
    value = table.integer(key, default, minimum=minimum)
    assert value is not None
    return value
