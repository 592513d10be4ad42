"""The real offline model: loading, tokenizer/template from GGUF metadata, bad inputs."""

import shutil

import numpy as np
import pytest

from targ_mlx import prompts
from targ_mlx.runtime.backbone import alias_path, load_backbone
from targ_mlx.runtime.draft import draft
from targ_mlx.errors import ModelLoadError


def test_loads_offline_default(backbone):
    assert backbone.model_id == "smollm2-135m"
    assert backbone.info["arch"] == "llama"
    assert backbone.vocab_size == 49152
    assert backbone.context_length == 8192


def test_tokenizer_matches_reference_ids(backbone):
    # ids produced by transformers' own GGUF tokenizer for this file (checked once by hand)
    assert backbone.tokenizer.encode("Hello world, who wrote Hamlet?") == [19556, 905, 28, 617, 4150, 24630, 47]
    for text in ["Ünïcödé — 1999 ½ 東京", "  spaces\n\nnewlines\tTabs", "3.14159 and 2,000,000"]:
        assert backbone.tokenizer.decode(backbone.tokenizer.encode(text)) == text


def test_chat_template_has_paper_system_prompt(backbone):
    tok = backbone.tokenizer
    ids = tok.chat_ids(prompts.messages("Who wrote Hamlet?"))
    text = tok._tok.decode(ids, skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant. Answer concisely and factually.<|im_end|>")
    assert text.endswith("<|im_start|>user\nWho wrote Hamlet?<|im_end|>\n<|im_start|>assistant\n")
    assert 2 in tok.eos_ids  # <|im_end|>


def test_greedy_draft_is_deterministic(backbone):
    ids = backbone.tokenizer.chat_ids(prompts.messages("What is the capital of France?"))
    a, b = draft(backbone, ids, 8), draft(backbone, ids, 8)
    assert a.tokens == b.tokens
    assert np.allclose(a.gaps, b.gaps) and np.allclose(a.entropies, b.entropies)
    assert len(a.tokens) == len(a.gaps) == len(a.entropies) <= 8


def test_batched_samples_reproducible_with_seed(backbone):
    ids = backbone.tokenizer.chat_ids(prompts.messages("Name a famous painter."))
    a = draft(backbone, ids, 10, n_samples=5, temperature=0.7, seed=7)
    b = draft(backbone, ids, 10, n_samples=5, temperature=0.7, seed=7)
    c = draft(backbone, ids, 10, n_samples=5, temperature=0.7, seed=8)
    assert a.samples == b.samples and len(a.samples) == 5
    assert a.samples != c.samples
    greedy = draft(backbone, ids, 10)
    assert a.tokens == greedy.tokens  # the batched greedy row is the plain greedy draft


def test_unknown_alias_and_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match="unknown model 'smollm9'"):
        load_backbone("smollm9")
    with pytest.raises(ModelLoadError, match="GGUF file not found"):
        load_backbone(str(tmp_path / "nope.gguf"))
    with pytest.raises(ModelLoadError, match="empty model spec"):
        load_backbone("  ")


def test_truncated_gguf(tmp_path):
    src = alias_path("smollm2-135m")
    bad = tmp_path / "truncated.gguf"
    with open(src, "rb") as f:
        bad.write_bytes(f.read(2_000_000))
    with pytest.raises(ModelLoadError, match="truncated"):
        load_backbone(str(bad))


def test_unsupported_architecture(tmp_path):
    import gguf

    path = tmp_path / "phi.gguf"
    w = gguf.GGUFWriter(str(path), "phi3")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelLoadError, match="architecture 'phi3'.*not supported"):
        load_backbone(str(path))


def test_not_a_gguf(tmp_path):
    junk = tmp_path / "junk.gguf"
    shutil.copy(__file__, junk)
    with pytest.raises(ModelLoadError):
        load_backbone(str(junk))


def test_a_gguf_answer_does_not_import_transformers_and_mlx_lm_still_loads_on_demand(tmp_path):
    """`runtime._mlx_lm.defer`: the KV caches come from mlx-lm's submodules without its eager
    `__init__` (which imports transformers and torch: ~2.8 s of every `targ ask`), and a name of
    the package itself still loads it."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from targ_mlx.runtime.backbone import load_backbone\n"
        "from targ_mlx.runtime.draft import generate\n"
        "bb = load_backbone('smollm2-135m')\n"
        "toks, _, _ = generate(bb, bb.tokenizer.encode('The capital of France is'), 4)\n"
        "assert toks, 'no tokens'\n"
        "print('transformers' in sys.modules, 'torch' in sys.modules)\n"
        "from mlx_lm import load, stream_generate\n"
        "import mlx_lm\n"
        "print(callable(load), mlx_lm.__version__ != '')\n"
    )
    import os
    from pathlib import Path

    from targ_mlx.runtime import native

    # the kernels from where this process loaded them (built again they take a minute); the
    # repacked model in this test's own folder
    (tmp_path / "native").symlink_to(Path(native.module().__file__).parents[1], target_is_directory=True)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TARG_MLX_CACHE": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.split()
    assert lines[:2] == ["False", "False"], out.stdout
    assert lines[2:4] == ["True", "True"], out.stdout
