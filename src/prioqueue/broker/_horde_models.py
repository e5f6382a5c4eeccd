"""The AI Horde's request bodies as the ``/api/v2/`` routes read them (private).

The field names and defaults are the AI Horde's (``GenerationInputStable``, ``PopInputStable``,
``SubmitInputStable``; horde-sdk's models send them). Fields the broker does not use are
accepted and ignored, as the Horde ignores what it does not know; what it cannot do (R2
uploads, webhooks) is answered in ``warnings`` or documented (docs/horde.md). Then the
mappings onto the broker: a request's :class:`~prioqueue.capabilities.Needs` and lease
inputs, a pop's :class:`~prioqueue.capabilities.Capabilities`, and the ids: a request id is a
UUID holding 64 random bits (the request's group label: unguessable) and its first job's
number and image count; a job's id is a UUID holding its broker number.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Final

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from prioqueue.broker._horde_config import HordeConfig
from prioqueue.capabilities import Capabilities, Needs

__all__ = [
    "AsyncRequest",
    "PopRequest",
    "SubmitRequest",
    "job_id_of",
    "job_uuid",
    "request_jobs",
    "request_uuid",
    "worker_uuid",
]

_JOB_TAG: Final = 0x70_72_69_6F_71_75_65_6A  # "prioquej": a job's UUID, high 64 bits
_WORKER_NAMESPACE: Final = uuid.UUID("5b0c9a4e-6a61-4e0b-9d38-7072696f7175")
_PAINTING: Final = frozenset(("inpainting", "outpainting"))


ModelName = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f]+$")]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class Lora(_Body):
    """One LoRA of a request (only its presence matters to the broker)."""

    name: str = Field(min_length=1, max_length=255)


class Params(_Body):
    """``params`` of ``POST /api/v2/generate/async`` (``ModelGenerationInputStable``)."""

    sampler_name: str = Field(default="k_euler_a", max_length=64)
    width: int = Field(default=512, ge=64, le=3072)
    height: int = Field(default=512, ge=64, le=3072)
    steps: int = Field(
        default=30, ge=1, le=500, validation_alias=AliasChoices("steps", "ddim_steps")
    )
    n: int = Field(default=1, ge=1, le=20, validation_alias=AliasChoices("n", "n_iter"))
    control_type: str | None = Field(default=None, max_length=64)
    loras: list[Lora] | None = Field(default=None, max_length=5)
    post_processing: list[str] = Field(default_factory=list, max_length=10)
    seed: str | None = Field(default=None, max_length=256)


class AsyncRequest(_Body):
    """``POST /api/v2/generate/async`` (``GenerationInputStable``)."""

    prompt: str = Field(min_length=1, max_length=50_000)
    params: Params = Field(default_factory=Params)
    models: list[ModelName] = Field(default_factory=list, max_length=100)
    nsfw: bool = False
    censor_nsfw: bool = False
    r2: bool = True
    shared: bool = False
    source_image: str | None = None
    source_processing: str = Field(default="img2img", max_length=32)
    source_mask: str | None = None
    dry_run: bool = False

    def features(self) -> set[str]:
        """The features a worker needs for it (``prioqueue.capabilities.FEATURES``)."""
        params = self.params
        wanted = set()
        if self.source_image is not None:
            wanted.add("inpainting" if self.source_processing in _PAINTING else "img2img")
        if params.control_type:
            wanted.add("controlnet")
        if params.loras:
            wanted.add("lora")
        if params.post_processing:
            wanted.add("post_processing")
        return wanted

    def needs(self) -> Needs:
        """What a worker must offer to run one image of it."""
        params = self.params
        return Needs(
            models=self.models,
            pixels=params.width * params.height,
            steps=params.steps,
            features=self.features(),
            nsfw=self.nsfw,
            text=self.prompt,
        )

    def image(self, config: HordeConfig) -> dict[str, Any]:
        """The lease inputs (ADR-13), the baseline of each accepted model included."""
        params = self.params
        return {
            "width": params.width, "height": params.height, "steps": params.steps,
            "sampler": params.sampler_name, "controlnet": bool(params.control_type),
            "loras": len(params.loras or ()),
            "baselines": {model: config.baseline(model) for model in self.models},
        }  # fmt: skip

    def payload(self, index: int) -> dict[str, Any]:
        """What a worker gets back in its pop (the Horde's names), for image ``index``."""
        params = self.params.model_dump(exclude={"n"})
        params["loras"] = [lora.model_dump() for lora in self.params.loras or ()]
        return {
            "prompt": self.prompt, "params": params, "nsfw": self.nsfw,
            "censor_nsfw": self.censor_nsfw, "source_image": self.source_image,
            "source_processing": self.source_processing if self.source_image else "txt2img",
            "source_mask": self.source_mask, "index": index,
        }  # fmt: skip


class PopRequest(_Body):
    """``POST /api/v2/generate/pop`` (``PopInputStable``)."""

    name: str = Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f]+$")
    models: list[ModelName] = Field(default_factory=list, max_length=500)
    max_pixels: int = Field(default=512 * 512, ge=1)
    nsfw: bool = False
    blacklist: list[Annotated[str, Field(max_length=200)]] = Field(
        default_factory=list, max_length=500
    )
    allow_img2img: bool = True
    allow_painting: bool = False
    allow_post_processing: bool = True
    allow_controlnet: bool = False
    allow_lora: bool = False
    amount: int = Field(default=1, ge=1, le=20)
    threads: int = Field(default=1, ge=1, le=50)
    limit_max_steps: bool = False
    extra_slow_worker: bool = False
    bridge_agent: str = Field(default="unknown:0:unknown", max_length=1000)

    def capabilities(self, config: HordeConfig) -> Capabilities:
        """What the worker declares it can run."""
        offered = {
            "img2img": self.allow_img2img, "inpainting": self.allow_painting,
            "controlnet": self.allow_controlnet, "lora": self.allow_lora,
            "post_processing": self.allow_post_processing,
        }  # fmt: skip
        return Capabilities(
            max_pixels=self.max_pixels,
            features={name for name, on in offered.items() if on},
            nsfw=self.nsfw,
            max_steps=config.limited_steps if self.limit_max_steps else None,
            blacklist=[word for word in self.blacklist if word.strip()],
            declared_only=True,  # /v1/ jobs (no needs) carry payloads it cannot read
        )

    def spec(self, config: HordeConfig) -> dict[str, Any]:
        """The broker's pop settings (``PopSpec``) for this worker."""
        return {
            "models": sorted(set(self.models)) or None,
            "resident": None,
            "slots": max(self.threads + config.prefetch, self.amount),
            "slow": self.extra_slow_worker,
            "capabilities": self.capabilities(config).as_dict(),
        }


