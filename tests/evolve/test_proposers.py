"""The OpenAI-compatible proposer against a tiny local /v1/chat/completions server, and against a closed port."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from ctxrl.errors import CtxrlError
from ctxrl.evolve.proposal import read_proposal
from ctxrl.evolve.proposers import ChatProposer, OpenAIChat, OpenAIProposer, ProposerError
from ctxrl.evolve.rules import itemise
from ctxrl.evolve.skill import Skill, seed_skill

INC = seed_skill("tools")


class Server:
    """Answers POST /v1/chat/completions; ``fail_first`` requests get HTTP 503 first; records what it got."""

    def __init__(self, fail_first: int = 0, status: int = 200, raw: bytes | None = None) -> None:
        self.requests: list[dict[str, Any]] = []
        self.headers: list[str | None] = []
        self.fail_first = fail_first
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append(body)
                owner.headers.append(self.headers.get("Authorization"))
                if self.path != "/v1/chat/completions":
                    self.send_response(404)
                    self.end_headers()
                    return
                if owner.fail_first > 0:
                    owner.fail_first -= 1
                    self.send_response(503)
                    self.end_headers()
                    self.wfile.write(b"busy")
                    return
                if status != 200:
                    self.send_response(status)
                    self.end_headers()
                    self.wfile.write(b'{"error": "bad key"}')
                    return
                n = len(owner.requests)
                text = json.dumps(
                    {
                        "targets": ["[n1.B.s2]"],
                        "predicts": "drop earlier",
                        "edits": [{"op": "add", "text": f"- Drop results early (variant {n})."}],
                    }
                )
                payload = (
                    raw
                    or json.dumps(
                        {
                            "choices": [
                                {"index": 0, "message": {"role": "assistant", "content": "  " + text + "\n"}}
                            ]
                        }
                    ).encode()
                )
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


def test_proposer_gets_valid_candidates_from_the_endpoint(server: Server) -> None:
    proposer = OpenAIProposer(OpenAIChat(server.url, "m", api_key="k", temperature=0.5, max_tokens=300))
    texts = proposer.propose(INC, [], 2, round=1)
    assert len(texts) == 2
    assert texts[0].startswith('{"targets"') and texts[0].endswith("}")  # stripped only
    skills = [read_proposal(t, parent=INC, round=1) for t in texts]
    assert all(isinstance(s, Skill) for s in skills)
    assert [s.body.splitlines()[-1] for s in skills if isinstance(s, Skill)] == [
        "- Drop results early (variant 1).",
        "- Drop results early (variant 2).",
    ]
    req = server.requests[0]
    assert (req["model"], req["temperature"], req["max_tokens"]) == ("m", 0.5, 300)
    assert [m["role"] for m in req["messages"]] == ["system", "user"]
    assert '"edits"' in req["messages"][0]["content"]
    for rule in itemise(INC.body):  # the parent, one rule per line with its id
        assert f"[{rule.id}] {rule.text}" in req["messages"][1]["content"]
    assert "Write proposal 2 (round 1)." in server.requests[1]["messages"][1]["content"]
    assert server.headers[0] == "Bearer k"
    # structured outputs: the schema allows only the parent's rule ids
    fmt = req["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
    revise = fmt["json_schema"]["schema"]["properties"]["edits"]["items"]["anyOf"][1]
    assert revise["properties"]["rule"]["enum"] == [r.id for r in itemise(INC.body)]


def test_response_format_can_be_turned_off(server: Server) -> None:
    proposer = OpenAIProposer(OpenAIChat(server.url, "m", response_format=False))
    proposer.propose(INC, [], 1, round=1)
    assert "response_format" not in server.requests[0]


def test_retries_with_backoff_on_503() -> None:
    server = Server(fail_first=2)
    waits: list[float] = []
    try:
        chat = OpenAIChat(server.url, "m", retries=3, backoff_s=0.5, sleep=waits.append)
        text = chat([{"role": "user", "content": "hi"}])
    finally:
        server.close()
    assert "variant 3" in text  # the third request answered
    assert waits == [0.5, 1.0]


def test_gives_up_after_retries_with_a_one_line_error() -> None:
    server = Server(fail_first=10)
    try:
        chat = OpenAIChat(server.url, "m", retries=2, backoff_s=0.0)
        with pytest.raises(ProposerError) as info:
            chat([{"role": "user", "content": "hi"}])
    finally:
        server.close()
    assert str(info.value) == (
        f"proposer endpoint {server.url}/chat/completions unreachable after 3 attempts (HTTP 503: busy)"
    )


def test_client_error_is_not_retried() -> None:
    server = Server(status=401)
    try:
        with pytest.raises(ProposerError, match=r"answered HTTP 401: .*bad key"):
            OpenAIChat(server.url, "m", retries=3, backoff_s=0.0)([{"role": "user", "content": "x"}])
    finally:
        server.close()
    assert len(server.requests) == 1


def test_non_chat_answer_is_a_clear_error() -> None:
    server = Server(raw=b'{"data": []}')
    try:
        with pytest.raises(ProposerError, match="did not answer like /v1/chat/completions"):
            OpenAIChat(server.url, "m", retries=0)([{"role": "user", "content": "x"}])
    finally:
        server.close()


def test_closed_port_names_the_url() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens here now
    url = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(CtxrlError) as info:
        OpenAIProposer(OpenAIChat(url, "m", retries=1, backoff_s=0.0, timeout_s=2.0)).propose(
            INC, [], 1, round=1
        )
    message = str(info.value)
    assert message.startswith(f"proposer endpoint {url}/chat/completions unreachable after 2 attempts (")
    assert "refused" in message.lower() and "\n" not in message


def test_chat_proposer_over_any_completion_function() -> None:
    seen: list[int] = []

    def complete(conversations: list[list[dict[str, str]]], schema: dict[str, Any] | None) -> list[str]:
        assert schema is not None and "body" in schema["required"]  # the rewrite style's schema
        seen.extend(len(messages) for messages in conversations)
        return [" text "] * len(conversations)

    assert ChatProposer(complete, "rewrite").propose(INC, [], 3, round=2) == ["text"] * 3
    assert seen == [2, 2, 2]  # the round's proposals in one call


def test_engine_complete_renders_the_chat_and_decodes_one_generation() -> None:
    from ctxrl.env.tokenizer import load_tokenizer
    from ctxrl.evolve.proposers import engine_complete
    from ctxrl.train.engines.base import Generation, SamplingConfig

    tokenizer = load_tokenizer(None)
    seen: list[list[int]] = []

    schemas: list[str | None] = []

    class Echo:
        def generate(self, prompts: list[list[int]], sampling: SamplingConfig) -> list[Generation]:
            seen.extend(prompts)
            schemas.append(sampling.json_schema)
            ids = tokenizer.encode("---\nmode: file\n---\nbody", add_special_tokens=False)
            return [Generation(ids, [0.0] * len(ids), "stop", 0)]

    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "write candidate 1"}]
    complete = engine_complete(Echo(), tokenizer, SamplingConfig(temperature=0.0), structured=True)
    (text,) = complete([messages], {"type": "object"})
    assert text == "---\nmode: file\n---\nbody"
    (prompt,) = seen
    rendered = tokenizer.decode(prompt)
    assert "write candidate 1" in rendered and rendered.rstrip().endswith("assistant")
    # the schema reaches the engine only where it can enforce it
    engine_complete(Echo(), tokenizer, SamplingConfig(temperature=0.0), structured=False)(
        [messages], {"type": "object"}
    )
    assert schemas == ['{"type": "object"}', None]
    # fits: the prompt and a whole answer within the engine's context
    chat = engine_complete(Echo(), tokenizer, SamplingConfig(max_new_tokens=10), structured=True)
    room = len(chat.prompt_ids(messages)) + 10
    Echo.max_model_len = room  # type: ignore[attr-defined]
    assert chat.fits(messages)
    Echo.max_model_len = room - 1  # type: ignore[attr-defined]
    assert not chat.fits(messages)


def test_the_client_is_built_from_the_evolve_section_and_shares_its_defaults() -> None:
    from ctxrl.evolve.config import EvolveConfig

    plain = OpenAIChat("http://127.0.0.1:1/v1", "m")
    ev = EvolveConfig()
    assert (plain.timeout_s, plain.retries, plain.temperature, plain.max_tokens) == (
        ev.proposer_timeout_s,
        ev.proposer_retries,
        ev.proposer_temperature,
        ev.proposer_max_tokens,
    )
    ev = EvolveConfig(
        proposer="openai",
        proposer_url="http://h/v1",
        proposer_model="p",
        proposer_retries=7,
        proposer_max_tokens=99,
    )
    chat = OpenAIProposer.from_config(ev, api_key="k").chat
    assert (chat.url, chat.model, chat.api_key, chat.retries, chat.max_tokens) == (
        "http://h/v1/chat/completions",
        "p",
        "k",
        7,
        99,
    )
