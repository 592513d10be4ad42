#!/bin/bash
# Issue 55's reader arms over the large *hybrid* index, once its dense part is built
# (docs/indexes.md, "large, dense + BM25"): the Always branch only, the drafts and Never answers
# reused from the clean cells, each arm into results/<model>/large-hybrid-reader/<arm>/<dataset>:
#   passages     today's single prompt, re-recorded on this index and machine (the pairing's base:
#                an index built elsewhere may order a few neighbours otherwise)
#   each         each passage read on its own, the answer chosen by evidence (--read each)
#   draft-route  the single prompt over what question + draft finds (--draft-route 1)
# Arms run in that order, each over the three datasets (ARMS="passages each" to choose).
# Resumes: a cell's finished records are kept and the rest recorded. Then, paired:
#   python scripts/bench/bench_reader.py --index index/large-hybrid --retriever hybrid \
#       --each results/qwen2.5-coder-1.5b/large-hybrid-reader/each --single results/qwen2.5-coder-1.5b/large-hybrid-reader/passages \
#       --each results/smollm2-135m/large-hybrid-reader/each --single results/smollm2-135m/large-hybrid-reader/passages
#   python scripts/analysis/compare_read.py results/qwen2.5-coder-1.5b/large-hybrid-reader/passages/nq_open \
#       results/qwen2.5-coder-1.5b/large-hybrid-reader/draft-route/nq_open
# Usage: [ARMS=...] scripts/analysis/hybrid_reader.sh MODEL N_NQ N_TRIVIA N_POPQA   (e.g. qwen2.5-coder-1.5b 120 60 60)
set -euo pipefail
model=${1:?model alias}
sizes=("${2:-120}" "${3:-60}" "${4:-60}")
files=(nq_open_dev triviaqa_dev popqa_1k)
names=(nq_open triviaqa popqa)
test -f index/large-hybrid/manifest.json || { echo "index/large-hybrid is not built yet (docs/indexes.md)"; exit 1; }
declare -A flags=([passages]="--read passages" [each]="--read each --each 4" [draft-route]="--draft-route 1")
for dir in ${ARMS:-passages each draft-route}; do
  test -n "${flags[$dir]:-}" || { echo "ARMS: $dir is not one of: ${!flags[*]}"; exit 1; }
  for i in 0 1 2; do
    python -m targ_mlx.eval --index index/large-hybrid --retriever hybrid --model "$model" \
      --data-file "../shared/data/qa/${files[$i]}.jsonl" --name "${names[$i]}" --limit "${sizes[$i]}" \
      --reuse-records "results/$model/clean" ${flags[$dir]} \
      --output-dir "results/$model/large-hybrid-reader/$dir/${names[$i]}" \
      --batch-size 8 --latency-sample 0 --quiet --no-plots
  done
done
