"""`open_session(config, ...)`: the one place that loads the model, opens the index, the log and the
gate's settings for every front end (`targ ask`, `targ serve`, the chat app, the eval).

The index policy, once: the folders named, else the configured one, else the offline default
index; an unfinished build of any of them is resumed; `config.retriever` picks dense, bm25 or
hybrid; `index_when` says when it opens (on the first search, now, or now with a build
in the background while answers skip retrieval).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from targ_mlx.config import Config
from targ_mlx.errors import QuestionError, check_text
from targ_mlx.session.options import IndexWhen, resolve

# progress(stage, done=0, total=0): what a face shows while the session opens
Progress = Callable[..., None]


def open_session(config: Config, progress: Progress | None = None, *, log: bool = True, source: str = "ask",
                 chat: str | None = None, long_running: bool = False, index_when: IndexWhen = "lazy",
                 quiet: bool = False):
    """A ready `Session` for `config` (`options.config_from_args`, or `load_config().merged(...)`);
    bad values fail before the model loads.

    Args:
        log: write the decision log (and the chat's transcript); `source` names the face in it.
        chat: continue this saved chat (its turns go into every prompt).
        long_running: a chat, a server or an eval: the model's weights on 2 MB pages now.
        index_when: open the index on the first search (an answer from memory never loads it), now,
            or now with a missing or unfinished build resumed in the background.
        quiet: no progress bar while an index builds.

    The session's `index_label` names the index for a status line, and `notice` says what did not
    open as asked (e.g. "the index … is building: answers skip retrieval until it is ready").
    """
    from targ_mlx.log.decisions import DecisionLog
    from targ_mlx.runtime.backbone import load_backbone
    from targ_mlx.session.session import Session

    if chat is not None:
        check_text(chat, f"--chat {chat!r}")
        if not log:
            raise QuestionError("--chat continues a chat saved in the decision log; drop --no-log")
    say = progress or (lambda *a, **k: None)
    settings = resolve(config)  # fails before the model loads
    pages = "collapse" if long_running else "advise"  # a long run gains from 2 MB pages at once
    session = Session(None, None, settings, log=DecisionLog(config.db) if log else None, source=source,
                      config=config, config_path=config.path, retriever_mode=config.retriever, huge_pages=pages)
    if chat:
        session.resume_chat(chat)  # a missing chat is one line before the model loads
    if settings.rerank and settings.rerank != "llm":  # a CrossEncoder that cannot load: one line, before the model
        from targ_mlx import rerank

        say(f"loading reranker {settings.rerank}")
        rerank.load_reranker(settings.rerank)
    say(f"loading model {config.model}")
    session.backbone = load_backbone(config.model, huge_pages=pages)
    folders = [Path(f) for f in config.index]
    retriever, session.index_label, session.notice = _open_index(config.retriever, index_when, quiet, folders, say)
    session.attach_index(retriever)
    return session


def _label(paths) -> str:
    from targ_mlx import index

    return " + ".join(Path(p).name for p in paths) or index.DEFAULT_INDEX_NAME


def _open_index(mode: str | None, when: IndexWhen, quiet: bool, folders: list[Path], say: Progress):
    """(the retriever or its loader or None, its label, a notice) under the one policy."""
    from targ_mlx import index
    from targ_mlx.index.progress import ProgressBar

    def building(d: int, n: int) -> None:
        say(f"index building {100 * d / max(n, 1):.0f}%", d, n)

    def opened(paths):
        return index.load_encoders(index.open_indexes(paths, retriever=mode))

    if when == "lazy":  # an answer from memory never loads the index or its encoder
        from targ_mlx.flags import open_index

        return open_index([str(f) for f in folders], mode, quiet), _label(folders), ""
    if when == "eager":
        bar = None if quiet else ProgressBar()
        paths = [index.ensure_index(p, bar) for p in folders or [None]]
        return index.open_indexes(paths, retriever=mode), _label(paths), ""
    try:  # background: answer at once; questions the gate would search for skip it until it is built
        if (not folders and not (index.default_index_dir() / "manifest.json").is_file()) or any(
                map(index.unfinished, folders)):
            label = _label(folders)
            build = index.BuildingIndex(lambda cb: [index.ensure_index(p, cb) for p in folders or [None]],
                                        opened, building)
            return build, label, f"the index {label} is building: answers skip retrieval until it is ready"
        # built: a no-op, but an index built before BM25 parts existed gains one (seconds)
        paths = folders or [index.ensure_default_index()]
        say(f"opening index {_label(paths)} and its query encoder")
        return opened(paths), _label(paths), ""
    except Exception as e:  # answer without retrieval rather than not at all
        return None, "none", f"answering without retrieval: {e}"
