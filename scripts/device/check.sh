#!/bin/bash
# On a lent GPU machine (no network), from the repo root, with DIR from prepare.sh carried:
# (1) the mlx[cuda] path: scripts/device/check_gpu.py on stand-in GGUFs, and `targ ask` end to end on the
# GPU; (2) the CPU kernels on 2 of its cores: bench_k4tiles and bench_k6tiles per matrix (each Q4_K kernel, and the
# VNNI kernel on the k4 layout against its AVX2 kernel to the bit), test_kquant under each Q4_K
# layout, and bench_backbone against llama.cpp's llama-bench built there, whole model, each
# layout (against llama.cpp's repacked buffers where they run, MAPPED=1: as mapped). SKIP_GPU=1,
# SKIP_MATRIX=1 leave those parts out; ROUNDS (default 2) per whole-model run; LAYOUTS (default
# "k4 tiles") the 1.5B's Q4_K layouts; SMOL_DEFINES a kernel build's -D choice to time SmolLM2 with
# beside the default (e.g. TARG_Q8_VNNI_ROWS=8, via TARG_MLX_NATIVE_DEFINES); GPU_LIMIT (240) s. Outputs go to
# $OUT (machine.txt, gpu.txt, build.log, cpu.txt); it stops starting new
# steps SECONDS (default 450) after it began.
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
mkdir -p /tmp/m
for m in smollm2 qwen15b; do PYTHONPATH=/tmp/common python3 scripts/device/synth_gguf.py fill $D/$m.head /tmp/m/$m.gguf; done
el "builds start (llama-bench, the CPU kernels), in the background"
CMAKE=$(command -v cmake || python3 -c "import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, 'cmake'))" 2>/dev/null)
(tar xJf $D/llama-src.tar.xz -C /tmp && cd /tmp/llama_cpp_python-*/vendor/llama.cpp \
 && $CMAKE -B /tmp/lb $(command -v ninja > /dev/null && echo -G Ninja) -DGGML_NATIVE=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=ON -DCMAKE_BUILD_TYPE=Release \
 && timeout 300 $CMAKE --build /tmp/lb -j 10 --target llama-bench) > $O/build.log 2>&1 & LB=$!
CPU_ENV="PYTHONPATH=/tmp/cpu:/tmp/common:$R TARG_MLX_CACHE=/tmp/tc"
# the kernels, then the 1.5B's repacked weights for each Q4_K layout into the cache, unpinned
# (2 cores took 154 s a layout here; the benchmark's loads then read the cache)
warm="from targ_mlx.runtime.backbone import load_backbone; load_backbone('/tmp/m/qwen15b.gguf', kernels=True); print('warm')"
LAYOUTS=${LAYOUTS:-k4 tiles}
(env $CPU_ENV timeout 300 python3 -c "from targ_mlx.runtime.native.build import build; print(build())" \
 && { [ -z "${SMOL_DEFINES:-}" ] || TARG_MLX_NATIVE_DEFINES="$SMOL_DEFINES" env $CPU_ENV timeout 300 python3 -c \
      "from targ_mlx.runtime.native.build import build; print(build())"; } \
 && for layout in $LAYOUTS; do TARG_MLX_Q4K_LAYOUT=$layout env $CPU_ENV TARG_MLX_THREADS=6 timeout 240 python3 -c "$warm" & done; wait) \
 > /tmp/native.log 2>&1 & NB=$!
if [ -z "${SKIP_GPU:-}" ]; then el "GPU"
GPU_ENV="PYTHONPATH=/tmp/cuda:/tmp/common:$R TARG_MLX_CACHE=/tmp/tcu LD_LIBRARY_PATH=${NVLIB}${LD_LIBRARY_PATH:-}"
{ # an encoder the image may hold (the evidence gate's search needs one; none travels: too big)
  find / -xdev \( -path /proc -o -path /sys \) -prune -o -iname "*minilm*" -print 2>/dev/null | head -5
  env $GPU_ENV timeout ${GPU_LIMIT:-240} python3 -X faulthandler scripts/device/check_gpu.py /tmp/m/smollm2.gguf /tmp/m/qwen15b.gguf; echo "check_gpu rc $?"
  # margin with tau 1 never reads (no encoder needed); evidence searches first (needs the encoder)
  for g in "margin --tau 1.0" "evidence"; do s=$(date +%s); env $GPU_ENV timeout 60 python3 -m targ_mlx ask --model /tmp/m/smollm2.gguf \
    --index $D/tiny-bm25 --db /tmp/d.db --gate $g --max-tokens 48 "who wrote the origin of species" 2>&1 | tail -8
    echo "ask --gate $g: rc ${PIPESTATUS[0]}, $(( $(date +%s) - s )) s"; done; } > $O/gpu.txt 2>&1
