"""Kernels or MLX's own layers, chosen by measurement (targ_mlx/runtime/native/choice.py)."""

import json
import sys

import pytest

from targ_mlx.runtime import native
from targ_mlx.runtime.native import choice

pytestmark = pytest.mark.skipif(sys.platform == "darwin", reason="the CPU kernels are for CPU-only MLX (Linux)")


def test_prefer_kernels_weighs_prefill_and_decode_as_a_typical_answer_does():
    fast_prefill = choice.Timing(prefill_tok_s=1e-3, decode_step_s=40e-3)  # 0.6 + 2.4 = 3.0 s
    fast_decode = choice.Timing(prefill_tok_s=4e-3, decode_step_s=5e-3)  # 2.4 + 0.3 = 2.7 s
    assert choice.prefer_kernels(fast_decode, fast_prefill)
    assert not choice.prefer_kernels(fast_prefill, fast_decode)
    assert choice.prefer_kernels(fast_prefill, fast_prefill)  # a tie keeps the kernels


def test_measure_times_both_paths_and_the_saved_choice_is_reused(tmp_path):
    mod = native.module()
    assert mod is not None, native.status()
    path = tmp_path / "choice.json"
    got = choice.load_or_measure(mod, path)
    for t in (got.kernels, got.mlx):
        assert 0 < t.prefill_tok_s < 1 and 0 < t.decode_step_s < 10
    assert got.use_kernels == (got.kernels.cost() <= got.mlx.cost())
    assert got.simd == mod.simd() and got.reason().startswith(f"measured on {mod.simd()}")
    saved = json.loads(path.read_text())
    saved["kernels"]["decode_step_s"] = 123.0  # a second call must read the file, not time again
    path.write_text(json.dumps(saved))
    assert choice.load_or_measure(mod, path).kernels.decode_step_s == 123.0
    path.write_text("{not json")  # a damaged file is measured again and rewritten
    assert choice.load_or_measure(mod, path).kernels.decode_step_s < 10


def test_a_choice_for_mlx_turns_the_kernels_off_and_the_model_runs_on_mlx(monkeypatch):
    from targ_mlx.runtime.backbone import load_backbone

    mod = native.module()
    assert mod is not None, native.status()
    monkeypatch.delenv("TARG_MLX_NATIVE", raising=False)
    # The per-test cache folder (conftest) holds this build's choice file, as the user's cache would.
    path = choice.choice_path(mod)
    path.parent.mkdir(parents=True, exist_ok=True)
    slow = {"prefill_tok_s": 1e-2, "decode_step_s": 1e-1}
    fast = {"prefill_tok_s": 1e-4, "decode_step_s": 1e-3}
    path.write_text(json.dumps({"kernels": slow, "mlx": fast, "simd": mod.simd()}))
    monkeypatch.setattr(native, "_CHOSEN", False)  # forget this process's earlier choice
    monkeypatch.setattr(native, "_OPS", None)
    monkeypatch.setattr(native, "_STATUS", native.status())
    try:
        assert native.ops() is None
        assert native.status().startswith("off: MLX's own layers are faster here")
        assert load_backbone("smollm2-135m").engine.name == "mlx"
        assert load_backbone("smollm2-135m", kernels=True).engine.name == "targ_mlx.runtime.native"  # asked by name
        path.write_text(json.dumps({"kernels": fast, "mlx": slow, "simd": mod.simd()}))
        monkeypatch.setattr(native, "_CHOSEN", False)
        assert native.ops() is mod and native.status().startswith("on (")
    finally:
        path.unlink(missing_ok=True)


def test_native_defines_reach_the_build_and_its_cache_key(monkeypatch):
    # a -D choice timed on another CPU class must not reuse (or overwrite) the default build
    from targ_mlx.runtime.native import build

    monkeypatch.delenv("TARG_MLX_NATIVE_DEFINES", raising=False)
    default = build.cache_key()
    monkeypatch.setenv("TARG_MLX_NATIVE_DEFINES", "TARG_Q8_VNNI_ROWS=8")
    assert build._defines() == ["-DTARG_Q8_VNNI_ROWS=8"]
    assert build.cache_key() != default
