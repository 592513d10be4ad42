"""`targ serve`: the real server (uvicorn) on a free loopback port, the real SmolLM2, a small real
index, a real SQLite log; requests with httpx and the `openai` client."""

import json
import socket
import threading
import time

import httpx
import pytest
import uvicorn

from targ_mlx.assistant import Assistant
from targ_mlx.index import open_retriever
from targ_mlx.log.decisions import DecisionLog
from targ_mlx.server import api
from targ_mlx.server.__main__ import BindError, api_key_for, main
from targ_mlx.server.app import make_app
from targ_mlx.settings import Settings

MODEL = "smollm2-135m"
STORY = "Write a very long story about a dragon and a knight, with many chapters and many details."


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """A uvicorn server in a thread, stopped by the fixture (bounded: it never outlives the test)."""

    def __init__(self, app):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            assert time.time() < deadline, "server did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=30)


def _assistant(backbone, retriever, log, **settings):
    return Assistant(backbone, retriever, Settings(**{"gate": "evidence", "max_tokens": 16, "k": 8, **settings}),
                     log=log, source="ask", session="serve-test")


@pytest.fixture
def log(tmp_path):
    with DecisionLog(tmp_path / "serve.db") as log:
        yield log


@pytest.fixture
def served(backbone, small_index_dir, log):
    app = make_app(_assistant(backbone, open_retriever(small_index_dir), log), MODEL)
    with Served(app) as s:
        yield s


def _ask(url, messages, **body):
    return httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, "messages": messages, **body}, timeout=120)


def test_a_completion_carries_the_answer_and_the_decision(served, log, small_index_questions):
    q = small_index_questions[0]["question"]
    r = _ask(served.url, [{"role": "user", "content": q}])
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion" and body["model"] == MODEL
    text = body["choices"][0]["message"]["content"]
    targ = body["targ"]
    d = targ["decision"]
    assert d["gate"] == "evidence" and d["searched"] and d["reason"] and d["threshold"] is not None
    assert d["read"] == (d["score"] > d["threshold"]) and set(d["scores"]) >= {"margin", "evidence"}
    assert isinstance(d["confirmed"], bool)  # it searched with a draft: the passages were asked about it
    assert targ["found"] and (targ["passages"] == targ["found"][: len(targ["passages"])] if d["read"]
                              else targ["passages"] == [])
    assert targ["timings"]["search"] > 0 and targ["timings"]["total"] > 0
    row = log.get(targ["decision_id"])  # every answered request is logged, as ask logs
    assert row["answer"] == text and row["session"] == "serve-test" and row["gate"] == "evidence"
    assert row["extra"]["confirmed"] == d["confirmed"]
    assert body["usage"]["completion_tokens"] == row["tok_output"]


def test_streaming_sends_deltas_then_the_decision_then_done(served, small_index_questions):
    q = small_index_questions[1]["question"]
    events = []
    with httpx.stream("POST", f"{served.url}/v1/chat/completions", timeout=120,
                      json={"model": MODEL, "messages": [{"role": "user", "content": q}], "stream": True,
                            "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] in ("stop", "length") and "targ" in last and "usage" in last
    # the decision streams first, before any answer text, and agrees with the final one
    early = chunks[0]["targ"]
    assert chunks[0]["choices"][0]["delta"]["content"] == ""
    assert early["decision"]["gate"] == "evidence" and early["decision"]["searched"] is True
    for name in ("score", "threshold", "read", "reason"):
        assert early["decision"][name] == last["targ"]["decision"][name], name
    assert [p["title"] for p in early["found"]] == [p["title"] for p in last["targ"]["found"]] and early["found"]
    plain = _ask(served.url, [{"role": "user", "content": q}]).json()
    assert text == plain["choices"][0]["message"]["content"]  # the same answer, streamed


def test_a_follow_up_searches_a_standalone_query(backbone, small_index_dir, log, small_index_questions):
    app = make_app(_assistant(backbone, open_retriever(small_index_dir), log, gate="always"), MODEL)
    q = small_index_questions[2]["question"]
    with Served(app) as s:
        r = _ask(s.url, [{"role": "system", "content": "be brief"}, {"role": "user", "content": q},
                         {"role": "assistant", "content": "I am not sure."},
                         {"role": "user", "content": "and when was that?"}])
    d = r.json()["targ"]["decision"]
    assert d["read"] and q.lower() in d["search_query"].lower() and "when was that" in d["search_query"].lower()
    row = log.get(r.json()["targ"]["decision_id"])
    assert row["query"] == "and when was that?" and row["extra"]["history_turns"] == 1


def test_the_openai_client_works_against_it(served):
    import openai  # the dev extra installs it: this test is about that client
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list()] == [MODEL]
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "who wrote hamlet"}])
    assert r.choices[0].message.content and r.model_extra["targ"]["decision"]["gate"] == "evidence"
    parts = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "who wrote hamlet"}], stream=True) if c.choices]
    assert "".join(parts) == r.choices[0].message.content


