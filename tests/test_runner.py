"""The one answer runner: events in order, skip-after-search == Never, a new gate as one module."""

import threading
import time

import numpy as np
import pytest

from targ_mlx import gates, runner
from targ_mlx.eval import analysis as an
from targ_mlx.eval import controls as ctl
from targ_mlx.eval.record import fill_scores
from targ_mlx.eval.sweep import Signals, gate_points, split
from targ_mlx.index import open_retriever
from targ_mlx.log.decisions import DecisionLog
from targ_mlx.settings import Settings


def _kinds(events):
    out = []
    for ev in events:
        name = type(ev).__name__
        if not out or out[-1] != name:  # Text events collapse into one
            out.append(name)
    return out


def test_a_search_first_gate_searches_before_it_decides(backbone, small_index_dir, small_index_questions):
    r = open_retriever(small_index_dir)
    q = small_index_questions[0]["question"]
    events = list(runner.stream_answer(backbone, r, q, Settings(gate="evidence", tau=0.0, max_tokens=12)))
    assert _kinds(events) == ["Drafted", "Searched", "Decided", "Text", "Done"]
    decided = next(e for e in events if isinstance(e, runner.Decided))
    ans = events[-1].answer
    assert decided.decision.retrieve and ans.retrieved and ans.passages  # tau 0: any evidence reads
    assert ans.scores["evidence"] == decided.decision.signal and "read" in ans.reason
    assert isinstance(ans.confirmed, bool)  # it searched with a draft: it asked the passages about it
    # a draft-only gate reads after deciding: the search comes after Decided, only when it reads
    events = list(runner.stream_answer(backbone, r, q, Settings(gate="margin", tau=0.0, max_tokens=12)))
    assert _kinds(events) == ["Drafted", "Decided", "Searched", "Text", "Done"]
    events = list(runner.stream_answer(backbone, r, q, Settings(gate="margin", tau=1e9, max_tokens=12)))
    assert "Searched" not in _kinds(events) and not events[-1].answer.searched
    assert events[-1].answer.confirmed is None  # nothing searched, nothing to confirm


def test_a_skip_after_search_is_the_never_answer_token_for_token(assistant_factory, small_index_dir,
                                                                  small_index_questions):
    r = open_retriever(small_index_dir)
    for q in [x["question"] for x in small_index_questions[:3]]:
        never = assistant_factory(r, gate="never", max_tokens=24).answer(q)
        skip = assistant_factory(r, gate="evidence", tau=1e9, max_tokens=24).answer(q)
        assert not skip.retrieved and skip.searched and skip.found and skip.passages == ()
        assert skip.answer == never.answer and skip.tokens.output == never.tokens.output
        assert skip.latency.retrieval > 0 and skip.tokens.context == 0  # the search is counted, nothing read
        assert "answered from memory" in skip.reason


class TopSimilarityGate(gates.Gate):
    """A gate written in a test as one would add one: read iff the best passage is close enough."""

    name, needs, default_tau = "topsim", frozenset({gates.SEARCH}), 0.5

    def score(self, sig, p=gates.GateParams()):
        return max((e.similarity for e in sig.evidence or ()), default=0.0)


@pytest.fixture
def topsim_gate():
    gates.register(TopSimilarityGate())
    yield
    gates.REGISTRY.pop("topsim")


def _records(n=40):
    from pathlib import Path

    path = Path(__file__).parents[1] / "results" / "smollm2-135m" / "clean" / "nq_open" / "records.jsonl"
    import json

    with open(path, encoding="utf-8") as f:
        return [json.loads(next(f)) for _ in range(n)]


def test_a_gate_added_as_one_module_passes_through_ask_log_and_eval(topsim_gate, assistant_factory, small_index_dir,
                                                                     small_index_questions, tmp_path):
    log = DecisionLog(tmp_path / "log.db")
    r = open_retriever(small_index_dir)
    a = assistant_factory(r, log=log, gate="topsim", tau=0.3, max_tokens=12)
    ans = a.answer(small_index_questions[0]["question"])
    best = max(p.score for p in ans.found)
    assert ans.gate == "topsim" and ans.score == pytest.approx(best, abs=1e-6) and ans.retrieved == (best > 0.3)
    row = log.get(a.last_decision_id)
    assert row["gate"] == "topsim" and row["extra"]["scores"]["topsim"] == pytest.approx(ans.score)
    # the eval scores it from records, with no model: every threshold's decision is recomputable
    recs = _records()
    assert fill_scores(recs, "smollm2-135m", 3.0) == len(recs)
    tops = [max(p[2] for p in x["always"]["passages"]) for x in recs]
    assert [x["scores"]["topsim"]["20"] for x in recs] == pytest.approx(tops)
    sig = Signals(recs)
    assert np.isfinite(sig.u["topsim"][20]).all()
    assert {p.method for p in gate_points(sig, ("topsim",), (20,))} == {"topsim"}


