"""The stub server's own contract (tests/stub_server.py): a request it cannot answer gets a 400
that names what is missing, and a log line saying the same, never a dropped connection (which
a driver retries as a network fault, so a test of something else would hang or pass by luck)."""

from __future__ import annotations

import base64
import json

import pytest

from conftest import page_image

MODEL = "ATH-MaaS/OvisOCR2"
IMAGE = "data:image/jpeg;base64," + base64.b64encode(page_image(1, fmt="JPEG")).decode()


def user(*parts) -> dict:
    return {"role": "user", "content": list(parts)}


IMAGE_PART = {"type": "image_url", "image_url": {"url": IMAGE}}
TEXT_PART = {"type": "text", "text": "Free OCR."}

# (body, what the 400 must name): each one dropped the connection before
BAD_REQUESTS = [
    (b"[1, 2]", "not an object"),
    ({"model": MODEL}, "'messages'"),
    ({"model": MODEL, "messages": [user({"type": "image_url"})]}, "image_url.url"),
    ({"model": MODEL, "messages": [user({"type": "image_url",
                                         "image_url": {"url": "data:image/png;base64,@@"}})]},
     "base64"),
    ({"model": MODEL, "messages": [user("a bare string where a part belongs")]}, "content part"),
    ({"model": MODEL, "messages": [{"role": "user"}]}, "'content'"),
    ({"model": MODEL, "messages": [user(IMAGE_PART)], "max_tokens": "lots"}, "'max_tokens'"),
    ({"model": MODEL, "messages": [user(TEXT_PART)]}, "no image"),
]


@pytest.mark.parametrize("body, missing", BAD_REQUESTS, ids=[m for _, m in BAD_REQUESTS])
def test_a_request_the_stub_cannot_answer_gets_a_400_naming_what_it_lacks(stub_server, body,
                                                                          missing):
    import httpx

    stub = stub_server("--model", MODEL)
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    with httpx.Client(base_url=stub.url, timeout=30) as client:
        response = client.post("/v1/chat/completions", content=content,
                               headers={"Content-Type": "application/json"})
        assert response.status_code == 400, response.text
        assert missing in response.json()["error"]["message"]
        # the same connection still serves a good request afterwards
        good = client.post("/v1/chat/completions",
                           json={"model": MODEL, "messages": [user(IMAGE_PART, TEXT_PART)]})
        assert good.status_code == 200, good.text
    (line,) = [line for line in stub.log_lines() if " 400 " in line]
    assert line.startswith("stub: 400 for POST /v1/chat/completions: ") and missing in line


def test_a_system_message_with_string_content_is_answered(stub_server):
    """OpenAI's message content may be a plain string: the stub read it as a list of parts."""
    import httpx

    stub = stub_server("--model", MODEL)
    response = httpx.post(f"{stub.url}/v1/chat/completions", timeout=30, json={
        "model": MODEL, "messages": [{"role": "system", "content": "You read pages."},
                                     user(IMAGE_PART, TEXT_PART)]})
    assert response.status_code == 200, response.text
    assert stub.requests()[0]["texts"] == ["You read pages.", "Free OCR."]


def test_a_body_without_content_length_is_refused_by_name(stub_server):
    """A chunked body: the stub reads only sized bodies; the rest would be read as the next
    request on the connection."""
    import httpx

    stub = stub_server("--model", MODEL)
    body = json.dumps({"model": MODEL, "messages": [user(IMAGE_PART)]}).encode()
    response = httpx.post(f"{stub.url}/v1/chat/completions", content=iter([body]), timeout=30)
    assert response.status_code == 400
    assert "Content-Length" in response.json()["error"]["message"]
    assert any("Content-Length" in line for line in stub.log_lines())


def test_the_request_log_read_while_the_stub_writes_holds_whole_requests_only(tmp_path):
    """A test polls the stub's request log while the stub appends to it; a long request's line
    can be half written when it is read (a loaded run's JSONDecodeError in
    test_pdf::test_per_document_joins_pages_in_order_and_resumes_inside_a_document)."""
    from conftest import StubServer

    log = tmp_path / "stub.jsonl"
    stub = StubServer(0, None, log)
    assert stub.requests() == []  # no request yet: no log yet
    whole = json.dumps({"model": MODEL, "texts": ["x" * 9000], "n": 1})
    log.write_text(whole + "\n" + whole[:898])  # the second line as far as the stub has got
    assert [request["n"] for request in stub.requests()] == [1]
    log.write_text(whole + "\n" + whole.replace('"n": 1', '"n": 2') + "\n")
    assert [request["n"] for request in stub.requests()] == [1, 2]