def test_an_api_key_guards_every_route_but_health(backbone, small_index_dir, log):
    app = make_app(_assistant(backbone, open_retriever(small_index_dir), log), MODEL, api_key="s3cret")
    with Served(app) as s:
        assert httpx.get(f"{s.url}/health").status_code == 200
        for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions")):
            r = httpx.request(method, s.url + path, json={"messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        ok = httpx.get(f"{s.url}/v1/models", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
    assert log.count() == 0  # refused requests never reach the model


def test_a_non_loopback_bind_needs_a_key(monkeypatch, capsys):
    monkeypatch.delenv("TARG_API_KEY", raising=False)
    with pytest.raises(BindError, match="--api-key"):
        api_key_for("0.0.0.0", None)
    assert api_key_for("127.0.0.1", None) is None and api_key_for("::1", None) is None
    assert api_key_for("0.0.0.0", "k") == "k"
    monkeypatch.setenv("TARG_API_KEY", "env-key")
    assert api_key_for("192.0.2.1", None) == "env-key"
    monkeypatch.delenv("TARG_API_KEY")
    assert main(["--host", "0.0.0.0"]) == 2  # refused before any model loads or any socket binds
    assert capsys.readouterr().err.count("\n") == 1


BAD = [
    (b"{not json", 400, None),
    (b"[1, 2]", 400, None),
    (json.dumps({"messages": []}).encode(), 400, "messages"),
    (json.dumps({"messages": "hi"}).encode(), 400, "messages"),
    (json.dumps({"messages": [{"role": "user", "content": 5}]}).encode(), 400, "messages[0].content"),
    (json.dumps({"messages": [{"role": "robot", "content": "hi"}]}).encode(), 400, "messages[0].role"),
    (json.dumps({"messages": [{"role": "user", "content": "   "}]}).encode(), 400, "messages"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}).encode(), 400, "stream"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}).encode(), 400, "max_tokens"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "logprobs": "yes"}).encode(), 400, "logprobs"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 50}).encode(),
     400, "top_logprobs"),
    (json.dumps({"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}).encode(), 404, "model"),
    (json.dumps({"messages": [{"role": "user", "content": "why " * 6000}]}).encode(), 400, "messages"),
    (json.dumps({"messages": [{"role": "user", "content": "x" * (api.MAX_BODY_BYTES + 10)}]}).encode(), 413, None),
]


def test_bad_requests_get_a_one_line_4xx_and_lose_nothing(served, log):
    for raw, status, param in BAD:
        r = httpx.post(f"{served.url}/v1/chat/completions", content=raw, timeout=60,
                       headers={"content-type": "application/json"})
        assert r.status_code == status, (raw[:60], r.text)
        err = r.json()["error"]
        assert err["param"] == param and "\n" not in err["message"] and "Traceback" not in r.text, raw[:60]
    assert log.count() == 0
    ok = _ask(served.url, [{"role": "user", "content": "who wrote hamlet"}])  # the server still answers
    assert ok.status_code == 200 and log.count() == 1


@pytest.mark.parametrize("content", ["abc \\ud800 def", "abc \\u0000 def"])
def test_text_the_tokenizer_cannot_take_is_a_one_line_400_without_a_traceback(served, log, caplog, content):
    raw = ('{"messages": [{"role": "user", "content": "%s"}]}' % content).encode()
    r = httpx.post(f"{served.url}/v1/chat/completions", content=raw, timeout=60,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages[0].content" and "U+" in err["message"] and "\n" not in err["message"]
    assert [rec for rec in caplog.records if rec.levelno >= 40 or rec.exc_info] == []  # no traceback logged
    assert log.count() == 0


def test_a_full_queue_answers_503_with_retry_after(backbone, small_index_dir, log):
    """One request holds the worker (its index is still opening), one waits, the next is refused."""
    opened = threading.Event()
    real = open_retriever(small_index_dir)

    def slow_index():  # an index that takes its time to open, as a cold one does
        opened.wait(60)
        return real

    app = make_app(_assistant(backbone, slow_index, log), MODEL, queue_size=1)
    results = {}
    with Served(app) as s:
        def call(name):
            results[name] = _ask(s.url, [{"role": "user", "content": "who wrote hamlet"}])

        first = threading.Thread(target=call, args=("first",))
        first.start()
        _wait(lambda: httpx.get(f"{s.url}/health").json()["busy"])
        second = threading.Thread(target=call, args=("second",))
        second.start()
        _wait(lambda: httpx.get(f"{s.url}/health").json()["queued"] == 1)
        third = _ask(s.url, [{"role": "user", "content": "who wrote hamlet"}])
        assert third.status_code == 503 and third.headers["retry-after"] == "2"
        assert third.json()["error"]["code"] == "queue_full"
        opened.set()
        first.join(120)
        second.join(120)
    assert results["first"].status_code == results["second"].status_code == 200
    assert log.count() == 2  # every answered request logged; the refused one never ran


def _wait(cond, timeout=60.0):
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, "condition not reached"
        time.sleep(0.05)


def test_a_client_that_disconnects_mid_stream_stops_its_generation(backbone, small_index_dir, log):
    app = make_app(_assistant(backbone, open_retriever(small_index_dir), log, gate="never", max_tokens=600), MODEL)
    with Served(app) as s:
        with httpx.stream("POST", f"{s.url}/v1/chat/completions", timeout=120,
                          json={"model": MODEL, "stream": True, "messages": [{"role": "user", "content": STORY}]}) as r:
            got = 0
            for line in r.iter_lines():
                if '"content": "' in line and '"role"' not in line:
                    got += 1
                    if got == 3:
                        break  # leave after three pieces of the story
        _wait(lambda: log.count() == 1)
        row = log.rows()[0]
    assert row["finish_reason"] == "cancelled" and row["tok_output"] < 600


def test_logprobs_when_asked_score_the_answer_the_model_gave(served):
    """Greedy answers: each token is the most likely one at its position, so its log p tops the
    alternatives; one entry per completion token, and the tokens spell the answer."""
    r = _ask(served.url, [{"role": "user", "content": "who wrote hamlet"}], logprobs=True, top_logprobs=3)
    body = r.json()
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == body["usage"]["completion_tokens"] > 0
    for e in content:
        assert e["logprob"] <= 0 and len(e["top_logprobs"]) == 3
        assert e["logprob"] >= e["top_logprobs"][0]["logprob"] - 1e-3
    assert "".join(e["token"] for e in content).strip() == body["choices"][0]["message"]["content"]
    plain = _ask(served.url, [{"role": "user", "content": "who wrote hamlet"}]).json()
    assert plain["choices"][0]["logprobs"] is None  # only when asked: it costs a pass over the answer