def _synthetic(n=200, helps_every=5):
    """Records where retrieval helps exactly on every 5th question: there the best passage is
    close (0.9) and the draft unsure (small gaps); elsewhere the passage is far and the draft sure."""
    recs = []
    for i in range(n):
        helps = i % helps_every == 0
        never_right = (not helps) and i % 2 == 1
        gaps = [0.05] * 20 if helps else [12.0] * 20
        recs.append({
            "id": f"q{i}", "question": "who q", "answers": ["a"], "tok_prompt": 10, "draft": [1] * 20,
            "entropies": [1.0] * 20, "gaps": gaps, "logprobs": [-0.1] * 20, "samples": [],
            "scores": {"margin": {"20": gates.margin_score(gaps)}},
            "never": {"answer": "x", "em": float(never_right), "f1": 0.0, "acc": float(never_right), "tok_out": 3},
            "always": {"answer": "y", "em": float(helps or never_right), "f1": 0.0, "acc": float(helps or never_right),
                       "tok_out": 3, "tok_ctx": 100, "passages": [[i, "T", 0.9 if helps else 0.1]], "hit": float(helps)},
        })
    return recs


def test_the_evidence_gate_equal_to_the_oracle_scores_the_oracle():
    recs = _synthetic()
    fill_scores(recs, "smollm2-135m", 3.0)
    sig = Signals(recs)
    dev, test = split(sig.n, 0)
    v = an.verdict(sig, dev, test, "acc", 20, 200, 0, gate="evidence")
    t = sig.subset(test)
    helps = (t.always["acc"] > t.never["acc"])
    assert v.rate == pytest.approx(helps.mean(), abs=0.02)
    assert v.gate == pytest.approx(ctl.oracle_score(t.never["acc"], t.always["acc"], v.rate), abs=1e-9)
    assert v.vs_random[1] > 0  # and beats a random gate at its rate


class _Watched:
    """The real small index, noting which thread searched it and when each search began and ended."""

    def __init__(self, r):
        self.r, self.calls = r, []

    def search(self, query, k=5):
        return self.search_batch([query], k)[0]

    def search_batch(self, queries, k=5):
        t0 = time.perf_counter()
        found = self.r.search_batch(queries, k)
        self.calls.append((threading.current_thread().name, t0, time.perf_counter()))
        return found


def test_a_search_first_gate_searches_while_the_draft_decodes_and_answers_the_same(
        backbone, small_index_dir, small_index_questions, monkeypatch):
    monkeypatch.setattr(runner, "OVERLAP_SEARCH", True)  # as on a GPU: the CPU's kernels run it after
    r = open_retriever(small_index_dir)
    for q in [x["question"] for x in small_index_questions[:3]]:
        watched = _Watched(r)
        s = Settings(gate="evidence", tau=0.3, max_tokens=12)
        t_start = time.perf_counter()
        events, seen = [], {}
        for ev in runner.stream_answer(backbone, watched, q, s):
            seen.setdefault(type(ev).__name__, time.perf_counter())
            events.append(ev)
        assert _kinds(events) in (["Drafted", "Searched", "Decided", "Text", "Done"],
                                  ["Drafted", "Searched", "Decided", "Done"])
        (thread, began, _), = watched.calls
        assert thread != threading.main_thread().name  # beside the draft, not after it on this thread
        draft_s = next(e for e in events if isinstance(e, runner.Drafted)).seconds
        assert began - t_start < draft_s  # it began before the draft was done
        monkeypatch.setattr(runner, "OVERLAP_SEARCH", False)
        one_by_one = runner.run(backbone, watched, q, s)
        monkeypatch.setattr(runner, "OVERLAP_SEARCH", True)
        assert watched.calls[-1][0] == threading.main_thread().name
        overlapped = events[-1].answer
        assert (overlapped.answer, overlapped.retrieved, overlapped.score, overlapped.found, overlapped.passages) == (
            one_by_one.answer, one_by_one.retrieved, one_by_one.score, one_by_one.found, one_by_one.passages)


