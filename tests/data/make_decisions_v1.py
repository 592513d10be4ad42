"""Wrote tests/data/decisions_v1.db (and, reading it back, decisions_v1.json) with the decision_log of
commit 896a883, before the module was split: the schema a split must still open unchanged."""
import json
import sys

from targ_mlx.log.decisions import DecisionLog
from targ_mlx.records import Answer, Latency, PassageRef, TokenCounts

path = sys.argv[1]
with DecisionLog(path) as log:
    a = Answer(question="who wrote 'Middlemarch'?", answer="George Eliot", model="smollm2-135m", gate="margin",
               tau=0.35, score=0.5, retrieved=True, scores={"margin": 0.5, "entropy": 1.25},
               passages=(PassageRef(17, "Middlemarch", 0.81, "Middlemarch is a novel..."),),
               tokens=TokenCounts(prompt=30, draft=20, context=400, output=5),
               latency=Latency(draft=0.2, gate=0.0001, retrieval=0.05, prefill=0.3, decode=0.1, total=0.65))
    d1 = log.record(a, source="chat", session="s1", index_id="idx1")
    d2 = log.record(Answer(question="capital of france", answer="Paris", model="smollm2-135m", gate="never",
                           tau=float("inf"), score=None, retrieved=False, scores={"margin": 0.2, "entropy": 0.4, "variance": 0.1}),
                    source="eval", session="run1", gold=["Paris"], em=1.0, f1=1.0,
                    branches={"never": {"em": 1.0, "f1": 1.0}, "always": {"em": 0.0, "f1": 0.5}}, extra={"qid": "q1"})
    log.feedback(d1, "correct", "ok")
    log.add_message("s1", "user", "who wrote 'Middlemarch'?")
    log.add_message("s1", "assistant", "George Eliot", d1)
