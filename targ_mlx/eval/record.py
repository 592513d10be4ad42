"""One pass per question, batched: everything any operating point needs, computed once.

For a batch of questions: one search_batch for all their queries; one left-padded prefill of
B(q) whose greedy row runs to max(k_max, max_tokens) tokens (the draft at every k and the Never
answer are prefixes of it) next to N sampled rows of k_max tokens (variance gate); one prefill of
B(q)+C and greedy decode (the Always answer); and three yes/no probes for the reflective
baselines. Sweeps, tables and plots read these records and never run the model again.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import asdict, dataclass, field, fields, replace
from types import MappingProxyType
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from targ_mlx import gates, pipeline, prompts, reader
from targ_mlx.runtime import batch
from targ_mlx.runtime.backbone import Backbone
from targ_mlx.gates import SCORED_GATES
from targ_mlx import probes
from targ_mlx.conversation import SearchForm
from targ_mlx.eval.datasets import QAItem
from targ_mlx.eval.metrics import contains, score_all
from targ_mlx.records import Answer, Latency, TokenCounts
from targ_mlx.retrieval import Passage
from targ_mlx.settings import Settings, flag_fields

# Where the eval's protocol departs from the assistant's defaults (targ_mlx.defaults), and why:
KS = (5, 10, 20, 30, 40)  # the paper sweeps the draft length k; one pass records up to k_max
K_MAX = 40
DEFAULT_CONTEXT_TOKENS = 512  # L_ctx for eval: half the assistant's 1024, for throughput
EVAL_PROMPT = "short"  # few-shot short answers: with the paper's prompt SmolLM2's EM is 0
CRAG_CONTEXT_TOKENS = 256  # the CRAG-lite evaluator grades the head of the packed context


# The eval's answer settings over the library's (`Settings`): the eval CLI's defaults, and every
# run's unless its flags say otherwise.
EVAL_DEFAULTS = MappingProxyType({"context_tokens": DEFAULT_CONTEXT_TOKENS, "prompt_style": EVAL_PROMPT})


def eval_answer(**given: Any) -> Settings:
    """The answer settings a run records with: EVAL_DEFAULTS under the values given (None: not given)."""
    return Settings.from_config(None, "", defaults=EVAL_DEFAULTS, **given)


@dataclass(frozen=True)
class EvalSettings:
    """One recording pass: the answer settings it records with (`answer`: `read="each"` keeps
    every one of `answer.each` distinct passages' candidates, the Always answer chosen among the first
    reader.READ_EACH, so a record of more scores fewer offline), and what only a recording pass has."""

    answer: Settings = field(default_factory=eval_answer)
    k_max: int = K_MAX
    ks: tuple[int, ...] = KS
    crag_tokens: int = CRAG_CONTEXT_TOKENS
    baselines: bool = True

    def to_dict(self) -> dict:
        """As a run's config.json keeps it: one flat table (the eval's answer fields, then the pass's)."""
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "answer"}
        return {**{name: getattr(self.answer, name) for name in RECORDED}, **own}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EvalSettings:
        """From `to_dict` (or an older run's table, which lacks the fields added since)."""
        own = {f.name for f in fields(cls)} - {"answer"}
        kept = {k: tuple(v) if k == "ks" else v for k, v in d.items() if k in own}
        return cls(answer=eval_answer(**{k: v for k, v in d.items() if k in RECORDED}), **kept)


# the answer fields a run's settings keep: the eval's flags, but k (a table's prefix, not a recording's)
RECORDED = tuple(name for name in flag_fields("eval") if name != "k")