el "GPU done"; cat $O/gpu.txt; fi
el "waiting for the builds"; wait $NB; cat /tmp/native.log >> $O/build.log; wait $LB; echo "llama-bench build rc $?" >> $O/build.log
LBX=/tmp/lb/bin/llama-bench
export TARG_MLX_THREADS=2 OPENBLAS_NUM_THREADS=2 OMP_NUM_THREADS=2
[ -n "${SKIP_MATRIX:-}" ] || { el "per matrix"
  for rows in 4 8; do g++ -std=gnu++20 -O3 -march=native -DTARG_K4_VNNI_ROWS=$rows -I$R/targ_mlx/runtime/native/csrc \
    scripts/kernels/bench_k4tiles.cpp -o /tmp/bk4-$rows -lpthread; done
  for shape in "17920 1536 256" "3584 1536 256" "1536 8960 256" "17920 1536 8" "17920 1536 1"; do
    for rows in 4 8; do echo "VNNI rows $rows:"; taskset -c $CPUS /tmp/bk4-$rows $shape 20; done; done
  g++ -std=gnu++20 -O3 -march=native -I$R/targ_mlx/runtime/native/csrc scripts/kernels/bench_k6tiles.cpp -o /tmp/bk6 -lpthread
  for shape in "1536 8960 256" "256 1536 256" "1536 8960 8" "1536 8960 1"; do taskset -c $CPUS /tmp/bk6 $shape 10; done
  el "test_kquant, each layout"
  for layout in k4 tiles; do TARG_MLX_Q4K_LAYOUT=$layout env $CPU_ENV timeout 120 python3 -X faulthandler -m pytest -q \
    -p no:cacheprovider tests/test_kquant.py > $O/test_kquant_$layout.txt 2>&1; echo "test_kquant $layout rc $?"; done; } > $O/cpu.txt 2>&1
{ el "llama-bench probes"
  for rp in 0 1; do taskset -c $CPUS timeout 60 $LBX -m /tmp/m/smollm2.gguf -t 2 -p 64 -n 4 -r 1 --repack $rp 2>&1 | tail -4
    echo "llama-bench --repack $rp rc ${PIPESTATUS[0]}"; done; } >> $O/cpu.txt 2>&1
cat $O/cpu.txt
# the peer: llama.cpp as it runs by default (repacked buffers) where that works here, else mapped
XB=""; [ -z "${MAPPED:-}" ] && grep -q "llama-bench --repack 1 rc 0" $O/cpu.txt && XB="--extra-bufts"
BB="env $CPU_ENV taskset -c $CPUS python3 scripts/bench/bench_backbone.py --threads 2 --decode-tokens 32 --variants kernels --llama-bench $LBX $XB"; ROUNDS=${ROUNDS:-2}
if grep -q "llama-bench --repack [01] rc 0" $O/cpu.txt; then
  for defs in "" ${SMOL_DEFINES:+"$SMOL_DEFINES"}; do  # the default build, then SMOL_DEFINES as one build
    [ $(left) -gt 45 ] && { el "SmolLM2 ${defs:-(default build)}" | tee -a $O/cpu.txt; TARG_MLX_NATIVE_DEFINES="$defs" \
      timeout $(( $(left) > 95 ? 90 : $(left) - 5 )) $BB --model /tmp/m/smollm2.gguf --rounds 3 --output-dir /tmp/bb 2>&1 | tail -6 | tee -a $O/cpu.txt; }
  done
  for layout in $LAYOUTS; do
    [ $(left) -lt 90 ] && { el "skip the 1.5B, $layout: $(left) s left" | tee -a $O/cpu.txt; continue; }
    el "1.5B, $layout $XB" | tee -a $O/cpu.txt; TARG_MLX_Q4K_LAYOUT=$layout timeout $(( $(left) - 10 )) $BB --model /tmp/m/qwen15b.gguf \
      --rounds $ROUNDS --output-dir /tmp/bb 2>&1 | grep -v Warning | tail -7 | tee -a $O/cpu.txt
  done
fi
el done
