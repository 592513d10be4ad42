#!/bin/bash
# Prepare what a lent GPU machine needs, in a folder git ignores, when that machine can be sent only
# this tree plus ~64 MB and reaches no network (how the VNNI kernels and the mlx[cuda] path
# were checked: BENCHMARKS.md, rows "GPU: ..." and "kernels vs llama.cpp: ..., Intel AMX").
#
#   scripts/device/prepare.sh [DIR]          # default .dev (git-ignored)
#   # then carry DIR and run there: bash scripts/device/check.sh DIR [SECONDS]   (outputs: $OUT)
#
# It holds: wheels for Python 3.12 (what targ_mlx needs beyond the machine's image: mlx, mlx-lm,
# usearch with numkong, bm25s, ...), mlx-cpu, the mlx-cuda-13 wheel as a tarball with the cubins
# of other GPUs than sm_90 zeroed and symbols stripped (90 MB -> 20 MB), llama-cpp-python's sdist
# without models/docs/other backends (77 MB -> 4 MB; its llama.cpp builds llama-bench alone), the GGUFs' headers (scripts/device/synth_gguf.py)
# and a BM25-only index of 1,500 real passages. ~61 MB: keep results/ out of the index for the call
# (`git rm -r -q --cached results`, then `git reset -q results`), or the tree is over the limit.
set -euo pipefail
D=${1:-.dev}; PY=${PYTHON:-.venv/bin/python}
mkdir -p $D/wh $D/cpu $D/mlxpy /tmp/prep
P="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform any"
for n in 35 34 31 28 27 26 24 17; do P="$P --platform manylinux_2_${n}_x86_64"; done
P="$P --platform manylinux2014_x86_64 --platform manylinux1_x86_64"
v() { $PY -c "import importlib.metadata as m; print(m.version('$1'))"; }
$PY -m pip download -q $P -d $D/wh $(for p in bm25s click click-default-group diskcache gguf nanobind numkong \
    platformdirs PyStemmer sqlite-fts4 sqlite-utils tabulate tomli_w usearch mlx-lm python-dateutil \
    mwparserfromhell pypdf pytest pluggy iniconfig packaging; do echo "$p==$(v $p)"; done)
$PY -m pip download -q $P -d $D/mlxpy "mlx==$(v mlx)"
$PY -m pip download -q $P -d $D/cpu "mlx-cpu==$(v mlx)"
$PY -m pip download -q $P -d /tmp/prep "mlx-cuda-13==$(v mlx)"
rm -rf /tmp/prep/cuda && mkdir /tmp/prep/cuda && (cd /tmp/prep/cuda && unzip -q ../mlx_cuda_13-*.whl)
strip --strip-unneeded /tmp/prep/cuda/mlx/lib/libmlx.so
$PY - /tmp/prep/cuda/mlx/lib/libmlx.so <<'PYEOF'
import struct, sys
# Zero every fatbin entry but sm_90's cubins: headers stay, so the runtime still parses the
# fatbin and picks sm_90 on an H100/H200; zeros compress to nothing.
p = sys.argv[1]; d = bytearray(open(p, "rb").read()); i = 0
while (i := d.find(struct.pack("<I", 0xBA55ED50), i)) >= 0:
    _, hsz, fsz = struct.unpack_from("<HHQ", d, i + 4); j, end = i + hsz, i + hsz + fsz
    while j < end:
        kind, _, hs, ps = struct.unpack_from("<HHIQ", d, j)
        if not (kind == 2 and struct.unpack_from("<I", d, j + 28)[0] == 90):
            d[j + hs:j + hs + ps] = bytes(ps)
        j += hs + ps
    i = end
open(p, "wb").write(d)
PYEOF
tar cf - -C /tmp/prep/cuda . | xz -6 -T0 > $D/cuda13-sm90.tar.xz
$PY -m pip download -q --no-deps --no-binary=:all: -d /tmp/prep "llama-cpp-python==$(v llama_cpp_python)"
rm -rf /tmp/prep/l && mkdir /tmp/prep/l && tar xzf /tmp/prep/llama_cpp_python-*.tar.gz -C /tmp/prep/l
L=$(ls -d /tmp/prep/l/llama_cpp_python-*); V=$L/vendor/llama.cpp
rm -rf $L/{.git,.github,examples,docs,docker,tests} $V/{.git*,.github,models,docs,media,benches,tests,examples,conversion,gguf-py,scripts,skills}
rm -rf $V/tools/{ui,server,tts,results}
# llama.cpp's own llama-bench (bench_backbone.py --llama-bench) as the only tool built from here
printf 'find_package(Threads REQUIRED)\nllama_add_compile_flags()\nadd_subdirectory(llama-bench)\n' > $V/tools/CMakeLists.txt
for b in cann cuda et hexagon hip metal musa opencl openvino rpc sycl virtgpu vulkan webgpu zdnn zendnn; do rm -rf $V/ggml/src/ggml-$b; done
tar cJf $D/llama-src.tar.xz -C /tmp/prep/l $(basename $L)
$PY scripts/device/synth_gguf.py head "$($PY -c "from targ_mlx.runtime.backbone import alias_path; print(alias_path('smollm2-135m'))")" $D/smollm2.head
$PY scripts/device/synth_gguf.py head "$($PY -c "from targ_mlx.runtime.backbone import alias_path; print(alias_path('qwen2.5-coder-1.5b'))")" $D/qwen15b.head
head -n 1500 ../shared/data/corpus/wiki_pool.jsonl > /tmp/prep/pool1500.jsonl
rm -rf $D/tiny-bm25 && $PY -m targ_mlx.index build --corpus /tmp/prep/pool1500.jsonl --out $D/tiny-bm25 --no-dense --bm25 --quiet
du -sh $D
