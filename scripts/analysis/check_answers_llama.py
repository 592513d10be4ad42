"""Do the eval's Never answers match llama.cpp's on the same GGUF and the same prompt ids?

Reads a records.jsonl of `python -m targ_mlx.eval`, rebuilds each question's prompt ids (they
must equal the record's `tok_prompt`), decodes greedily with llama-cpp-python (the `bench`
extra) and compares answers, accuracy and EM. Separates "the model knows little" from "our
kernels answer worse than llama.cpp" when an eval's closed-book accuracy looks low.

    python scripts/analysis/check_answers_llama.py results/qwen2.5-coder-1.5b/clean/triviaqa/records.jsonl \\
        --model qwen2.5-coder-1.5b --prompt short
"""

from __future__ import annotations

import argparse
import json

from targ_mlx import bind_openblas

bind_openblas()  # before mlx.core loads
from targ_mlx.runtime.backbone import load_backbone  # noqa: E402
from targ_mlx.runtime.model_spec import ALIASES, alias_path  # noqa: E402
from targ_mlx.eval.metrics import contains, exact_match  # noqa: E402
from targ_mlx.pipeline import prompt_ids  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("records")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="alias or .gguf path the records were made with")
    ap.add_argument("--prompt", default="short", help="the eval's --prompt (default short)")
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args(argv)
    from llama_cpp import Llama

    recs = [json.loads(line) for line in open(args.records, encoding="utf-8")]
    bb = load_backbone(args.model)
    path = alias_path(args.model) if args.model in ALIASES else args.model
    llm = Llama(model_path=str(path), n_ctx=1024, n_threads=2, verbose=False)
    eos = set(bb.tokenizer.eos_ids)
    same = acc = acc_l = em = em_l = 0
    for r in recs:
        ids = prompt_ids(bb, r["question"], args.prompt)
        if len(ids) != r["tok_prompt"]:
            raise SystemExit(f"{r['id']}: prompt is {len(ids)} tokens, the record's {r['tok_prompt']}: "
                             "fix: pass the --prompt the eval used")
        out: list[int] = []
        for t in llm.generate(ids, top_k=1, top_p=1.0, temp=0.0, reset=True):
            if t in eos or len(out) >= args.max_tokens:
                break
            out.append(t)
        theirs, ours = bb.tokenizer.decode(out).strip(), r["never"]["answer"]
        same += theirs == ours
        acc, acc_l = acc + contains(ours, r["answers"]), acc_l + contains(theirs, r["answers"])
        em, em_l = em + exact_match(ours, r["answers"]), em_l + exact_match(theirs, r["answers"])
        if theirs != ours:
            print(f"{r['id']}: ours {ours!r} | llama.cpp {theirs!r}", flush=True)
    n = len(recs)
    print(f"n={n} identical answers {same}/{n}; accuracy ours {acc / n:.3f} llama.cpp {acc_l / n:.3f}; "
          f"EM ours {em / n:.3f} llama.cpp {em_l / n:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
