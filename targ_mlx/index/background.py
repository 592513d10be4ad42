"""An index that is still being built: the app answers meanwhile, without retrieval.

`BuildingIndex` runs a build (e.g. `ensure_default_index`) in a daemon thread and serves as the
`Retriever` once the index opens. Until then `ready` is False and `status` says how far the build
is ("index building 43%"); the assistant checks `ready` and answers a question it would retrieve
for without retrieval, noting that status.
"""

from __future__ import annotations

import threading
from typing import Callable, Sequence

from targ_mlx.index.errors import IndexMissingError
from targ_mlx.retrieval import Passage

Progress = Callable[[int, int], None]


class BuildingIndex:
    """A `Retriever` whose index is built in the background; searchable once `ready`."""

    def __init__(self, build: Callable[[Progress], object], open_index: Callable[[object], object],
                 progress: Progress | None = None):
        """Args:
        build: builds (or resumes) the index, calling progress(done, total); returns what
            `open_index` takes (e.g. its folder).
        open_index: opens the built index as a retriever (and may load its query encoder).
        progress: also told of the build's progress (e.g. the app's status bar).
        """
        self.done = self.total = 0
        self.error: Exception | None = None
        self._retriever = None
        self._on_progress = progress
        self._finished = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(build, open_index), daemon=True,
                                        name="index-build")
        self._thread.start()

    def _progress(self, done: int, total: int) -> None:
        self.done, self.total = done, total
        if self._on_progress:
            self._on_progress(done, total)

    def _run(self, build, open_index) -> None:
        try:
            self._retriever = open_index(build(self._progress))
        except Exception as e:  # reported by `status` and by a search; the app keeps answering
            self.error = e
        finally:
            self._finished.set()

    @property
    def ready(self) -> bool:
        return self._retriever is not None

    @property
    def status(self) -> str:
        """"" when ready, else why retrieval is unavailable: "index building 43%" or the error."""
        if self.ready:
            return ""
        if self.error is not None:
            return f"index build failed: {self.error}"
        return f"index building {100 * self.done / self.total:.0f}%" if self.total else "index building"

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the build ends (or `timeout` s); True when the index is ready."""
        self._finished.wait(timeout)
        return self.ready

    @property
    def manifest_id(self) -> str | None:
        return getattr(self._retriever, "manifest_id", None)

    def __len__(self) -> int:
        return len(self._retriever) if self.ready else 0

    def _ready(self):
        if not self.ready:
            raise IndexMissingError(f"{self.status}; fix: wait for the build to finish")
        return self._retriever

    def search(self, query: str, k: int = 5) -> list[Passage]:
        return self._ready().search(query, k)

    def search_batch(self, queries: Sequence[str], k: int = 5) -> list[list[Passage]]:
        return self._ready().search_batch(queries, k)
