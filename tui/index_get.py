"""`/index get NAME`: a bigger index built in the background while the chat goes on, then searched
beside the open ones; and the chat's offer of it when the gate finds no good source.

A mixin of `ChatApp`. The build is `Session.get_index` (BM25-only, resumed from OUT.partial when an
earlier one was stopped) in a thread worker; one line in the chat shows its progress and then
what is searched. Quitting the app cancels the worker, and the next progress callback stops the
build after its last commit, so `/index get NAME` again goes on from there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from textual import work
from textual.worker import get_current_worker

from targ_mlx.defaults import BIGGER_INDEX_OFFER
from targ_mlx.session import named_index as named
from tui import commands
from tui.messages import GetDone, GetProgress
from tui.widgets import ChatLog, DecisionPanel, MessageView


@dataclass
class _Run:
    target: named.Target
    view: MessageView  # the chat line that shows how far it is
    started: float = field(default_factory=time.monotonic)
    first: int | None = None  # chunks already committed when this run began (a resumed build)
    since: float = 0.0  # when the first progress report came (the rate counts from there)
    shown: str = ""  # the latest progress line, kept under the final line


class IndexGet:
    _getting: _Run | None = None
    _offered = False

    def start_get(self, name: str) -> None:
        """Check NAME now (one line if it cannot be got), then build it in a worker."""
        if self.assistant is None:
            raise commands.CommandError("the model is still loading; try again in a moment")
        if self._getting is not None:
            raise commands.CommandError(f"{self._getting.target.title} is still building (its line in the chat "
                                        "shows how far); one /index get at a time")
        t = named.target(name)
        cost = named.cost_line(t.name)
        view = self.query_one(ChatLog).add("system", f"building {t.title} into {t.out} (BM25 only, in the "
                                                     f"background{'; ' + cost if cost else ''}); ask meanwhile")
        self._getting = _Run(t, view)
        self.build_bigger_index(t)

    @work(thread=True, group="index-get")
    def build_bigger_index(self, t: named.Target) -> None:
        worker = get_current_worker()

        def progress(done: int, total: int) -> None:
            if worker.is_cancelled:  # the app is quitting: stop after the last commit
                raise named.BuildStopped
            self.post_message(GetProgress(done, total))

        try:
            opened = self.assistant.get_index(t.name, progress, t.out.parent)
        except Exception as e:  # one line in the chat; the chat goes on with the indexes it had
            self.post_message(GetDone(error=e))
            return
        self.post_message(GetDone(opened))

    def on_get_progress(self, event: GetProgress) -> None:
        run = self._getting
        if run is None:
            return
        now = time.monotonic()
        if run.first is None:
            run.first, run.since = event.done, now
        run.shown = commands.build_progress(run.target.title, event.done, event.total, run.first, now - run.since)
        run.view.set_text(run.shown)

    def on_get_done(self, event: GetDone) -> None:
        run, self._getting = self._getting, None
        if run is None:
            return
        t = run.target
        if isinstance(event.error, named.BuildStopped):
            run.view.set_text(f"stopped building {t.title}; /index get {t.name} goes on from where it stopped",
                              note=run.shown)
        elif event.error is not None:
            run.view.set_text(f"could not get {t.title}: {event.error}", note=run.shown)
            self.notify(f"could not get {t.title}: {event.error}", severity="error", timeout=10)
        else:
            opened = self.assistant.index
            self.index_label = " + ".join(p.name for p in opened.paths)
            took = commands.duration(time.monotonic() - run.started)
            run.view.set_text(f"{t.title} is ready ({took}, {t.out}): questions now search "
                              f"{self.index_label} together ({opened.size:,} passages, {opened.mode})",
                              note=run.shown)
            self.notify(f"{t.title} ready: searching {self.index_label}")
            if self._bigger_open():
                self.query_one(DecisionPanel).hint = ""  # nothing bigger to offer
        self._status()

    def offer_bigger_index(self) -> None:
        """Once per run, after an answer with no good source: say how to get a bigger index."""
        if self._offered or self._getting is not None or self.assistant is None:
            return
        if self._bigger_open():
            return
        self._offered = True
        self.query_one(ChatLog).add("system", BIGGER_INDEX_OFFER)

    def _bigger_open(self) -> bool:
        """Whether the index `/index get simplewiki` builds is among those searched."""
        built = named.target_folder("simplewiki")
        return any(p == built for p in self.assistant.index.paths)
