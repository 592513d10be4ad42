"""The mlx-lm path (`mlx_lm.load` of a local MLX folder), exercised offline by writing the
offline default model out as an MLX folder and checking it decodes the same tokens."""

import importlib.util
import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten
from mlx_lm.utils import dequantize_model

from targ_mlx import prompts
from targ_mlx.runtime.backbone import Backbone, alias_path, load_backbone
from targ_mlx.runtime.draft import draft
from targ_mlx.errors import ModelLoadError

_spec = importlib.util.spec_from_file_location(
    "gguf_to_mlx", Path(__file__).parents[1] / "scripts" / "tools" / "gguf_to_mlx.py")
gguf_to_mlx = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gguf_to_mlx)


@pytest.fixture(scope="module")
def mlx_folder(tmp_path_factory, backbone):
    out = tmp_path_factory.mktemp("smollm2-mlx")
    weights = dict(tree_flatten(backbone.model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    args = {k: v for k, v in vars(backbone.model.args).items() if v is not None}
    # The GGUF's quantization as mlx-lm records it: a default plus per-layer exceptions
    # (the embedding is 8-bit, the layers 4-bit), as in mlx-community's mixed-precision repos.
    quant = {}
    for name, m in backbone.model.named_modules():
        if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            quant[name] = {"group_size": m.group_size, "bits": m.bits}
    if quant:
        args["quantization"] = {"group_size": 32, "bits": 4, **{k: v for k, v in quant.items() if v["bits"] != 4}}
    (out / "config.json").write_text(json.dumps(args))
    gguf_to_mlx.write_tokenizer(backbone.tokenizer, out)
    return out


def test_mlx_folder_decodes_like_the_gguf(mlx_folder, backbone):
    bb = load_backbone(str(mlx_folder))
    assert bb.dtype == "mlx" and bb.model_id == mlx_folder.name  # the stable key, not the path
    assert bb.engine.name == backbone.engine.name  # a quantized MLX folder runs on the same kernels
    msgs = prompts.messages("What is the capital of France?")
    ids = bb.tokenizer.chat_ids(msgs)
    assert ids == backbone.tokenizer.chat_ids(msgs)
    assert draft(bb, ids, 8).tokens == draft(backbone, ids, 8).tokens


def test_mlx_convert_q_folder_runs_on_the_kernels(tmp_path, backbone):
    """What mlx-community publishes: `mlx_lm.convert -q` output (4 bits, groups of 64)."""
    out = gguf_to_mlx.convert(alias_path("smollm2-135m"), tmp_path / "smollm2-4bit")
    assert json.loads((out / "config.json").read_text())["quantization"]["group_size"] == 64
    bb, ref = load_backbone(str(out)), load_backbone(str(out), kernels=False)
    assert bb.engine.name == backbone.engine.name and ref.engine.name == "mlx"
    # mlx-lm's layers with the folder's 4-bit weights dequantized exactly: what its quantized
    # layers compute, without MLX's CPU quantized matmul (3 minutes for this draft)
    dense = Backbone(model=dequantize_model(ref.model), tokenizer=ref.tokenizer, model_id=ref.model_id,
                     context_length=ref.context_length, dtype="float32")
    ids = bb.tokenizer.chat_ids(prompts.messages("What is the capital of France?"))
    # the kernels differ from mlx-lm's layers only by int8 activations
    assert draft(bb, ids, 4).tokens == draft(dense, ids, 4).tokens


def test_unreachable_repo_id_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="cannot load mlx-lm model 'mlx-community/no-such-model-4bit'"):
        load_backbone("mlx-community/no-such-model-4bit")
