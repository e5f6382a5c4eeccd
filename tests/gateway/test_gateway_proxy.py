"""Forwarding, identity and the OpenAI client, through real servers."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from prioqueue.gateway.app import BadRequest, extract_model

from .gateway_helpers import CHAT, StackFactory, chat, run

KEYS = {
    "allow_anonymous": False,
    "keys": {
        "sk-web": {"member": "web", "tier": "max", "max_priority": 100},
        "sk-bulk": {"member": "bulk", "tier": "free", "max_priority": 0},
    },
}


def test_openai_client_plain_and_streaming(make_stack: StackFactory) -> None:
    stack = make_stack()
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key="anything", max_retries=0)
    try:
        raw = client.chat.completions.with_raw_response.create(
            model="model-a", messages=[{"role": "user", "content": "hi"}]
        )
        completion = raw.parse()
        assert completion.choices[0].message.content == "hello"
        assert raw.headers["x-prioqueue-priority"] == "0"
        assert len(raw.headers["x-prioqueue-job"]) == 32
        assert float(raw.headers["x-prioqueue-queue-wait"]) >= 0
        assert raw.headers["x-fake"] == "1"  # upstream headers are kept
        stream = client.chat.completions.create(
            model="model-b",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            extra_body={"fake": {"tokens": 4}},
        )
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream)
        assert text == "tok0 tok1 tok2 tok3 "
        embedding = client.embeddings.create(model="model-a", input="x")
        assert embedding.data[0].embedding == [0.0, 1.0]
    finally:
        client.close()
    assert stack.fake.max_active == 1
    assert [entry.model for entry in stack.fake.served] == ["model-a", "model-b", "model-a"]


def test_passthrough_keeps_status_headers_and_body(make_stack: StackFactory) -> None:
    stack = make_stack({"passthrough_paths": ["/v1/models", "/echo"]})
    with httpx.Client(base_url=stack.url, timeout=10) as client:
        models = client.get("/v1/models")
        assert models.status_code == 200
        assert models.json()["data"][0]["id"] == "model-a"
        missing = client.get("/nowhere")
        assert missing.status_code == 404
        assert missing.headers["x-fake"] == "404"
        echo = client.post(
            "/echo?a=1&b=%20",
            content=b"payload",
            headers={"X-Custom": "yes", "Connection": "keep-alive, X-Drop", "X-Drop": "1"},
        )
        seen = echo.json()
        assert seen["query"] == "a=1&b=%20"
        assert seen["body"] == "payload"
        assert seen["headers"]["x-custom"] == "yes"
        assert "x-drop" not in seen["headers"]  # named in Connection: hop-by-hop
        assert "x-prioqueue-job" not in echo.headers  # not gated
        assert stack.fake.served == []


def test_api_keys_ceilings_and_401(make_stack: StackFactory) -> None:
    stack = make_stack(KEYS)
    with httpx.Client(base_url=stack.url, timeout=10) as client:
        refused = client.post(CHAT, json=chat())
        assert refused.status_code == 401
        challenges = refused.headers.get_list("www-authenticate")
        assert challenges[0] == 'Bearer realm="prioqueue"'  # and Basic, for llama-swap's UI
        assert (
            client.post(CHAT, json=chat(), headers={"Authorization": "Bearer nope"}).status_code
            == 401
        )
        assert client.get("/v1/models").status_code == 401
        web = {"Authorization": "Bearer sk-web"}
        bulk = {"Authorization": "Bearer sk-bulk"}
        high = client.post(
            CHAT, json=chat(), headers={**web, "X-LlamaSwap-Priority": "interactive"}
        )
        assert high.headers["x-prioqueue-priority"] == "100"
        capped = client.post(CHAT, json=chat(), headers={**bulk, "X-LlamaSwap-Priority": "1000"})
        assert capped.headers["x-prioqueue-priority"] == "0"
        lower = client.post(CHAT, json=chat(), headers={**bulk, "X-LlamaSwap-Priority": "batch"})
        assert lower.headers["x-prioqueue-priority"] == "-100"
    # The client's gateway key never reaches the upstream, nor its raw priority header:
    # the upstream sees the effective priority.
    assert "authorization" not in stack.fake.served[0].headers
    assert [s.headers["x-llamaswap-priority"] for s in stack.fake.served] == ["100", "0", "-100"]


def test_anonymous_member_has_ceiling_and_upstream_key_replaces(make_stack: StackFactory) -> None:
    config = {**KEYS, "allow_anonymous": True, "anonymous_max_priority": 0,
              "upstream_api_key": "up-key"}  # fmt: skip
    stack = make_stack(config)
    with httpx.Client(base_url=stack.url, timeout=10) as client:
        response = client.post(
            CHAT,
            json=chat(),
            headers={"Authorization": "Bearer unknown", "X-LlamaSwap-Priority": "100"},
        )
        assert response.status_code == 200
        assert response.headers["x-prioqueue-priority"] == "0"
        job = client.get(f"/prioqueue/jobs/{response.headers['x-prioqueue-job']}").json()
        assert job["member"] == "anonymous"
        assert job["outcome"] == "done"
    assert stack.fake.served[0].headers["authorization"] == "Bearer up-key"


def test_trusted_header_only_when_enabled(make_stack: StackFactory) -> None:
    trusted = {"member": "X-Auth-User", "tier": "X-Auth-Tier", "max_priority": 100}
    stack = make_stack({**KEYS, "trusted_header": trusted})
    plain = make_stack(KEYS)
    headers = {"X-Auth-User": "carol", "X-Auth-Tier": "pro", "X-LlamaSwap-Priority": "100"}
    with httpx.Client(base_url=stack.url, timeout=10) as client:
        response = client.post(CHAT, json=chat(), headers=headers)
        assert response.status_code == 200
        assert response.headers["x-prioqueue-priority"] == "100"
        job = client.get("/prioqueue/jobs/" + response.headers["x-prioqueue-job"], headers=headers)
        assert (job.json()["member"], job.json()["tier"]) == ("carol", "pro")
        odd = client.post(CHAT, json=chat(), headers={**headers, "X-Auth-Tier": "platinum"})
        job = client.get("/prioqueue/jobs/" + odd.headers["x-prioqueue-job"], headers=headers)
        assert job.json()["tier"] == "free"
        keyed = client.post(CHAT, json=chat(), headers={"Authorization": "Bearer sk-web"})
        assert keyed.status_code == 200
    with httpx.Client(base_url=plain.url, timeout=10) as client:
        assert client.post(CHAT, json=chat(), headers=headers).status_code == 401


def test_bad_bodies_never_reach_the_gpu(make_stack: StackFactory) -> None:
    stack = make_stack({"limits": {"max_body_bytes": 1000}})
    with httpx.Client(base_url=stack.url, timeout=10) as client:
        bad = client.post(CHAT, content=b"{not json", headers={"Content-Type": "application/json"})
        assert bad.status_code == 400
        assert "not valid JSON" in bad.json()["error"]["message"]
        assert client.post(CHAT, json=[1, 2]).status_code == 400
        assert client.post(CHAT, json={"model": 3}).status_code == 400
        big = client.post(CHAT, json={"model": "m", "pad": "x" * 2000})
        assert big.status_code == 413

        def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is checked while reading
            yield b'{"model": "m", "pad": "'
            yield b"x" * 2000
            yield b'"}'

        assert client.post(CHAT, content=chunks()).status_code == 413
        status = client.get("/prioqueue/status").json()
    assert status["dispatched"] == 0
    assert stack.fake.requests == 0


def test_extract_model() -> None:
    assert extract_model(b'{"model": "m"}', b"application/json") == "m"
    assert extract_model(b"{}", b"") is None
    form = (
        b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="model"\r\n\r\n'
        b'abc\r\n--XyZ\r\nContent-Disposition: form-data; name="model"\r\n\r\n'
        b"whisper\r\n--XyZ--\r\n"
    )
    assert extract_model(form, b"multipart/form-data; boundary=XyZ") == "whisper"
    assert extract_model(b"--XyZ--\r\n", b'multipart/form-data; boundary="XyZ"') is None
    with pytest.raises(BadRequest):
        extract_model(b"", b"multipart/form-data")
    with pytest.raises(BadRequest):
        extract_model(b"\xff", b"application/json")


def test_multipart_audio_is_gated(make_stack: StackFactory) -> None:
    stack = make_stack()

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(base_url=stack.url, timeout=10) as client:
            return await client.post(
                "/v1/audio/transcriptions", data={"model": "whisper"}, files={"file": b"RIFF"}
            )

    response = run(go())
    assert response.status_code == 404  # the fake has no transcription route ...
    assert "x-prioqueue-job" in response.headers  # ... but the request was gated


@pytest.mark.parametrize("path", ["/x/../v1/chat/completions", "//v1/chat/completions"])
def test_a_path_that_normalises_to_a_gated_path_is_gated(
    make_stack: StackFactory, path: str
) -> None:
    # httpx would normalise the path itself; http.client sends it as written.
    import http.client
    import json
    from urllib.parse import urlsplit

    stack = make_stack()
    address = urlsplit(stack.url)
    connection = http.client.HTTPConnection(address.hostname or "", address.port, timeout=10)
    try:
        body = json.dumps({"model": "model-a", "messages": []})
        connection.request("POST", path, body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
        assert response.getheader("x-prioqueue-job") is not None  # it went through the gate
    finally:
        connection.close()
