"""The OpenAI-compatible wire format, as pure functions: parse a request, shape a response.

Nothing here touches the model, the queue or the network, so every bad input has a test that
needs no server. A bad request raises `ApiError(status, message, param, code)`; the app turns it
into OpenAI's error body, `{"error": {"message", "type", "param", "code"}}`, one line, never a
traceback.

The extra field `targ` on every response (standard clients ignore unknown fields) carries the
decision: gate, score, threshold, read or not, why, every gate's score, the passages read (cited)
and those the search found, and the timings per stage.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from targ_mlx.errors import BadTextError, check_text
from targ_mlx.records import Answer

MAX_BODY_BYTES = 1 << 20  # a request body above 1 MiB is refused before it is parsed
MAX_MESSAGES = 200
MAX_TOKENS_LIMIT = 2048  # the largest max_tokens a request may ask for
MAX_TOP_LOGPROBS = 20
OBJECT_CHAT = "chat.completion"
OBJECT_CHUNK = "chat.completion.chunk"


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class ChatRequest:
    """What the assistant needs from a chat completion request."""

    question: str  # the last user message
    history: tuple[tuple[str, str], ...]  # earlier (user, assistant) turns, oldest first
    stream: bool
    max_tokens: int | None
    model: str | None
    include_usage: bool = False
    logprobs: bool = False  # per-token log-probabilities of the answer (one more pass over it)
    top_logprobs: int = 0


def _text(content: Any, where: str) -> str:
    """A message's content: a string, or OpenAI's list of parts of which the text parts count;
    text the tokenizer cannot take (a lone surrogate, NUL) is refused here, before the queue."""
    if isinstance(content, str):
        return _checked(content, where)
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        parts = [p.get("text") for p in content if p.get("type") == "text"]
        if all(isinstance(t, str) for t in parts) and parts:
            return _checked("\n".join(parts), where)
    raise ApiError(400, f"{where}.content must be a string or a list of text parts; got {type(content).__name__}",
                   f"{where}.content")


def _checked(text: str, where: str) -> str:
    try:
        return check_text(text, f"{where}.content")
    except BadTextError as e:
        raise ApiError(400, str(e), f"{where}.content") from None


def parse_body(raw: bytes) -> dict:
    if len(raw) > MAX_BODY_BYTES:
        raise ApiError(413, f"request body is {len(raw):,} bytes; the limit is {MAX_BODY_BYTES:,}: send a shorter "
                            "conversation", code="request_too_large")
    try:
        body = json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"request body is not valid JSON ({e.msg if hasattr(e, 'msg') else e}): send a JSON "
                            "object") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"request body must be a JSON object; got {type(body).__name__}")
    return body


def parse_chat(body: dict) -> ChatRequest:
    """Validate a `POST /v1/chat/completions` body (OpenAI's shape) into a ChatRequest."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list of {role, content} objects", "messages")
    if len(messages) > MAX_MESSAGES:
        raise ApiError(400, f"messages holds {len(messages)} messages; the limit is {MAX_MESSAGES}", "messages")
    turns: list[tuple[str, str]] = []
    pending: str | None = None
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError(400, f"{where} must be an object with role and content; got {type(m).__name__}", where)
        role = m.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise ApiError(400, f"{where}.role must be system, user or assistant; got {role!r}", f"{where}.role")
        if role in ("system", "developer", "tool"):
            continue  # the assistant's own system prompt is the paper's; a client's is not applied
        text = _text(m.get("content"), where)
        if role == "user":
            if pending is not None:  # two user turns in a row: keep them as one question
                text = pending + "\n" + text
            pending = text
        elif pending is not None:
            turns.append((pending, text))
            pending = None
    if pending is None or not pending.strip():
        raise ApiError(400, "the last message must be a non-empty user message (the question)", "messages")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, f"stream must be true or false; got {stream!r}", "stream")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                   or not 1 <= max_tokens <= MAX_TOKENS_LIMIT):
        raise ApiError(400, f"max_tokens must be an integer in [1, {MAX_TOKENS_LIMIT}]; got {max_tokens!r}",
                       "max_tokens")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, f"model must be a string; got {type(model).__name__}", "model")
    logprobs = body.get("logprobs", False)
    if logprobs is None:
        logprobs = False
    if not isinstance(logprobs, bool):
        raise ApiError(400, f"logprobs must be true or false; got {logprobs!r}", "logprobs")
    top = body.get("top_logprobs") or 0
    if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
        raise ApiError(400, f"top_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}]; got {top!r}", "top_logprobs")
    if top and not logprobs:
        raise ApiError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    n = body.get("n", 1)
    if n != 1:
        raise ApiError(400, f"n must be 1 (one answer per request); got {n!r}", "n")
    opts = body.get("stream_options") or {}
    include_usage = bool(isinstance(opts, dict) and opts.get("include_usage"))
    return ChatRequest(pending.strip(), tuple(turns), stream, max_tokens, model, include_usage, logprobs, top)


