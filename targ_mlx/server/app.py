"""`targ serve`: the gated assistant behind an OpenAI-compatible HTTP API (Starlette on uvicorn).

One model is loaded once; one worker thread answers requests in arrival order through the one
answer runner (`Session.stream` -> `runner.stream_answer`), so a request is answered exactly as
`targ ask` answers it and logged to the same decision log (source "ask", session "serve-…"). Requests wait in a
bounded queue: when it is full the server answers 503 with Retry-After instead of piling up. A
client that disconnects, mid-stream or while queued, cancels its generation.

Routes: `POST /v1/chat/completions` (streaming with server-sent events, or not), `GET /v1/models`,
`POST /v1/feedback` ({"decision_id", "label"}: a label on a logged answer, for `targ-calibrate refit`),
`GET /health` (the only route open without the API key).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from targ_mlx.errors import TargError
from targ_mlx.server import DEFAULT_QUEUE, api
from targ_mlx.session import Decided, Done, Searched, Text

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 2


@dataclass
class Job:
    req: api.ChatRequest
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue
    cancel: threading.Event = field(default_factory=threading.Event)

    def post(self, item: tuple) -> None:
        """From the worker thread to the request's coroutine."""
        self.loop.call_soon_threadsafe(self.out.put_nowait, item)


class Worker:
    """The one thread that runs the model; `submit` refuses when `queue_size` jobs already wait."""

    def __init__(self, session, queue_size: int = DEFAULT_QUEUE, max_tokens: int | None = None):
        if queue_size < 1:  # queue.Queue(0) would be unbounded
            raise ValueError(f"queue_size must be >= 1; got {queue_size}")
        self.session = session
        self.jobs: queue.Queue[Job | None] = queue.Queue(maxsize=queue_size)
        self.max_tokens = max_tokens
        self.busy = False
        self.answered = 0
        self._thread = threading.Thread(target=self._run, name="targ-serve-worker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        while True:  # cancel what waits, then let the thread finish its current job and exit
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.cancel.set()
                job.post(("error", api.ApiError(503, "server shutting down; retry later", kind="server_error")))
        self.jobs.put(None)
        self._thread.join(timeout=30)

    def submit(self, job: Job) -> None:
        try:
            self.jobs.put_nowait(job)
        except queue.Full:
            raise api.ApiError(503, f"server busy: {self.jobs.maxsize} requests already waiting; retry in "
                                    f"{RETRY_AFTER_S} s", code="queue_full", kind="server_error") from None

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            if job.cancel.is_set():  # the client left while it waited
                job.post(("cancelled",))
                continue
            self.busy = True
            try:
                self._answer(job)
            finally:
                self.busy = False

    def _answer(self, job: Job) -> None:
        req = job.req
        overrides: dict[str, Any] = {}
        cap = req.max_tokens or self.max_tokens
        if cap is not None:
            overrides["max_tokens"] = cap
        done, found = None, None  # found: None until a search ran
        try:
            for ev in self.session.stream(req.question, history=list(req.history), cancel=job.cancel, **overrides):
                if isinstance(ev, Searched):
                    found = ev.passages
                elif isinstance(ev, Decided):  # before any text: the stream's first chunk carries it
                    job.post(("decided", api.early_decision_field(ev.decision, ev.scores, found)))
                elif isinstance(ev, Done):
                    done = ev
                elif isinstance(ev, Text):
                    job.post(("text", ev.text))
            ans = done.answer
            logprobs = self._logprobs(done, req.top_logprobs) if req.logprobs else None
        except (TargError, ValueError) as e:  # a question the model cannot take: the client's to fix
            job.post(("error", api.ApiError(400, str(e), "messages")))
            return
        except Exception as e:  # noqa: BLE001  (one line to the client, the traceback to the server log)
            logger.exception("answer failed")
            job.post(("error", api.ApiError(500, f"internal error: {type(e).__name__}: {e}", kind="server_error")))
            return
        self.answered += 1
        job.post(("done", ans, self.session.last_decision_id, logprobs))

    def _logprobs(self, done, top: int) -> dict:
        """The answer's tokens scored again under the prompt they continue (one more pass)."""
        return api.logprobs_field(lambda ids: self.session.decode(ids), self.session.logprobs(done, top))


def _error(e: api.ApiError) -> JSONResponse:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if e.status == 503 else None
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


def make_app(session, model_name: str, api_key: str | None = None, queue_size: int = DEFAULT_QUEUE,
             max_tokens: int | None = None) -> Starlette:
    """The ASGI app over a `Session` (its log gets every answer).

    Args:
        model_name: the id `/v1/models` lists and requests name (the model key; aliases accepted).
        api_key: required as `Authorization: Bearer KEY` on every route but /health when set.
        queue_size: requests that may wait while one is answered; more get 503.
        max_tokens: the answer cap when a request gives none (default: the session's settings).
    """
    worker = Worker(session, queue_size, max_tokens)
    started = time.time()
    names = {model_name, session.model_id}

    def authorised(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        token = given[7:] if given.lower().startswith("bearer ") else ""
        if not hmac.compare_digest(token.encode(), api_key.encode()):
            raise api.ApiError(401, "missing or wrong API key: send 'Authorization: Bearer KEY' (the key given to "
                                    "targ serve --api-key or $TARG_API_KEY)", code="invalid_api_key",
                               kind="authentication_error")

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": model_name, "busy": worker.busy,
                             "queued": worker.jobs.qsize(), "queue_size": worker.jobs.maxsize,
                             "answered": worker.answered, "uptime_s": round(time.time() - started, 1)})

    async def models(request: Request) -> Response:
        try:
            authorised(request)
        except api.ApiError as e:
            return _error(e)
        return JSONResponse({"object": "list", "data": [
            {"id": model_name, "object": "model", "created": int(started), "owned_by": "targ-mlx"}]})

    async def chat(request: Request) -> Response:
        try:
            authorised(request)
            raw = await _read_capped(request)
            req = api.parse_chat(api.parse_body(raw))
            if req.model is not None and req.model not in names:
                raise api.ApiError(404, f"model {req.model!r} is not served here; this server serves {model_name!r} "
                                        "(GET /v1/models)", "model", "model_not_found")
            job = Job(req, asyncio.get_running_loop(), asyncio.Queue())
            worker.submit(job)
        except api.ApiError as e:
            return _error(e)
        except ClientDisconnect:
            return Response(status_code=499)
        cid = api.new_id()
        if req.stream:
            return StreamingResponse(_stream(job, cid, model_name), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            while True:
                item = await job.out.get()
                if item[0] == "done":
                    return JSONResponse(api.completion(cid, model_name, item[1], item[2], item[3]))
                if item[0] == "error":
                    return _error(item[1])
                if item[0] == "cancelled":
                    return Response(status_code=499)
        except asyncio.CancelledError:  # the client went away while waiting
            job.cancel.set()
            raise

    async def feedback(request: Request) -> Response:
        """A user's label on a logged answer (what the chat's F2 / F3 do), for `targ-calibrate refit`."""
        from targ_mlx.session import LABELS, UnknownDecisionError

        try:
            authorised(request)
            did, label = api.parse_feedback(api.parse_body(await _read_capped(request)), LABELS)
            if not session.takes_feedback:
                raise api.ApiError(409, "this server keeps no decision log to label; start it without --no-log")
            try:
                fid = await asyncio.get_running_loop().run_in_executor(None, session.feedback, did, label)
            except UnknownDecisionError:
                raise api.ApiError(404, f"no decision {did} in this server's log", "decision_id") from None
        except api.ApiError as e:
            return _error(e)
        return JSONResponse({"id": fid, "decision_id": did, "label": label})

    @contextlib.asynccontextmanager
    async def lifespan(app):
        worker.start()
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, worker.stop)

    app = Starlette(routes=[Route("/health", health), Route("/v1/models", models),
                            Route("/v1/chat/completions", chat, methods=["POST"]),
                            Route("/v1/feedback", feedback, methods=["POST"])], lifespan=lifespan)
    app.state.worker = worker
    return app


