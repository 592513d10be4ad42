"""A bigger index by name: `simplewiki` (online) or a local corpus, built BM25-only into the user's
indexes folder, an unfinished build resumed; what the chat's `/index get NAME` runs.

BM25-only (`build --no-dense`) because it builds at reading speed: a general Wikipedia in minutes
on a laptop CPU, where encoding every passage would take hours (BENCHMARKS.md, rows "large BM25
index build" and "large dense index build").
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from targ_mlx.errors import TargError, check_text
from targ_mlx.index.corpus import ONLINE_ALIASES, read_corpus
from targ_mlx.index.errors import CorpusError
from targ_mlx.index.stages import DEFAULT_COMMIT_EVERY

ENV_INDEXES = "TARG_MLX_INDEXES"  # where `/index get` builds (default: <user data>/indexes)
# what each online name is, for the chat's lines
NAMED = {"simplewiki": "Simple English Wikipedia", "enwiki": "English Wikipedia"}
_COMPRESSED = (".bz2", ".gz", ".xz")
_EXTENSIONS = (".jsonl", ".ndjson", ".xml", ".parquet")

Progress = Callable[[int, int], None]


class BuildStopped(Exception):
    """Raised from a progress callback to stop a build after its last commit (it resumes later)."""


@dataclass(frozen=True)
class Target:
    name: str  # what was asked for: "simplewiki" or a path
    corpus: str  # the corpus spec read (`corpus.read_corpus`)
    out: Path  # the index folder
    online: bool  # read from the Hugging Face Hub

    @property
    def title(self) -> str:
        return NAMED.get(self.name, self.out.name)


# What an online name costs, said before the build starts. Chunks: Simple English at the offline
# slice's 1.13 chunks per article of its dump (223,150 of 197,146) times the config's ~240k articles;
# English Wikipedia's 6.4M articles as the ~15-25M ~1,000-character chunks that DPR's 21M 100-word
# passages imply. Disk and time from the large corpus (BENCHMARKS.md, rows "large BM25 index
# build" and "lexical index rebuilt in place"): passages.db 1.0 KB and the Tantivy part 0.16 KB a
# chunk, rounded up; its 994,419 chunks read, chunked and stored in ~218 s and indexed in 150 s at
# load ~8 (~2,700 chunks/s), taken as 2,000 for slower machines. The download is not counted.
CHUNKS = {"simplewiki": 270_000, "enwiki": 20_000_000}
DISK_BYTES_PER_CHUNK = 1_300
CHUNKS_PER_S = 2_000


def offline_line(name: str) -> str:
    return (f"/index get {name} downloads {NAMED.get(name, name)}: it needs a network (its parquet files stream "
            "from the Hugging Face Hub); or give a local file: /index get PATH (.jsonl, .xml.bz2, .parquet, "
            "WikiExtractor output or a folder of documents)")


def cost_line(name: str) -> str:
    """What building an online name will take, or "" for a local corpus (its size is not known
    before it is read)."""
    chunks = CHUNKS.get(name)
    if chunks is None:
        return ""
    hours = chunks / CHUNKS_PER_S / 3600
    took = f"~{hours:.0f} h" if hours >= 1.5 else f"~{max(1, round(hours * 60))} min"
    gb = chunks * DISK_BYTES_PER_CHUNK / 1e9
    disk = f"~{gb:.0f} GB" if gb >= 10 else f"~{gb:.1f} GB"
    return (f"about {chunks / 1e6:.1f}M chunks: {disk} of disk and {took} "
            "on 2 cores plus the download; it resumes where it stopped")


def indexes_dir() -> Path:
    """$TARG_MLX_INDEXES, else the user data dir's `indexes` folder (platformdirs)."""
    if os.environ.get(ENV_INDEXES):
        return Path(os.environ[ENV_INDEXES]).expanduser()
    import platformdirs

    return platformdirs.user_data_path("targ-mlx") / "indexes"


def _folder_name(spec: str) -> str:
    """'simplewiki' -> 'simplewiki'; '~/data/pool.jsonl.xz' -> 'pool'; 'hf:a/b:cfg' -> 'b-cfg'."""
    if spec.startswith("hf:"):
        _, name, *config = spec.split(":", 2)
        stem = "-".join([name.rsplit("/", 1)[-1], *config])
    else:
        stem = Path(spec.partition("?")[0].rstrip("/")).name
        for suffixes in (_COMPRESSED, _EXTENSIONS):
            stem = next((stem[: -len(s)] for s in suffixes if stem.lower().endswith(s)), stem)
    return re.sub(r"[^\w.-]+", "-", stem).strip("-.") or "corpus"


def target_folder(name: str, folder: Path | None = None) -> Path:
    """The index folder `/index get name` builds (nothing is checked or read)."""
    return (folder or indexes_dir()) / _folder_name(name)


def target(name: str, folder: Path | None = None) -> Target:
    """What `/index get name` would build, checked now (one line saying what is wrong, and the fix).

    Args:
        name: an online name (`simplewiki`, `enwiki`, `hf:wikimedia/wikipedia:CONFIG`) or a local
            corpus path (anything `corpus.read_corpus` reads).
        folder: where the index folder goes (default `indexes_dir()`).
    """
    name = check_text(name.strip(), f"/index get {name!r}")
    online = name in ONLINE_ALIASES or name.startswith("hf:")
    if online:
        spec = name
        if importlib.util.find_spec("huggingface_hub") is None or importlib.util.find_spec("pyarrow") is None:
            raise CorpusError(offline_line(name))
    else:
        path, q, query = name.partition("?")
        spec = str(Path(path).expanduser()) + q + query
        if not Path(spec.partition("?")[0]).exists():
            raise CorpusError(f"/index get {name}: no such file or folder; fix: /index get simplewiki (online), "
                              "or the path of a local corpus (.jsonl, .xml.bz2, .parquet, WikiExtractor output "
                              "or a folder of documents)")
        read_corpus(spec)  # an unknown format fails here, before any work
    return Target(name, spec, target_folder(name, folder), online)


def get_index(t: Target, progress: Progress | None = None, commit_every: int = DEFAULT_COMMIT_EVERY) -> Path:
    """Build `t` BM25-only into `t.out` (resuming the unfinished build there; at once if built).

    A download that fails (no network, the Hub unreachable) is one CorpusError line; what was
    committed before stays in OUT.partial and the next call goes on from there.
    """
    from targ_mlx.index.build import build_index

    t.out.parent.mkdir(parents=True, exist_ok=True)
    try:
        return build_index([t.corpus], t.out, dense=False, progress=progress, commit_every=commit_every)
    except (TargError, BuildStopped):
        raise
    except Exception as e:
        if not t.online:
            raise
        why = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise CorpusError(f"{offline_line(t.name)} ({type(e).__name__}{': ' + why[:160] if why else ''})") from None
