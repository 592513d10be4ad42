"""Load benchmark of `targ serve` on loopback: C concurrent clients x Q questions each, bounded.

Starts the real server (uvicorn, one model loaded once) on a free 127.0.0.1 port in this process,
sends NQ-Open dev questions from C client threads (each request with a timeout; the whole run
with a deadline), and checks that every request was answered (200) or refused (503) — none lost
or hung — and that the decision log holds one row per answer. Then answers the same questions
in-process through `Assistant.answer` (what `targ ask` runs) for the baseline. Prints p50/p95
latency and throughput for both:

    python scripts/bench/bench_serve.py --clients 8 --per-client 25 --queue 8
    python scripts/bench/bench_serve.py --clients 8 --per-client 25 --queue 2   # exercises 503s
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

from targ_mlx import bind_openblas

NQ = Path(__file__).resolve().parents[3] / "shared" / "data" / "qa" / "nq_open_dev.jsonl"


def questions(n: int) -> list[str]:
    out = []
    with open(NQ, encoding="utf-8") as f:
        for line in f:
            out.append(json.loads(line)["question"])
            if len(out) == n:
                return out
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--index", help="index folder (default: the offline default index)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--per-client", type=int, default=25)
    ap.add_argument("--queue", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--request-timeout", type=float, default=300.0)
    ap.add_argument("--deadline", type=float, default=1800.0, help="the whole run stops after this many seconds")
    args = ap.parse_args(argv)
    bind_openblas()
    import httpx
    import uvicorn

    from targ_mlx.assistant import Assistant
    from targ_mlx.config import Config
    from targ_mlx.flags import open_index
    from targ_mlx.log.decisions import DecisionLog
    from targ_mlx.runtime.backbone import load_backbone
    from targ_mlx.server.app import make_app
    from targ_mlx.settings import Settings

    bb = load_backbone(args.model)
    qs = questions(args.clients * args.per_client)
    db = Path(tempfile.mkdtemp()) / "serve.db"
    log = DecisionLog(db)
    settings = Settings.from_config(Config(), bb.model_id, gate="evidence", max_tokens=args.max_tokens)
    retriever = open_index([args.index] if args.index else [])()
    assistant = Assistant(bb, retriever, settings, log=log, source="ask", session="bench-serve")
    assistant.answer("warm up the encoder and the kernels")  # not counted
    warm_rows = log.count()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(make_app(assistant, bb.model_id, queue_size=args.queue),
                                           host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    results: list[tuple[int, float]] = []
    lock = threading.Lock()
    stop_at = time.time() + args.deadline

    def client(c: int) -> None:
        with httpx.Client(timeout=args.request_timeout) as h:
            for q in qs[c * args.per_client:(c + 1) * args.per_client]:
                if time.time() > stop_at:
                    return
                t0 = time.perf_counter()
                try:
                    code = h.post(url, json={"model": bb.model_id, "messages": [{"role": "user", "content": q}]}).status_code
                except httpx.HTTPError:
                    code = -1  # lost or hung: counted, never hidden
                with lock:
                    results.append((code, time.perf_counter() - t0))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    server.should_exit = True
    thread.join(timeout=30)

    ok = [dt for code, dt in results if code == 200]
    refused = sum(code == 503 for code, _ in results)
    other = [code for code, _ in results if code not in (200, 503)]
    rows = log.count() - warm_rows
    print(f"served: {len(results)} requests from {args.clients} clients (queue {args.queue}): {len(ok)} answered, "
          f"{refused} refused with 503, {len(other)} other {sorted(set(other))}; log rows {rows} (= answered: "
          f"{rows == len(ok)}); latency p50 {pct(ok, 0.5):.2f} s, p95 {pct(ok, 0.95):.2f} s; "
          f"{len(ok) / wall:.2f} answers/s over {wall:.1f} s")

    t0 = time.perf_counter()
    lat = []
    for q in qs[: len(ok)]:
        t1 = time.perf_counter()
        assistant.answer(q)
        lat.append(time.perf_counter() - t1)
    base = time.perf_counter() - t0
    print(f"in-process (targ ask's path), the first {len(lat)} questions one by one: latency p50 {pct(lat, 0.5):.2f} s, "
          f"p95 {pct(lat, 0.95):.2f} s; {len(lat) / base:.2f} answers/s; served/in-process throughput "
          f"{(len(ok) / wall) / (len(lat) / base):.2f}x")
    return 0 if not other and rows == len(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
