"""The mlx-lm path (`mlx_lm.load` of a local MLX folder), exercised offline by writing the
offline default model out as an MLX folder and checking it decodes the same tokens."""

import json

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from targ_mlx import prompts
from targ_mlx.backbone import load_backbone
from targ_mlx.draft import draft
from targ_mlx.errors import ModelLoadError


@pytest.fixture(scope="module")
def mlx_folder(tmp_path_factory, backbone):
    out = tmp_path_factory.mktemp("smollm2-mlx")
    weights = dict(tree_flatten(backbone.model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    args = {k: v for k, v in vars(backbone.model.args).items() if v is not None}
    (out / "config.json").write_text(json.dumps(args))
    tok = backbone.tokenizer
    tok._tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": tok.bos, "eos_token": tok.eos,
        "chat_template": tok.template, "add_bos_token": False,
    }))
    return out


def test_mlx_folder_decodes_like_the_gguf(mlx_folder, backbone):
    bb = load_backbone(str(mlx_folder))
    assert bb.dtype == "mlx" and bb.model_id == str(mlx_folder)
    msgs = prompts.messages("What is the capital of France?")
    ids = bb.tokenizer.chat_ids(msgs)
    assert ids == backbone.tokenizer.chat_ids(msgs)
    assert draft(bb, ids, 8).tokens == draft(backbone, ids, 8).tokens


def test_unreachable_repo_id_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="cannot load mlx-lm model 'mlx-community/no-such-model-4bit'"):
        load_backbone("mlx-community/no-such-model-4bit")