@dataclass
class QuestionRecord:
    """All signals for one question. `scores[gate][str(k)]` is U of that gate over k draft steps."""

    id: str
    question: str
    answers: list[str]
    tok_prompt: int
    draft: list[int]  # greedy tokens (EOS included when reached), at most max(k_max, max_tokens)
    entropies: list[float]  # per greedy step (up to k_max)
    gaps: list[float]
    logprobs: list[float]  # log p of each greedy token (FLARE)
    samples: list[list[int]]
    scores: dict
    never: dict  # {"answer", "em", "f1", "acc", "tok_out"}
    always: dict  # {... , "tok_ctx", "passages": [[key, title, score], ...]}
    probes: dict = field(default_factory=dict)  # p_need (self-eval), p_supported, p_relevant
    cost: dict = field(default_factory=dict)  # this question's share of the batch's stage seconds
    batch: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    def never_answer(self, model: str, k: int, s: EvalSettings) -> Answer:
        """The answer this pass gave as the decision log keeps answers: the greedy (Never) branch
        it decoded, with every score its draft gave at prefix length k, its token counts and its
        share of the batch's draft time. No gate decided it, hence gate "never" (tau +inf)."""
        scores = {g: self.scores[g][str(k)] for g in SCORED_GATES if str(k) in self.scores.get(g, {})}
        return Answer(question=self.question, answer=self.never["answer"], model=model, gate="never",
                      tau=float("inf"), score=None, retrieved=False, k=k, beta=s.answer.beta, n_samples=s.answer.n_samples,
                      temperature=s.answer.temperature, scores=scores,
                      tokens=TokenCounts(prompt=self.tok_prompt, draft=min(len(self.draft), k),
                                         output=self.never["tok_out"], samples=sum(len(x[:k]) for x in self.samples)),
                      latency=Latency(draft=self.cost.get("draft", 0.0), total=self.cost.get("draft", 0.0)))


def passage_row(p) -> list:
    """A read passage as records keep it: [key, title, cosine], and its BM25 score when it has one."""
    return [p.key, p.title, round(p.score, 4)] + ([round(p.bm25, 4)] if p.bm25 is not None else [])


def sample_seed(seed: int, batch_no: int) -> int:
    """The variance samples' RNG seed for one batch: fixed per (run seed, batch), so a resumed run
    draws the same samples, and another run seed draws independent ones (eval.seeds)."""
    return seed * 1_000_003 + batch_no


def gate_scores(entropies: Sequence[float], gaps: Sequence[float], samples: Sequence[Sequence[int]],
                ks: Sequence[int], beta: float, passages: Sequence | None = None, model: str = "",
                confirms: dict | None = None, support: float | None = None) -> dict:
    """`{gate: {str(k): U}}` for every registered gate the signals allow, at every k: the runner's
    scoring (`gates.score_all`) over the draft, and over the packed passages ([key, title,
    similarity]) and whether they say what the k-token draft says (`confirms`, by str(k)) for a
    gate that looks at the search."""
    evidence = evidence_of(passages)
    out: dict = {g: {} for g in SCORED_GATES}
    for k in ks:
        c = (confirms or {}).get(str(k))
        sig = gates.Signals(entropies, gaps, samples, evidence, model, None if c is None else bool(c), support)
        for g, u in gates.score_all(sig, gates.GateParams(k, beta)).items():
            out.setdefault(g, {})[str(k)] = u
    return out


def evidence_of(passages: Sequence | None) -> tuple[gates.Evidence, ...] | None:
    """A record's packed passages ([key, title, similarity] or [..., BM25 score]) as the gates see them."""
    return None if passages is None else tuple(
        gates.Evidence(p[1], float(p[2]), float(p[3]) if len(p) > 3 else None) for p in passages)


def record_signals(r: dict, model: str, k: int) -> gates.Signals:
    """What the gates saw for record `r` at draft length `k`: its draft, its packed passages, whether
    they say what the k-token draft says, and their support (what `gate_scores` scored)."""
    c = (r["always"].get("confirms") or {}).get(str(k))
    return gates.Signals(r["entropies"], r["gaps"], r["samples"], evidence_of(r["always"].get("passages")), model,
                         None if c is None else bool(c), r["always"].get("support"))


def fill_scores(records: Sequence[dict], model: str, beta: float, search_changed: bool = False) -> int:
    """Add to each record (in place) the scores of registered gates it lacks, from its own signals
    (no model runs); with `search_changed` (a second corpus), recompute the search-dependent ones.
    Returns how many records changed."""
    search = {n for n, g in gates.REGISTRY.items() if gates.SEARCH in g.needs}
    changed = 0
    for r in records:
        ks = [int(k) for k in (r.get("scores", {}).get("margin") or {})]
        want = {g for g in gates.scored_names() if not r["scores"].get(g) or (search_changed and g in search)}
        if not want or not ks:
            continue
        new = gate_scores(r["entropies"], r["gaps"], r["samples"], ks, beta, r["always"].get("passages"), model,
                          r["always"].get("confirms"), r["always"].get("support"))
        add = {g: v for g, v in new.items() if g in want and v}
        if add:
            r["scores"] = {**r["scores"], **add}
            changed += 1
    return changed