async def _read_capped(request: Request) -> bytes:
    """The body, refused with 413 as soon as it passes the cap (a huge body is never held whole)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > api.MAX_BODY_BYTES:
        raise api.ApiError(413, f"request body is {int(declared):,} bytes; the limit is {api.MAX_BODY_BYTES:,}: "
                                "send a shorter conversation", code="request_too_large")
    chunks, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > api.MAX_BODY_BYTES:
            raise api.ApiError(413, f"request body passes {api.MAX_BODY_BYTES:,} bytes: send a shorter conversation",
                               code="request_too_large")
        chunks.append(part)
    return b"".join(chunks)


async def _stream(job: Job, cid: str, model: str):
    """Server-sent events: the role chunk, sent once the gate has decided and carrying that
    decision in its `targ` field (before any answer text), one chunk per new piece of text, the
    finish chunk with the whole decision field (and usage when asked), then [DONE]. Closing the
    stream cancels the job."""
    sent = ""
    opened = False

    def first(targ: dict | None = None) -> bytes:
        return api.sse(api.chunk(cid, model, {"role": "assistant", "content": ""}, extra={"targ": targ} if targ else None))

    try:
        while True:
            item = await job.out.get()
            if item[0] == "decided":
                if not opened:
                    opened = True
                    yield first(item[1])
                continue
            if not opened and item[0] != "error":
                opened = True
                yield first()
            if item[0] == "text":
                text = item[1]
                if text.startswith(sent) and len(text) > len(sent):
                    yield api.sse(api.chunk(cid, model, {"content": text[len(sent):]}))
                    sent = text
                continue
            if item[0] == "done":
                ans, decision_id = item[1], item[2]
                if ans.answer.startswith(sent) and len(ans.answer) > len(sent):
                    yield api.sse(api.chunk(cid, model, {"content": ans.answer[len(sent):]}))
                extra = {"targ": api.decision_field(ans, decision_id)}
                if job.req.include_usage:
                    extra["usage"] = api.usage(ans)
                # the answer's logprobs, when asked, ride on the last chunk (they are computed after it)
                yield api.sse(api.chunk(cid, model, {}, api.finish_reason(ans), extra, item[3]))
            elif item[0] == "error":
                yield api.sse(item[1].body())
            yield api.sse("[DONE]")
            return
    finally:
        job.cancel.set()  # a finished job ignores it; a client gone mid-stream stops the generation
