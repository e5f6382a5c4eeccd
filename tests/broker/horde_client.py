"""A horde-sdk client, unmodified, as a new user runs it: ``AI_HORDE_URL`` points at the broker.

Run by ``test_horde_sdk.py`` in a subprocess (horde-sdk reads ``AI_HORDE_URL`` once, when
it is imported). ``python horde_client.py KEY submit N`` submits a request of N images and
checks it; ``... KEY status ID`` reads its status; ``... KEY cancel ID`` deletes it;
``... KEY generate N`` runs the simple client's whole request (it polls until done). Each
prints one JSON line.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def main(argv: list[str]) -> dict[str, Any]:
    from horde_sdk.ai_horde_api.ai_horde_clients import AIHordeAPIManualClient
    from horde_sdk.ai_horde_api.apimodels import (
        ImageGenerateAsyncRequest,
        ImageGenerateAsyncResponse,
        ImageGenerationInputPayload,
    )
    from horde_sdk.ai_horde_api.fields import JobID

    key, action, arg = argv
    if action == "generate":  # the simple client: submit, poll check every 4 s, read status
        from horde_sdk.ai_horde_api.ai_horde_clients import AIHordeAPISimpleClient

        simple = AIHordeAPISimpleClient()
        request = ImageGenerateAsyncRequest(
            apikey=key, prompt="a castle", models=["sdxl"],
            params=ImageGenerationInputPayload(n=int(arg)),
        )  # fmt: skip
        final, job_id = simple.image_generate_request(request, timeout=90)
        return {"id": str(job_id), "models": [g.model for g in final.generations]}
    client = AIHordeAPIManualClient()
    if action == "submit":
        request = ImageGenerateAsyncRequest(
            apikey=key,
            prompt="a lighthouse at dusk",
            models=["sdxl", "flux_1"],
            params=ImageGenerationInputPayload(
                width=1024, height=1024, steps=30, sampler_name="k_dpmpp_2s_a", n=int(arg)
            ),
        )
        answer = client.submit_request(request, ImageGenerateAsyncResponse)
        assert isinstance(answer, ImageGenerateAsyncResponse), answer
        check = client.get_generate_check(answer.id_)
        return {"id": str(answer.id_), "kudos": answer.kudos, "check": check.model_dump()}
    job = JobID(root=arg)  # type: ignore[arg-type]
    if action == "status":
        status = client.get_generate_status(job)
    else:
        status = client.delete_pending_image(job)
    return {
        "done": status.done,
        "finished": status.finished,
        "waiting": status.waiting,
        "generations": [
            {
                "id": str(g.id_),
                "img": g.img,
                "model": g.model,
                "worker": g.worker_name,
                "seed": g.seed,
            }
            for g in status.generations
        ],
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