def _context_part(bb: Backbone, retriever, items: Sequence[QAItem], found: Sequence[Sequence], s: EvalSettings,
                  cost: dict, drafts: Sequence[Sequence[int]]) -> tuple[list[dict], list[float | None]]:
    """Everything that depends on the corpus: the packed top-K passages, the Always answer from
    B(q)+C, whether an answer string is in the retrieved passages (hit@K), whether the packed
    context says what the k-token draft says (`confirms`, per k scored), and CRAG-lite's grade
    of the context. The draft, the samples, the Never answer and the other probes do not.
    With `draft_route` the question is searched here, with its k-token draft as one more route
    (the runner's `pipeline.search_forms`); `found` is then not searched (empty)."""
    tok = bb.tokenizer
    qs = [it.question.strip() for it in items]
    t0 = time.perf_counter()
    if s.answer.draft_route > 0:
        said = [pipeline.answer_text(bb, d[: s.answer.k], s.answer.k)[0] for d in drafts]
        found = [pipeline.search_forms(retriever, [SearchForm(q)], s.answer, d if pipeline.routes_draft(s.answer, d) else "")
                 for q, d in zip(qs, said)]
    packed = [pipeline.pack_found(bb, q, hits, s.answer) for q, hits in zip(qs, found)]
    cost["retrieval"] = cost.get("retrieval", 0.0) + time.perf_counter() - t0

    t0 = time.perf_counter()
    each = [None] * len(items)
    if s.answer.read == "each":
        answers, each = _read_each(bb, qs, packed, items, s)
    else:
        rag_ids = [pipeline.prompt_ids(bb, q, s.answer.prompt_style, p.reading.text or None) for q, p in zip(qs, packed)]
        answers = batch.greedy_batch(bb, rag_ids, s.answer.max_tokens).tokens
    cost["always"] = time.perf_counter() - t0

    p_rel: list[float | None] = [None] * len(items)
    if s.baselines:
        t0 = time.perf_counter()
        yes, no = batch.yes_no_ids(tok)
        heads = [probes.crag_head(tok, p.text, s.crag_tokens) for p in packed]
        p_rel = batch.p_yes(batch.last_logprobs(bb, [tok.chat_ids(probes.crag_grade(q, h)) for q, h in zip(qs, heads)]),
                             yes, no)
        cost["probes"] = cost.get("probes", 0.0) + time.perf_counter() - t0
    branches = []
    for it, q, p, toks, hits, d, cands in zip(items, qs, packed, answers, found, drafts, each):
        a_ans, a_len = pipeline.answer_text(bb, toks, s.answer.max_tokens)
        branches.append({"answer": a_ans, **score_all(a_ans, it.answers), "tok_out": a_len,
                         "tok_ctx": p.reading.tokens, "passages": [passage_row(x) for x in p.passages],
                         "confirms": {str(k): int(pipeline.confirms(tok, d[:k], p.text, q)) for k in s.ks},
                         "support": round(pipeline.support_of(q, p), 4),
                         "hit": contains(" ".join(h.text for h in hits[: s.answer.top_k]), it.answers)}
                        | {"read_hit": contains(p.reading.text, it.answers)}  # in what was read, as cut
                        | ({"read": [passage_row(x) for x in p.read.passages]} if p.read is not None else {})
                        | ({"candidates": cands} if cands is not None else {}))
    return branches, p_rel