class SubmitRequest(_Body):
    """``POST /api/v2/generate/submit`` (``SubmitInputStable``)."""

    id: str = Field(min_length=1, max_length=64)
    generation: str = ""
    state: str = Field(default="ok", pattern=r"^(ok|censored|faulted|csam)$")
    seed: int | str = 0
    censored: bool = False
    gen_metadata: list[dict[str, Any]] | None = Field(default=None, max_length=100)


def _number(job_id: str) -> int:
    return int(job_id.rpartition("-")[2])


def job_uuid(job_id: str) -> str:
    """The UUID a Horde worker knows the broker job ``job-N`` by."""
    return str(uuid.UUID(int=(_JOB_TAG << 64) | _number(job_id)))


def job_id_of(value: str) -> str | None:
    """The broker job id a job UUID names, or None when it names none."""
    try:
        number = uuid.UUID(value).int
    except ValueError:
        return None
    if number >> 64 != _JOB_TAG:
        return None
    return f"job-{number & ((1 << 64) - 1)}"


def request_uuid(secret: int, first_job: str, n: int) -> str:
    """The id of a request of ``n`` images whose first job is ``first_job``."""
    return str(uuid.UUID(int=(secret << 64) | (_number(first_job) << 5) | (n - 1)))


def request_jobs(value: str) -> tuple[str, list[str]] | None:
    """A request id's group label and job ids, or None when it is not one."""
    try:
        number = uuid.UUID(value).int
    except ValueError:
        return None
    secret, low = number >> 64, number & ((1 << 64) - 1)
    if secret == _JOB_TAG or not secret:
        return None
    first, n = low >> 5, (low & 31) + 1
    return group_label(secret), [f"job-{first + i}" for i in range(n)]


def group_label(secret: int) -> str:
    """The group label of the request with this secret (its jobs' ``group``)."""
    return f"horde-{secret:016x}"


def worker_uuid(name: str) -> str:
    """A worker's stable UUID (the Horde's ``worker_id``), from its name."""
    return str(uuid.uuid5(_WORKER_NAMESPACE, name))
