"""The sampler tables and the sampler work ``W`` of a lease (rule 1 of :mod:`prioqueue.lease`).

Part of :mod:`prioqueue.lease`, which re-exports every public name here; import them from
there. Sampler names match case-sensitively, as AI Horde's do.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from prioqueue.lease_values import _check_positive_int, _check_sampler

__all__ = ["FLAT_WORK_SAMPLERS", "SAMPLER_UNITS", "sampler_work"]

_ONE_UNIT = (
    # AI Horde names.
    *("k_lms", "k_euler", "k_euler_a", "k_dpm_fast", "k_dpmpp_2m", "k_dpmpp_2m_sde"),
    *("k_dpmpp_3m_sde", "dpmsolver", "lcm", "DDIM"),
    # k-diffusion / ComfyUI names of single-evaluation samplers.
    *("euler", "euler_cfg_pp", "euler_ancestral", "euler_ancestral_cfg_pp", "lms", "dpm_fast"),
    *("dpmpp_2m", "dpmpp_2m_cfg_pp", "dpmpp_2m_sde", "dpmpp_2m_sde_gpu", "dpmpp_3m_sde"),
    *("dpmpp_3m_sde_gpu", "ddpm", "ipndm", "ipndm_v", "deis", "res_multistep"),
    *("res_multistep_cfg_pp", "res_multistep_ancestral", "res_multistep_ancestral_cfg_pp"),
    *("gradient_estimation", "gradient_estimation_cfg_pp", "er_sde", "sa_solver"),
    *("ddim", "uni_pc", "uni_pc_bh2"),
)
_TWO_UNITS = (
    *("k_heun", "k_dpm_2", "k_dpm_2_a", "k_dpmpp_2s_a", "k_dpmpp_sde", "exp_heun_2_x0"),
    *("exp_heun_2_x0_sde", "dpmpp_2s_ancestral_cfg_pp", "seeds_2", "sa_solver_pece"),
)
_THREE_UNITS = ("heunpp2", "seeds_3")

SAMPLER_UNITS: Mapping[str, int] = MappingProxyType(
    {
        **dict.fromkeys(_ONE_UNIT, 1),
        **dict.fromkeys(_TWO_UNITS, 2),
        **dict.fromkeys(_THREE_UNITS, 3),
    }
)
"""Work units per trajectory step of each known fixed-step sampler (read-only, case-sensitive)."""

FLAT_WORK_SAMPLERS: Mapping[str, int] = MappingProxyType({"k_dpm_adaptive": 40})
"""Samplers whose work is a flat estimate whatever the requested steps (read-only)."""


def _work(
    units: Mapping[str, int], flat: Mapping[str, int], strict: bool, sampler: str, steps: int
) -> int:
    per_step = units.get(sampler)
    if per_step is not None:
        return per_step * steps
    fixed = flat.get(sampler)
    if fixed is not None:
        return fixed
    if strict:
        raise ValueError(
            f"sampler {sampler!r} is not a known sampler (strict mode; names are "
            f"case-sensitive); known: {', '.join(sorted([*units, *flat]))}"
        )
    folded = sampler.casefold()
    spelled = sorted(name for name in (*units, *flat) if name.casefold() == folded)
    if spelled:  # "K_EULER": a typo of a known sampler, not a new one worth 1 unit a step
        raise ValueError(
            f"sampler {sampler!r} is not known; names are case-sensitive: did you mean "
            f"{' or '.join(map(repr, spelled))}?"
        )
    return steps


def sampler_work(sampler: str, steps: int, *, strict: bool = False) -> int:
    """Estimated sampler work ``W`` under the default tables. O(1).

    Args:
        sampler: Sampler name (case-sensitive).
        steps: Requested steps, a positive int.
        strict: If true, an unknown sampler raises instead of counting 1 unit per step.

    Returns:
        ``units * steps``, 40 for ``k_dpm_adaptive`` whatever the steps, or ``steps`` for an
        unknown sampler (O(known samplers) for an unknown name, checked against known names
        ignoring case).

    Raises:
        TypeError: Wrong argument types.
        ValueError: ``steps`` < 1, an unknown sampler when ``strict``, or (always) a name
            that differs from a known one only by case (``"K_EULER"``).
    """
    _check_sampler(sampler)
    _check_positive_int("steps", steps)
    return _work(SAMPLER_UNITS, FLAT_WORK_SAMPLERS, strict, sampler, steps)