def _read_each(bb: Backbone, qs: Sequence[str], packed: Sequence, items: Sequence[QAItem],
               s: EvalSettings) -> tuple[list[list[int]], list[list[dict]]]:
    """read="each" for a batch of questions: every question's passages (its first `s.answer.each`
    distinct ones) and the question alone, decoded in one batch; the answer chosen among the
    first reader.READ_EACH and the closed-book one, as `targ ask` chooses it. Returns each
    question's chosen tokens and its candidates as records keep them: text, mean log p, source
    (CLOSED_BOOK: -1), the support features, and whether it and its passage hold a gold answer."""
    rows = [pipeline.each_prompts(bb, q, p, s.answer.prompt_style) for q, p in zip(qs, packed)]
    dec = batch.greedy_batch(bb, [r for rs in rows for r in rs], s.answer.max_tokens)
    chosen, kept, at = [], [], 0
    for q, p, rs, it in zip(qs, packed, rows, items):
        toks, lps = dec.tokens[at: at + len(rs)], dec.logprobs[at: at + len(rs)]
        at += len(rs)
        cands = pipeline.candidates(bb, toks, lps, s.answer.max_tokens)
        first = min(reader.READ_EACH, len(rs) - 1)  # what `targ ask` would have read
        choice = pipeline.choose(q, replace(p, read=replace(p.reading, passages=p.reading.passages[:first])),
                                 cands[:first] + cands[-1:])
        chosen.append(toks[choice.answer.source])  # CLOSED_BOOK (-1): the last row
        evidence = p.found or p.passages
        rows_out = []
        for i, c in enumerate(cands):
            sup = reader.support(p.query or q, c.text, evidence, c.logprob)
            rows_out.append({"text": c.text, "logprob": round(c.logprob, 4), "source": c.source,
                             "sentence": round(sup.sentence, 4), "rank": round(sup.rank, 4), "typed": sup.typed,
                             "acc": contains(c.text, it.answers),
                             "hit": contains(p.reading.passages[i].text, it.answers) if c.source >= 0 else None})
        kept.append(rows_out)
    return chosen, kept


def record_batch(bb: Backbone, retriever, items: Sequence[QAItem], s: EvalSettings, batch_no: int = 0,
                 found: Sequence[Sequence] | None = None) -> list[QuestionRecord]:
    """Run the whole one-pass record for `items` together (see the module docstring).

    `found` (top-K passages per item) may come from one earlier search_batch over many questions.
    """
    tok = bb.tokenizer
    qs = [it.question.strip() for it in items]
    cost = dict(retrieval=0.0, draft=0.0, always=0.0, probes=0.0)
    if found is None and s.answer.draft_route <= 0:  # with the draft route `_context_part` searches
        t0 = time.perf_counter()
        found = retriever.search_batch(qs, pipeline.search_depth(s.answer))
        cost["retrieval"] = time.perf_counter() - t0
    found = found if found is not None else [[] for _ in items]

    t0 = time.perf_counter()
    base_ids = [pipeline.prompt_ids(bb, q, s.answer.prompt_style) for q in qs]
    greedy, samples = batch.draft_batch(bb, base_ids, s.k_max, s.answer.n_samples, max(s.k_max, s.answer.max_tokens),
                                        s.answer.temperature, seed=sample_seed(s.answer.seed, batch_no))
    cost["draft"] = time.perf_counter() - t0

    always, p_rel = _context_part(bb, retriever, items, found, s, cost, greedy.tokens)

    never_text = [pipeline.answer_text(bb, g, s.answer.max_tokens) for g in greedy.tokens]
    probe_vals: list[dict] = [{} for _ in items]
    if s.baselines:
        t0 = time.perf_counter()
        yes, no = batch.yes_no_ids(tok)
        p_need = batch.p_yes(batch.last_logprobs(bb, [tok.chat_ids(probes.self_eval(q)) for q in qs]), yes, no)
        p_sup = batch.p_yes(batch.last_logprobs(
            bb, [tok.chat_ids(probes.self_check(q, a)) for q, (a, _) in zip(qs, never_text)]), yes, no)
        probe_vals = [{"p_need": a, "p_supported": b, "p_relevant": c} for a, b, c in zip(p_need, p_sup, p_rel)]
        cost["probes"] += time.perf_counter() - t0

    share = {name: sec / len(items) for name, sec in cost.items()}
    out = []
    for i, it in enumerate(items):
        k_steps = min(len(greedy.entropies[i]), s.k_max)
        ents, gaps_, lps = greedy.entropies[i][:k_steps], greedy.gaps[i][:k_steps], greedy.logprobs[i]
        n_ans, n_len = never_text[i]
        out.append(QuestionRecord(
            id=it.id, question=it.question, answers=list(it.answers), tok_prompt=len(base_ids[i]),
            draft=greedy.tokens[i], entropies=ents, gaps=gaps_, logprobs=lps[: min(len(lps), s.answer.max_tokens)],
            samples=samples[i], scores=gate_scores(ents, gaps_, samples[i], s.ks, s.answer.beta, always[i]["passages"],
                                                   bb.model_id, always[i]["confirms"], always[i]["support"]),
            never={"answer": n_ans, **score_all(n_ans, it.answers), "tok_out": n_len},
            always=always[i], probes=probe_vals[i], cost=share, batch=batch_no,
        ))
    return out


