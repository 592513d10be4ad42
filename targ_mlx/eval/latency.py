"""Batch-1 wall-clock timing on a sample of questions, for the Δ-latency columns.

Each stage that any policy runs is timed once per sampled question through the one answer runner
(`runner.run`, as `targ ask` answers): a plain Never-RAG generation, the k-token draft (greedy,
and greedy + N samples) with its continuation, one search, the B(q)+C generation, and each
baseline's yes/no probe. A
policy's latency on a question is then the sum of the stages it would run (see sweep.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import mlx.core as mx

from targ_mlx import runner
from targ_mlx.runtime.backbone import Backbone
from targ_mlx import probes
from targ_mlx.eval.datasets import QAItem
from targ_mlx.eval.record import EvalSettings
from targ_mlx.settings import Settings

LATENCY_K = 20  # the draft length timed; other k reuse it (drafts mostly end at EOS sooner)
NO_READ_TAU = 1e9  # above any score: the gate declines, so the runner times draft + continuation


@dataclass
class LatencySample:
    id: str
    never: float  # generate(B(q)) to max_tokens
    draft: float  # greedy draft (k = LATENCY_K)
    skip: float  # greedy draft + its continuation = a gated answer that does not retrieve
    draft_var: float  # the same with N sampled rows in the batch
    skip_var: float
    retrieval: float  # search + pack context
    rag: float  # generate(B(q)+C)
    p_need: float  # Self-Eval probe prefill
    p_supported: float  # Self-RAG-lite probe prefill
    p_relevant: float  # CRAG-lite probe prefill


def _prefill_s(bb: Backbone, ids: list[int]) -> float:
    t0 = time.perf_counter()
    mx.eval(bb.prefill(ids, bb.make_cache()))
    return time.perf_counter() - t0


def _settings(s: EvalSettings, gate: str, k: int) -> Settings:
    """The assistant's settings for one timed path: the run's own answer settings (what it reads,
    reranks, how deep), a gate, and for a scored gate a threshold no draft reaches (so the path
    timed is draft + continuation)."""
    return replace(s.answer, gate=gate, tau=NO_READ_TAU if gate not in ("never", "always") else None, k=k)


def time_question(bb: Backbone, retriever, item: QAItem, never_answer: str, s: EvalSettings) -> LatencySample:
    """Each stage timed once through the one answer runner, as `targ ask` runs it at batch 1."""
    tok = bb.tokenizer
    q = item.question.strip()
    k = min(LATENCY_K, s.k_max)
    never = runner.run(bb, retriever, q, _settings(s, "never", k)).latency
    skip = runner.run(bb, retriever, q, _settings(s, "margin", k)).latency
    skip_v = runner.run(bb, retriever, q, _settings(s, "variance", k)).latency
    always = runner.run(bb, retriever, q, _settings(s, "always", k))
    # the packed context as the prompt held it (`prompts.pack_context`: `[title] text` per line)
    head = probes.crag_head(tok, "\n".join(f"[{p.title}] {p.text}" for p in always.passages), s.crag_tokens)
    return LatencySample(
        id=item.id, never=never.prefill + never.decode, draft=skip.draft, skip=skip.draft + skip.decode,
        draft_var=skip_v.draft, skip_var=skip_v.draft + skip_v.decode,
        retrieval=always.latency.retrieval, rag=always.latency.prefill + always.latency.decode,
        p_need=_prefill_s(bb, tok.chat_ids(probes.self_eval(q))),
        p_supported=_prefill_s(bb, tok.chat_ids(probes.self_check(q, never_answer))),
        p_relevant=_prefill_s(bb, tok.chat_ids(probes.crag_grade(q, head))),
    )
