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


def offline_line(name: str) -> str:
    return (f"/index get {name} downloads {NAMED.get(name, name)}: it needs a network and the `datasets` package "
            "(pip install datasets); or give a local file: /index get PATH (.jsonl, .xml.bz2, .parquet, "
            "WikiExtractor output or a folder of documents)")


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
        if importlib.util.find_spec("datasets") is None:
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