def rerecord_batch(bb: Backbone, retriever, items: Sequence[QAItem], base: Sequence[dict], s: EvalSettings,
                   found: Sequence[Sequence]) -> list[dict]:
    """The same questions over another corpus: `base` records (same model and settings, another
    index) keep their draft, samples, Never answer and corpus-free probes; only the retrieval, the
    Always answer, hit@K and CRAG-lite's grade are computed again, so it costs those stages only."""
    cost: dict = {}
    always, p_rel = _context_part(bb, retriever, items, found, s, cost, [r["draft"] for r in base])
    share = {"retrieval": cost["retrieval"] / len(items), "always": cost["always"] / len(items)}
    out = [over_corpus(r, a, pr, share) for r, a, pr in zip(base, always, p_rel)]
    fill_scores(out, bb.model_id, s.answer.beta, search_changed=True)  # the new corpus's search
    return out


# the settings that make two runs' corpus-free fields interchangeable: everything the draft, the samples,
# the Never answer and the corpus-free probes depend on. Not top_k, context_tokens, read or rerank:
# they change only what a re-record computes again (the Always answer, hit@K, confirmation, the
# CRAG grade), so one draft serves every reading depth and mode.
_SAME = ("k_max", "ks", "n_samples", "temperature", "beta", "max_tokens", "prompt_style", "seed", "baselines",
         "crag_tokens")


def corpus_free_diff(theirs: dict, ours: dict) -> list[str]:
    """What keeps two runs' configs (`model`, `settings`) from sharing corpus-free fields, as
    "name=theirs (here ours)"; empty when one run's drafts serve the other."""
    a, b = theirs.get("settings", {}), ours.get("settings", {})
    norm = lambda v: list(v) if isinstance(v, (list, tuple)) else v  # noqa: E731  (json lists, tuples here)
    diff = [f"{k}={a[k]!r} (here {b.get(k)!r})" for k in _SAME if k in a and k in b and norm(a[k]) != norm(b[k])]
    if theirs.get("model") not in (None, ours.get("model")):
        diff.insert(0, f"model={theirs.get('model')!r} (here {ours.get('model')!r})")
    return diff


def passage_lookup(index: Path) -> Callable[[int], tuple[str, str] | None]:
    """`recorded_context`'s lookup over an index folder: a passage's (title, text) by key from its
    passages.db, opened read-only; None for a key it lacks."""
    db = sqlite3.connect(f"file:{Path(index) / 'passages.db'}?mode=ro", uri=True)
    return lambda key: db.execute("SELECT title, text FROM passages WHERE key = ?", (key,)).fetchone()


def recorded_context(rec: dict, lookup, tok, budget: int) -> prompts.PackedContext:
    """The context a record's Always branch read, packed again from its index's passages by the
    recorded keys (`lookup(key)`: (title, text), None for a key the index lacks) to `budget`
    tokens: what an analysis re-reads or re-scores without searching. Raises LookupError for a
    passage the index lacks (another index than the run's) and ValueError where the passages no
    longer pack to the recorded ones (another tokenizer or budget than the run's)."""
    hits = []
    for key, *_ in rec["always"]["passages"]:
        row = lookup(key)
        if row is None:
            raise LookupError(f"record {rec['id']} read passage {key}, which this index lacks")
        hits.append(Passage(key, row[0], row[1], 0.0))
    packed = prompts.pack_context(hits, budget, tok.encode, tok.decode)
    if [p.key for p in packed.passages] != [p[0] for p in rec["always"]["passages"]]:
        raise ValueError(f"record {rec['id']}'s passages do not pack to the recorded ones at {budget} tokens")
    return packed


def over_corpus(base: dict, always: dict, p_relevant: float | None, cost: dict) -> dict:
    """A record of `base`'s question over another corpus: base's corpus-free fields (draft, samples,
    Never answer, corpus-free probes and scores) with that corpus's Always branch, CRAG grade and
    the seconds of the stages run for it (the draft and the probes keep base's seconds; its CRAG
    probe graded a context of the same token budget). Search-dependent scores still need
    `fill_scores(..., search_changed=True)`."""
    probes_ = {**base.get("probes", {}), **({"p_relevant": p_relevant} if p_relevant is not None else {})}
    return {**base, "always": always, "probes": probes_, "cost": {**base.get("cost", {}), **cost}}
