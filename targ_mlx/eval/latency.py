"""Batch-1 wall-clock timing on a sample of questions, for the Δ-latency columns.

Each stage that any policy runs is timed once per sampled question, as the assistant runs it:
a plain Never-RAG generation, the k-token draft (greedy, and greedy + N samples) with its
continuation, one retrieval, the B(q)+C generation, and each baseline's yes/no probe. A
policy's latency on a question is then the sum of the stages it would run (see sweep.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import mlx.core as mx

from targ_mlx import pipeline
from targ_mlx.runtime.backbone import Backbone
from targ_mlx.runtime.draft import continue_greedy, draft, generate
from targ_mlx.eval import probes
from targ_mlx.eval.datasets import QAItem
from targ_mlx.eval.record import RecordSettings

LATENCY_K = 20  # the draft length timed; other k reuse it (drafts mostly end at EOS sooner)


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


def time_question(bb: Backbone, retriever, item: QAItem, never_answer: str, s: RecordSettings) -> LatencySample:
    tok = bb.tokenizer
    q = item.question.strip()
    ids = pipeline.prompt_ids(bb, q, s.prompt_style)
    k = min(LATENCY_K, s.k_max)
    _, pre, dec = generate(bb, ids, s.max_tokens)
    never = pre + dec
    d = draft(bb, ids, k)
    t_d = d.prefill_s + d.decode_s
    _, t_c = continue_greedy(bb, d, s.max_tokens - len(d.tokens))
    dv = draft(bb, ids, k, s.n_samples, s.temperature, s.seed)
    t_dv = dv.prefill_s + dv.decode_s
    _, t_cv = continue_greedy(bb, dv, s.max_tokens - len(dv.tokens))
    packed, t_ret, _ = pipeline.retrieve(bb, retriever, q, s)
    _, pre, dec = pipeline.generate_with_context(bb, q, packed, s)
    head = probes.crag_head(tok, packed.text, s.crag_tokens)
    return LatencySample(
        id=item.id, never=never, draft=t_d, skip=t_d + t_c, draft_var=t_dv, skip_var=t_dv + t_cv,
        retrieval=t_ret, rag=pre + dec,
        p_need=_prefill_s(bb, tok.chat_ids(probes.self_eval(q))),
        p_supported=_prefill_s(bb, tok.chat_ids(probes.self_check(q, never_answer))),
        p_relevant=_prefill_s(bb, tok.chat_ids(probes.crag_grade(q, head))),
    )
