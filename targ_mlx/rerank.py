"""Re-order what a search found before any of it is read: a second, slower judge of each candidate.

The first stage ranks by one vector or a bag of words; the answer is in its top 20 far more often
than in the top 5 that is read (BENCHMARKS.md, rows "what is read"). A reranker scores each of the
top RERANK_FROM candidates against the question and the candidates are read in that order:

- `--rerank NAME|PATH`: a sentence-transformers `CrossEncoder` (e.g. cross-encoder/ms-marco-MiniLM-L6-v2
  from the Hub, or a folder holding one). No cross-encoder ships its weights in a PyPI wheel, so
  this needs a network once or a model the user has.
- `--rerank llm`: the loaded LLM itself, asked per candidate whether the passage answers the
  question; the score is P(yes) / (P(yes) + P(no)) of its next token (one batched prefill of the
  candidates, no decoding). Offline, but a prefill of ~20 passages per question.

Ties keep the search's order (a stable sort), so a reranker that cannot tell candidates apart
changes nothing. The passages keep their search scores: the gates read the search, not the judge.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from targ_mlx.errors import ModelLoadError
from targ_mlx.probes import passage_grade, question_from
from targ_mlx.retrieval import RRF_C, Passage

RERANK_FROM = 20  # candidates a reranker judges (what the selection looks at: selection.SELECT_FROM)
LLM = "llm"
# Query likelihood (UPR, Sachan et al. 2022): mean log p(question | passage) under a small LLM,
# fused by rank with the search's own order. SmolLM2 judges whatever model answers: it ships
# offline, and 20 passages cost it ~0.4 s on 2 cores where the 1.5B would take seconds.
UPR = "upr"
UPR_MODEL = "smollm2-135m"
# the likelihood ranking's weight beside the search's; inf: its order alone. Chosen on dev halves
# (bench_upr.py, BM25 over the large corpus, 108 dev questions: hit@5 0.389 alone against 0.380 at
# weight 1-3 and 0.343 for BM25's order; a small sample, so the order alone by one question)
UPR_WEIGHT = math.inf
MODEL_RERANKERS = (LLM, UPR)  # the rerankers that run a language model
# the passage the LLM judges is cut to this many tokens: an answer sits early in a ~200-token
# chunk more often than not, and the judge's prefill is what the user waits for
LLM_PASSAGE_TOKENS = 192
CROSS_ENCODER_BATCH = 32


class Reranker(Protocol):
    name: str

    def scores(self, question: str, passages: Sequence[Passage]) -> list[float]:
        """One score per passage; higher means more likely to answer the question."""
        ...


def reorder(passages: Sequence[Passage], scores: Sequence[float]) -> list[Passage]:
    """`passages` by descending score; equal scores keep their order."""
    if len(scores) != len(passages):
        raise ValueError(f"{len(scores)} scores for {len(passages)} passages")
    order = sorted(range(len(passages)), key=lambda i: -scores[i])
    return [passages[i] for i in order]


def rerank(reranker: Reranker | None, question: str, found: Sequence[Passage],
           depth: int = RERANK_FROM) -> list[Passage]:
    """The first `depth` of `found` in the reranker's order, then the rest as found."""
    if reranker is None or len(found) < 2:
        return list(found)
    head = list(found[:depth])
    return reorder(head, reranker.scores(question, head)) + list(found[depth:])


def passage_text(p: Passage) -> str:
    """What a judge reads of a passage: its title, then its text (as the encoder reads it)."""
    return f"{p.title}\n{p.text}" if p.title else p.text


@dataclass
class CrossEncoderReranker:
    """A sentence-transformers CrossEncoder: one relevance logit per (question, passage) pair."""

    name: str
    model: Any = field(repr=False)

    def scores(self, question: str, passages: Sequence[Passage]) -> list[float]:
        pairs = [(question, passage_text(p)) for p in passages]
        out = self.model.predict(pairs, batch_size=CROSS_ENCODER_BATCH, show_progress_bar=False)
        return [float(x) for x in out]


def load_cross_encoder(spec: str) -> CrossEncoderReranker:
    try:
        from sentence_transformers import CrossEncoder
    except ImportError as e:
        raise ModelLoadError(f"--rerank {spec}: sentence-transformers is not installed; "
                             "fix: pip install sentence-transformers, or --rerank llm") from e
    try:
        model = CrossEncoder(spec, device="cpu")
    except Exception as e:  # a missing folder, no network, not a cross-encoder: one line, not a traceback
        raise ModelLoadError(f"--rerank {spec}: cannot load a CrossEncoder from it ({type(e).__name__}: "
                             f"{str(e).splitlines()[0][:200] if str(e) else ''}); fix: name a sentence-transformers "
                             "cross-encoder (a Hub id when online, or a local folder), or --rerank llm") from e
    return CrossEncoderReranker(spec, model)