def parse_feedback(body: dict, labels: tuple[str, ...]) -> tuple[int, str]:
    """`POST /v1/feedback` {"decision_id": int, "label": one of `labels`} -> (decision_id, label)."""
    did, label = body.get("decision_id"), body.get("label")
    if isinstance(did, bool) or not isinstance(did, int) or did < 1:
        raise ApiError(400, f"decision_id must be a positive integer (the targ.decision_id of an answer); got {did!r}",
                       "decision_id")
    if label not in labels:
        raise ApiError(400, f"label must be one of {', '.join(labels)}; got {label!r}", "label")
    return did, label


def new_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex[:24]


def decision_field(ans: Answer, decision_id: int | None = None) -> dict:
    """The `targ` extra field: why the answer read or not, what it read, what it cost."""
    lat = ans.latency
    tau = ans.tau if ans.score is not None else None
    return {
        "decision": {"gate": ans.gate, "score": ans.score, "threshold": tau, "read": ans.retrieved,
                     "searched": ans.searched, "reason": ans.reason, "no_source": ans.no_source,
                     "confirmed": ans.confirmed, "scores": ans.scores, "note": ans.note or None, "search_query": ans.search_query,
                     "calibration": ans.calibration or None},
        "passages": [{"key": p.key, "title": p.title, "similarity": p.score} for p in ans.passages],
        "found": [{"key": p.key, "title": p.title, "similarity": p.score} for p in ans.found],
        "timings": {"draft": lat.draft, "gate": lat.gate, "search": lat.retrieval, "prefill": lat.prefill,
                    "decode": lat.decode, "total": lat.total, "overlap": lat.overlap},
        "decision_id": decision_id,
    }


def early_decision_field(decision, scores: dict, found=None) -> dict:
    """The `targ` field of a stream's first chunk: the gate's decision (a `gates.GateDecision`) and
    what the search found, before any answer text (timings and what was read come at the end)."""
    return {
        "decision": {"gate": decision.gate, "score": decision.signal,
                     "threshold": decision.threshold if decision.signal is not None else None,
                     "read": decision.retrieve, "searched": found is not None, "reason": decision.reason,
                     "no_source": decision.no_source, "scores": scores},
        "found": [{"key": p.key, "title": p.title, "similarity": p.score} for p in found or ()],
    }


def usage(ans: Answer) -> dict:
    t = ans.tokens
    prompt = t.prompt + t.context
    return {"prompt_tokens": prompt, "completion_tokens": t.output, "total_tokens": prompt + t.output}


def finish_reason(ans: Answer) -> str:
    return "length" if ans.finish_reason == "length" else "stop"


def logprobs_field(decode, scored: list[tuple[int, float, list[tuple[int, float]]]]) -> dict:
    """OpenAI's `logprobs` object from (token id, log p, [(alternative id, log p)]) per answer token."""
    def entry(tok: int, lp: float) -> dict:
        text = decode([tok])
        return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}

    return {"content": [{**entry(t, lp), "top_logprobs": [entry(a, alp) for a, alp in alts]}
                        for t, lp, alts in scored], "refusal": None}


def completion(cid: str, model: str, ans: Answer, decision_id: int | None, logprobs: dict | None = None) -> dict:
    return {"id": cid, "object": OBJECT_CHAT, "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": ans.answer},
                         "finish_reason": finish_reason(ans), "logprobs": logprobs}],
            "usage": usage(ans), "targ": decision_field(ans, decision_id)}


def chunk(cid: str, model: str, delta: dict, finish: str | None = None, extra: dict | None = None,
          logprobs: dict | None = None) -> dict:
    out = {"id": cid, "object": OBJECT_CHUNK, "created": int(time.time()), "model": model,
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}]}
    if extra:
        out.update(extra)
    return out


def sse(data: dict | str) -> bytes:
    """One server-sent event, `data: ...\\n\\n`."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {text}\n\n".encode()
