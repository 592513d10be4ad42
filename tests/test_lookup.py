"""Prompt lookup: guesses copied from the text so far, verified by the model (runtime/lookup.py,
draft._greedy_lookup): fewer model calls, the same tokens and statistics as one step at a time."""

import pytest

from targ_mlx.runtime import draft as D
from targ_mlx.runtime import lookup

PASSAGE = ("Roald Amundsen was a Norwegian explorer of polar regions. On 14 December 1911, Amundsen and his "
           "party became the first to reach the South Pole, five weeks before Robert Falcon Scott's group.")


def test_propose_copies_what_followed_the_latest_occurrence():
    h = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert lookup.propose(h, m=2) == [7, 8]  # the latest earlier [1, 2, 3] is followed by 7, 8
    assert lookup.propose(h, m=10) == [7, 8, 5, 1, 2, 3]  # up to the history's end


def test_propose_takes_the_longest_run_and_nothing_shorter_than_the_minimum():
    # [4, 2] occurred (followed by 6); [1, 2] did not: the last two tokens decide, not the last one
    assert lookup.propose([4, 2, 6, 1, 2], n_max=3, n_min=2) == []
    assert lookup.propose([4, 2, 6, 1, 2], n_max=3, n_min=1) == [6, 1, 2][:lookup.GUESS]
    assert lookup.propose([5, 4, 2, 6, 4, 2], n_max=3, n_min=2) == [6, 4, 2]
    assert lookup.propose([1, 2, 3], m=0) == []
    assert lookup.propose([], m=4) == []


def _count_chunks(bb, monkeypatch):
    """A spy on the real verify call: how many chunks ran and how many tokens they fed."""
    seen = {"calls": 0, "tokens": 0}
    real = bb.step_chunk

    def counted(tokens, cache):
        seen["calls"] += 1
        seen["tokens"] += int(tokens.shape[0])
        return real(tokens, cache)

    monkeypatch.setattr(bb, "step_chunk", counted)
    return seen


def _prompt(bb, question):
    from targ_mlx import pipeline

    return pipeline.prompt_ids(bb, question, "paper", f"[Roald Amundsen] {PASSAGE}")


def test_lookup_decoding_gives_the_tokens_of_one_step_at_a_time(backbone, monkeypatch):
    bb = backbone
    if not bb.engine.independent_rows:
        pytest.skip("prompt lookup runs only where rows are computed alone (the CPU kernels)")
    ids = _prompt(bb, "Repeat the passage word for word.")
    monkeypatch.setenv(lookup.ENV, "0")
    one_at_a_time = list(D.generate_tokens(bb, ids, 48))
    monkeypatch.setenv(lookup.ENV, "1")
    seen = _count_chunks(bb, monkeypatch)
    looked_up = list(D.generate_tokens(bb, ids, 48))
    assert looked_up == one_at_a_time
    # it ran, and kept guesses: fewer model calls than tokens after the first
    assert seen["calls"] > 0 and seen["calls"] < len(looked_up) - 1, (seen, len(looked_up))


def test_a_draft_with_lookup_keeps_its_statistics_and_continues_from_its_cache(backbone, monkeypatch):
    """The draft's entropies and gaps are the gate's input: bit for bit the same; and a draft cut at
    k inside a verified chunk leaves its cache just before its last token, so the answer continued
    from it is the one-step answer (`continue_tokens` after a draft, as a skipped answer does)."""
    bb = backbone
    if not bb.engine.independent_rows:
        pytest.skip("prompt lookup runs only where rows are computed alone (the CPU kernels)")
    ids = _prompt(bb, "Repeat the passage word for word.")
    got = {}
    for mode in ("0", "1"):
        monkeypatch.setenv(lookup.ENV, mode)
        for k in (7, 20):
            d = D.draft(bb, ids, k)
            got[mode, k] = (d.tokens, d.entropies, d.gaps, d.ended, list(D.continue_tokens(bb, d, 24)))
    for k in (7, 20):
        assert got["1", k] == got["0", k], k
    assert got["0", 7][0] + got["0", 7][4][:13] == got["0", 20][0]  # the same text, cut elsewhere


def test_a_drafts_context_is_copied_from_but_never_read(backbone, monkeypatch):
    """`draft(..., context=)`: tokens the guesses may come from besides the prompt (the passages a
    search found first). The draft stays closed-book: the same tokens and statistics with a context
    that holds its own words (so its guesses are right) as with none, in fewer model calls."""
    bb = backbone
    if not bb.engine.independent_rows:
        pytest.skip("prompt lookup runs only where rows are computed alone (the CPU kernels)")
    from targ_mlx import pipeline

    ids = pipeline.prompt_ids(bb, "Who was the first person to reach the South Pole?", "paper")
    monkeypatch.setenv(lookup.ENV, "1")
    bare = D.draft(bb, ids, 20)
    seen = _count_chunks(bb, monkeypatch)
    fed = D.draft(bb, ids, 20, context=bb.tokenizer.encode(PASSAGE) + list(bare.tokens))
    assert (fed.tokens, fed.entropies, fed.gaps, fed.ended) == (bare.tokens, bare.entropies, bare.gaps, bare.ended)
    assert fed.context and seen["calls"] < len(fed.tokens) // 2, (seen, len(fed.tokens))
