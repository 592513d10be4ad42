"""The on-disk layout of an index folder, its manifest, and the checks run before serving it.

    DIR/vectors.usearch   HNSW graph + vectors (inner product on normalised vectors)
    DIR/passages.db       SQLite: passages(key -> title, text, article, source, start, end)
    DIR/manifest.json     encoder, dims, dtype, metric, HNSW params, corpora and counts,
                          chunking params, build time, file sizes and checksums
A build writes into DIR.partial/ and renames it to DIR when done, so DIR is always complete.
Building is `build.py`'s job, searching `retriever.py`'s.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from dataclasses import asdict, dataclass
from pathlib import Path

from targ_mlx.index.errors import IndexCorruptError, IndexMissingError, IndexWriteError

VECTORS = "vectors.usearch"
PASSAGES = "passages.db"
MANIFEST = "manifest.json"
BUILD_STATE = "build.json"  # only inside DIR.partial: the arguments a resumed build must match
FORMAT_VERSION = 1
DTYPES = ("f16", "i8", "f32")
METRIC = "ip"
_SAMPLE = 1 << 20  # bytes hashed from each end of a file for the quick check at open


@dataclass(frozen=True)
class HnswParams:
    connectivity: int = 16  # graph degree M: memory and recall grow with it
    expansion_add: int = 128  # efConstruction: build time vs graph quality
    # ef at query time: recall@5 vs exact on MiniLM + vital-articles is 0.964 at 64, 0.989 at 128,
    # 0.997 at 256 (docs/archive/benchmarks-journal.md, "Index"); a serving setting, so changing it
    # never forces a rebuild
    expansion_search: int = 256


def partial_dir(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


def rebuild_command(build: dict, out: Path) -> str:
    """The CLI line that (re)builds an index with the recorded arguments."""
    parts = ["python", "-m", "targ_mlx.index", "build", "--corpus", *build["corpora"], "--out", str(out)]
    parts += ["--encoder", build["encoder"], "--backend", build.get("backend", "torch"), "--dtype", build["dtype"]]
    if build.get("limit"):
        parts += ["--limit", str(build["limit"])]
    if build.get("dense") is False:
        parts += ["--no-dense"]
    if build.get("shard_size"):
        parts += ["--ray", "--shard-size", str(build["shard_size"])]
    return shlex.join(parts)


def sample_checksum(path: Path) -> str:
    """sha256 over the size and the first and last MiB: O(1), catches truncation and most damage."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(_SAMPLE))
        if size > _SAMPLE:
            f.seek(max(_SAMPLE, size - _SAMPLE))
            h.update(f.read(_SAMPLE))
    return h.hexdigest()


def full_checksum(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 << 20):
            h.update(block)
    return h.hexdigest()


def describe_files(folder: Path, names: tuple[str, ...] = (VECTORS, PASSAGES)) -> dict:
    return {
        name: {
            "bytes": (folder / name).stat().st_size,
            "sha256": full_checksum(folder / name),
            "sample_sha256": sample_checksum(folder / name),
        }
        for name in names
    }


def manifest_id(manifest: dict) -> str:
    """Short stable hash naming this exact index (what the decision log records)."""
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:12]


def write_json_atomic(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_graph(index, path: Path) -> None:
    """Save a usearch graph via a temporary file, so `path` is whole or absent."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        index.save(str(tmp))
    except RuntimeError as e:  # usearch reports a failed write (full disk) only as "Failed to serialize"
        raise IndexWriteError(f"cannot write {tmp} ({e}); fix: free disk space, then rerun the same "
                              "command to resume") from None
    os.replace(tmp, path)


def read_manifest(path: Path) -> dict:
    """Load DIR/manifest.json, raising IndexMissingError / IndexCorruptError with the fix."""
    path = Path(path)
    try:
        text = (path / MANIFEST).read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        text = None  # also a publish renaming DIR between a check and the read: a reader retries
    if text is None:
        if partial_dir(path).exists():
            raise IndexMissingError(
                f"the index build into {path} is unfinished ({partial_dir(path).name} exists); "
                "fix: run the same build command again to resume it"
            )
        raise IndexMissingError(
            f"no index at {path} ({MANIFEST} not found); fix: python -m targ_mlx.index build "
            f"--corpus vital-articles --out {shlex.quote(str(path))}"
        )
    try:
        manifest = json.loads(text)
        manifest["encoder"]["name"], manifest["build"]["corpora"], manifest["files"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise IndexCorruptError(f"{path / MANIFEST} is unreadable ({e}); fix: rebuild the index") from None
    return manifest


def verify_files(path: Path, manifest: dict, full: bool = False) -> None:
    """Check each file's presence, size and checksum (sampled, or whole-file when `full`)."""
    fix = f"fix: delete {path} and rebuild: {rebuild_command(manifest['build'], path)}"
    for name, want in manifest["files"].items():
        file = path / name
        try:
            size = file.stat().st_size
            if size != want["bytes"]:
                raise IndexCorruptError(
                    f"{file} is {size} bytes but the manifest says {want['bytes']} (truncated or replaced); {fix}"
                )
            got = full_checksum(file) if full else sample_checksum(file)
        except FileNotFoundError:  # also when a publish renames the folder between two of these steps
            raise IndexMissingError(f"{file} is missing; {fix}") from None
        if got != want["sha256" if full else "sample_sha256"]:
            raise IndexCorruptError(f"{file} fails its sha256 checksum (corrupted); {fix}")


@dataclass(frozen=True)
class IndexInfo:
    """What `info DIR` prints."""

    path: str
    manifest_id: str
    encoder: str
    dims: int
    dtype: str
    passages: int
    articles: int
    corpora: list
    bytes: int
    shards: int  # 1 for a single-process build; a Ray build's shards are searched together

    @classmethod
    def of(cls, path: Path, manifest: dict) -> "IndexInfo":
        return cls(
            str(path),
            manifest_id(manifest),
            manifest["encoder"]["name"],
            manifest["encoder"]["dims"],
            manifest["dtype"],
            manifest["counts"]["passages"],
            manifest["counts"]["articles"],
            manifest["build"]["corpora"],
            sum(f["bytes"] for f in manifest["files"].values()),
            len(manifest.get("shards", ())) or 1,
        )

    def to_dict(self) -> dict:
        return asdict(self)
