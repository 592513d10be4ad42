#!/bin/bash
# On a lent GPU machine (no network), from the repo root, with DIR from prepare.sh carried:
# (1) the mlx[cuda] path: scripts/check_gpu.py on stand-in GGUFs, and `targ ask` end to end on the
# GPU; (2) the CPU kernels on 2 of its cores against llama.cpp built there (bench_k4tiles per
# matrix, bench_backbone whole model, each Q4_K layout). Outputs go to $OUT (machine.txt, gpu.txt,
# build.log, cpu.txt); it stops starting new steps SECONDS (default 450) after it began.
#
#   bash scripts/device/check.sh .dev 450
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
D=$(cd "${1:-.dev}" && pwd); R=$(pwd); O=${OUT:-/tmp/out}; BUDGET=${2:-450}; mkdir -p $O
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }; left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
{ lscpu | grep -v -i "^flags\|vulnerab"; grep -o 'avx512[a-z_0-9]*\|avx2\|amx[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' '
  echo; nvidia-smi -L; g++ --version | head -1; python3 -V; } > $O/machine.txt 2>&1
# two logical CPUs on different cores, for the 2-core benchmarks
C2=$(python3 -c "
sib = open('/sys/devices/system/cpu/cpu0/topology/thread_siblings_list').read().strip(); ids = set()
for part in sib.split(','):
    a, _, b = part.partition('-'); ids.update(range(int(a), int(b or a) + 1))
print(next(c for c in range(1, 256) if c not in ids))"); CPUS="0,$C2"; echo "benchmarks pinned to CPUs $CPUS" >> $O/machine.txt
PIP="python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target"
$PIP /tmp/common $D/wh/*.whl && $PIP /tmp/cpu $D/mlxpy/*.whl $D/cpu/*.whl && $PIP /tmp/cuda $D/mlxpy/*.whl || { echo "pip failed"; exit 1; }
tar xJf $D/cuda13-sm90.tar.xz -C /tmp/cuda
# libmlx.so looks for CUDA's libraries at $ORIGIN/../../nvidia/...: point that at the image's own
NV=$(python3 -c "import nvidia; print(list(nvidia.__path__)[0])" 2>/dev/null); [ -n "$NV" ] && ln -sfn $NV /tmp/cuda/nvidia
NVLIB=$(find ${NV:-/nonexistent} -maxdepth 3 -name lib -type d 2>/dev/null | tr '\n' ':')
el "builds start (llama.cpp, the CPU kernels), in the background"
OFF="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"
(tar xJf $D/llama-src.tar.xz -C /tmp && cd /tmp/llama_cpp_python-* && CMAKE_BUILD_PARALLEL_LEVEL=10 \
 CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF $OFF" \
 timeout 300 python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/llama .) > $O/build.log 2>&1 & LB=$!
CPU_ENV="PYTHONPATH=/tmp/cpu:/tmp/common:$R TARG_MLX_CACHE=/tmp/tc"
(env $CPU_ENV timeout 300 python3 -c "from targ_mlx.runtime.native.build import build; print(build())") > /tmp/native.log 2>&1 & NB=$!
mkdir -p /tmp/m
for m in smollm2 qwen15b; do PYTHONPATH=/tmp/common python3 scripts/synth_gguf.py fill $D/$m.head /tmp/m/$m.gguf; done
el "GPU"
GPU_ENV="PYTHONPATH=/tmp/cuda:/tmp/common:$R TARG_MLX_CACHE=/tmp/tcu LD_LIBRARY_PATH=${NVLIB}${LD_LIBRARY_PATH:-}"
{ env $GPU_ENV timeout 150 python3 -X faulthandler scripts/check_gpu.py /tmp/m/smollm2.gguf /tmp/m/qwen15b.gguf; echo "check_gpu rc $?"
  # margin with tau 1 never reads (no encoder needed); evidence searches first (needs the encoder)
  for g in "margin --tau 1.0" "evidence"; do s=$(date +%s); env $GPU_ENV timeout 75 python3 -m targ_mlx ask --model /tmp/m/smollm2.gguf \
    --index $D/tiny-bm25 --db /tmp/d.db --gate $g --max-tokens 48 "who wrote the origin of species" 2>&1 | tail -8
    echo "ask --gate $g: rc ${PIPESTATUS[0]}, $(( $(date +%s) - s )) s"; done; } > $O/gpu.txt 2>&1
cat $O/gpu.txt
el "waiting for the builds"; wait $NB; cat /tmp/native.log >> $O/build.log; wait $LB; echo "llama.cpp build rc $?" >> $O/build.log
export TARG_MLX_THREADS=2 OPENBLAS_NUM_THREADS=2 OMP_NUM_THREADS=2
{ g++ -std=gnu++20 -O3 -march=native -I$R/targ_mlx/runtime/native/csrc scripts/bench_k4tiles.cpp -o /tmp/bk4 -lpthread
  for shape in "17920 1536 256" "3584 1536 256" "1536 8960 256" "17920 1536 1"; do taskset -c $CPUS /tmp/bk4 $shape 20; done
  probe="import sys; sys.path.insert(0, 'scripts'); import bench_backbone as b; b.no_extra_bufts(); from llama_cpp import Llama
Llama(model_path='/tmp/m/smollm2.gguf', n_threads=2, verbose=False).eval(list(range(1, 40))); print('llama.cpp runs')"
  env PYTHONPATH=/tmp/llama:/tmp/cpu:/tmp/common:$R taskset -c $CPUS timeout 60 python3 -X faulthandler -c "$probe" 2>&1 | tail -5
  echo "llama.cpp probe rc ${PIPESTATUS[0]}"; } > $O/cpu.txt 2>&1
BB="env PYTHONPATH=/tmp/llama:/tmp/cpu:/tmp/common:$R TARG_MLX_CACHE=/tmp/tc taskset -c $CPUS python3 scripts/bench_backbone.py --threads 2 --decode-tokens 32 --variants kernels"
if grep -q "llama.cpp runs" $O/cpu.txt; then
  for layout in tiles k4; do
    [ $(left) -lt 100 ] && { el "skip the 1.5B, $layout: $(left) s left" | tee -a $O/cpu.txt; continue; }
    el "1.5B, $layout"; TARG_MLX_Q4K_LAYOUT=$layout timeout $(( $(left) - 10 )) $BB --model /tmp/m/qwen15b.gguf --rounds 2 \
      --output-dir /tmp/bb 2>&1 | grep -v Warning | tail -6 >> $O/cpu.txt
  done
  [ $(left) -gt 45 ] && timeout $(( $(left) - 5 )) $BB --model /tmp/m/smollm2.gguf --rounds 3 --output-dir /tmp/bb 2>&1 | tail -6 >> $O/cpu.txt
fi
cat $O/cpu.txt; el done
