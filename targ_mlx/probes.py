"""Yes/no probe prompts, each read as the probability of "yes" from one prefill
(`runtime.batch.p_yes`): the eval's reflective baselines (Self-Eval, Self-RAG-lite, CRAG-lite) and
the LLM reranker's judge (`targ_mlx.rerank`); and the query-likelihood reranker's prompt, read as
the log-probability of the question after it. Pure prompt builders.
"""

from __future__ import annotations

SYSTEM = "You are a helpful assistant. Reply with Yes or No only."


def _ask(text: str) -> list[dict]:
    """One yes/no question as chat messages: the shared system line, then `text`."""
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]


def self_eval(question: str) -> list[dict]:
    """Self-Eval gate: does the model think it needs to look something up?"""
    return _ask(f"Question: {question}\nDo you need to look up information "
                "(for example in Wikipedia) to answer this question correctly? Yes or No?")


def self_check(question: str, answer: str) -> list[dict]:
    """Self-RAG-lite reflection: is the draft answer supported? (we read P(no) = unsupported)."""
    return _ask(f"Question: {question}\nProposed answer: {answer}\n"
                "Is the proposed answer correct and supported by facts? Yes or No?")


def crag_grade(question: str, context: str) -> list[dict]:
    """CRAG-lite evaluator: are the retrieved passages relevant to the question?"""
    return _ask(f"Passages:\n{context}\n\nQuestion: {question}\n"
                "Do these passages contain the answer to the question? Yes or No?")


def passage_grade(question: str, passage: str) -> list[dict]:
    """The LLM reranker's judge (`targ_mlx.rerank`): does this one passage answer the question?"""
    return _ask(f"Passage:\n{passage}\n\nQuestion: {question}\n"
                "Does the passage contain the answer to the question? Yes or No?")


def question_from(passage: str) -> list[dict]:
    """The query-likelihood reranker's prompt (UPR): the question is scored as the reply to this."""
    return [{"role": "user", "content": f"Passage: {passage}\nPlease write a question based on this passage."}]


def crag_head(tokenizer, context: str, n_tokens: int) -> str:
    """What the CRAG-lite evaluator grades: the first n tokens of the packed context."""
    return tokenizer.decode(tokenizer.encode(context)[:n_tokens]) if context else "(no passages)"