@dataclass
class LLMReranker:
    """The answering model as the judge: P(yes) that a passage answers the question."""

    bb: Any = field(repr=False)  # a runtime.backbone.Backbone
    name: str = LLM

    def prompts(self, question: str, passages: Sequence[Passage]) -> list[list[int]]:
        tok = self.bb.tokenizer
        out = []
        for p in passages:
            text = tok.decode(tok.encode(passage_text(p))[:LLM_PASSAGE_TOKENS])
            out.append(tok.chat_ids(passage_grade(question, text)))
        return out

    def scores(self, question: str, passages: Sequence[Passage]) -> list[float]:
        from targ_mlx.runtime import batch

        logprobs = batch.last_logprobs(self.bb, self.prompts(question, passages))
        return batch.p_yes(logprobs, *batch.yes_no_ids(self.bb.tokenizer))


@dataclass
class QueryLikelihoodReranker:
    """UPR: how likely a small LLM finds the question after reading each passage, its ranking fused
    with the search's order by reciprocal rank (the likelihood alone lets a short passage on a
    neighbouring subject win; the search's order alone is what is being improved)."""

    bb: Any = field(repr=False)  # the judge: a runtime.backbone.Backbone (SmolLM2 by default)
    weight: float = UPR_WEIGHT  # inf: the likelihood's order alone
    name: str = UPR

    def prompts(self, passages: Sequence[Passage]) -> list[list[int]]:
        tok = self.bb.tokenizer
        return [tok.chat_ids(question_from(tok.decode(tok.encode(passage_text(p))[:LLM_PASSAGE_TOKENS])))
                for p in passages]

    def likelihoods(self, question: str, passages: Sequence[Passage]) -> list[float]:
        """Mean log p of the question's tokens after each passage's prompt."""
        from targ_mlx.runtime import batch

        q = self.bb.tokenizer.encode(question.strip()) or self.bb.tokenizer.encode("?")
        rows = batch.forced_logprobs(self.bb, self.prompts(passages), [q] * len(passages))
        return [sum(r) / len(r) for r in rows]

    def scores(self, question: str, passages: Sequence[Passage]) -> list[float]:
        return fused_with_likelihood(self.likelihoods(question, passages), self.weight)


def fused_with_likelihood(likelihoods: Sequence[float], weight: float) -> list[float]:
    """Per passage (in the search's order), 1 / (c + its rank) + weight / (c + its likelihood's
    rank): `retrieval.fuse`'s reciprocal rank fusion of the two orders, as scores. Weight 0 keeps
    the search's order; an infinite weight is the likelihood's order alone (the likelihoods)."""
    if math.isinf(weight):
        return list(likelihoods)
    by_ll = sorted(range(len(likelihoods)), key=lambda i: -likelihoods[i])
    ll_rank = {i: r for r, i in enumerate(by_ll, start=1)}
    return [1.0 / (RRF_C + i) + weight / (RRF_C + ll_rank[i - 1]) for i in range(1, len(likelihoods) + 1)]


def load_reranker(spec: str | None, bb: Any = None) -> Reranker | None:
    """None for no reranking (None, "" or "none"); "llm" for the loaded model `bb`; "upr" for
    query likelihood under SmolLM2 (`bb` itself when it is SmolLM2); else a CrossEncoder name or
    path, loaded once per process."""
    if not spec or spec == "none":
        return None
    if spec == LLM:
        if bb is None:
            raise ValueError("--rerank llm needs the loaded model")
        return LLMReranker(bb)
    if spec == UPR:
        judge = bb if bb is not None and getattr(bb, "model_id", None) == UPR_MODEL else _upr_judge()
        return QueryLikelihoodReranker(judge)
    return _cross_encoder(spec)


@functools.lru_cache(maxsize=1)
def _upr_judge():
    from targ_mlx.runtime.backbone import load_backbone

    return load_backbone(UPR_MODEL)


@functools.lru_cache(maxsize=4)
def _cross_encoder(spec: str) -> CrossEncoderReranker:
    return load_cross_encoder(spec)