def test_a_search_that_needs_the_draft_or_the_model_waits_for_the_draft(backbone, small_index_dir,
                                                                      small_index_questions, monkeypatch):
    monkeypatch.setattr(runner, "OVERLAP_SEARCH", True)
    r = open_retriever(small_index_dir)
    q = small_index_questions[0]["question"]
    for s in (Settings(gate="evidence", tau=0.3, max_tokens=8, draft_route=1.0),
              Settings(gate="evidence", tau=0.3, max_tokens=8, rerank="llm")):
        watched = _Watched(r)
        runner.run(backbone, watched, q, s)
        assert watched.calls and all(t == threading.main_thread().name for t, _, _ in watched.calls)


def test_on_the_cpu_the_search_runs_before_the_draft_and_its_passages_feed_the_drafts_guesses(
        backbone, small_index_dir, small_index_questions, monkeypatch):
    """The CPU's kernels keep every core busy, so the search runs first on this thread, and the
    draft may copy guesses from the passages it found (`draft.Draft.context`): the same answer,
    decision and scores as when the draft has nothing but its prompt to copy from."""
    from targ_mlx.runtime import draft as D

    assert runner.OVERLAP_SEARCH is None and not backbone.on_gpu
    drafts = []
    real = D.draft

    def drafted(*a, **kw):  # a spy on the real draft: when it began and what it could copy from
        began = time.perf_counter()
        d = real(*a, **kw)
        drafts.append((began, d.context))
        return d

    monkeypatch.setattr(runner, "draft", drafted)
    q = small_index_questions[0]["question"]
    s = Settings(gate="evidence", max_tokens=8)
    watched = _Watched(open_retriever(small_index_dir))
    ans = runner.run(backbone, watched, q, s)
    (thread, _, search_ended), = watched.calls
    (draft_began, context), = drafts
    assert thread == threading.main_thread().name and ans.latency.overlap == 0
    assert search_ended <= draft_began  # the search came first
    assert ans.found and ans.found[0].title in backbone.tokenizer.decode(list(context))  # its passages went to the draft
    monkeypatch.setattr(runner, "OVERLAP_SEARCH", True)  # beside the draft: nothing found yet to copy from
    beside = runner.run(backbone, watched, q, s)
    assert drafts[-1][1] == ()
    assert (ans.answer, ans.retrieved, ans.score, ans.scores, ans.found) == (
        beside.answer, beside.retrieved, beside.score, beside.scores, beside.found)


# "when" questions over the small index; SmolLM2's short-prompt reading of the first gives no year
# while its draft does (seen on Zen 4); the others keep what was read
WHEN = ["when did toyota start making cars in the us", "when did united states enter world war i",
        "when was the first documented case of tool mark identification"]


def test_a_read_answer_that_says_no_time_gives_way_to_a_draft_that_does(backbone, small_index_dir):
    from targ_mlx.reader import fits_form

    r = open_retriever(small_index_dir)

    def done(q, **kw):
        return list(runner.stream_answer(backbone, r, q, Settings(prompt_style="short", max_tokens=32, **kw)))[-1]

    kept = 0
    for q in WHEN:
        read = done(q, gate="always")  # the same passages, the same prompt
        memory = done(q, gate="never")  # the draft, continued: its first k tokens are the draft
        ans = done(q, gate="evidence", tau=-1e9).answer  # drafts, then always reads
        assert ans.retrieved and [p.key for p in ans.found] == [p.key for p in read.answer.found]
        drafted = backbone.tokenizer.decode(list(memory.answer_ids[: ans.k]))
        if fits_form(q, drafted) and not fits_form(q, read.answer.answer):
            kept += 1  # the draft's whole answer, continued past k where it had not ended; nothing cited
            assert ans.answer == memory.answer.answer and ans.passages == () and "kept the draft" in ans.reason
            assert ans.finish_reason == memory.answer.finish_reason
            # a draft cut right after its year, before it ended, is continued to the same answer
            ids = list(memory.answer_ids)
            k = next(i for i in range(1, len(ids) + 1) if fits_form(q, backbone.tokenizer.decode(ids[:i])))
            assert k < len(ids)
            cut = done(q, gate="evidence", tau=-1e9, k=k).answer
            assert cut.tokens.draft == k and cut.answer == memory.answer.answer and "kept the draft" in cut.reason
        else:
            assert ans.answer == read.answer.answer and "kept the draft" not in ans.reason
            assert ans.passages
    assert kept, "no question here had a read answer without a time and a draft with one"
