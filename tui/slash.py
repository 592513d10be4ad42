"""The chat app's slash commands: each `/name value` runs `_cmd_name(value)`, mostly one call on
the `Session` (`configure`, `set_gate`, `budget`, `recalibrate`, `reload_model`, `open_index`).

A mixin of `ChatApp` (it uses the app's `assistant`, `decisions`, `notify` and workers); parsing,
completion and help text are in `commands.py`.
"""

from __future__ import annotations

from pathlib import Path

from textual import work

from targ_mlx.errors import TargError
from tui import commands
from tui.messages import LoadProgress
from tui.widgets import ChatLog


class SlashCommands:
    def run_command(self, text: str) -> None:
        try:
            cmd = commands.parse(text)
            getattr(self, f"_cmd_{cmd.name}")(cmd.value)
        except (commands.CommandError, TargError, ValueError) as e:
            self.notify(str(e), severity="error", timeout=8)
        self._status()

    def _settings(self, **changes) -> None:
        if self.assistant is None:
            raise commands.CommandError("the model is still loading; try again in a moment")
        self.assistant.configure(**changes)

    def _cmd_gate(self, gate: str) -> None:
        self._settings()  # refused while loading
        s = self.assistant.set_gate(gate)
        tau = s.tau if s.scored else None
        self.notify(f"gate {gate}" + (f", τ {tau:.3f}" if tau is not None else ""))

    def _cmd_tau(self, tau: float) -> None:
        self._settings(tau=tau)
        gate = self.assistant.settings.gate
        extra = f" (gate {gate} ignores τ)" if not self.assistant.settings.scored else ""
        self.notify(f"τ {tau:g}{extra}")

    def _cmd_budget(self, rho: float) -> None:
        self._settings()  # refused while loading
        tau = self.assistant.budget(rho)
        self.notify(f"τ {tau:.4f} for a retrieval budget of {rho:g}")

    def _cmd_k(self, k: int) -> None:
        self._settings(k=k)
        self.notify(f"draft length k = {k}")

    def _cmd_set(self, value: tuple | None) -> None:
        """`/set NAME VALUE` changes one answer setting (checked as `Settings` checks it); `/set`
        alone lists them. The gate goes through `/gate`, so its tau resolves for this model."""
        self._settings()  # refused while loading
        if value is None:
            s = self.assistant.settings
            self.notify(", ".join(f"{n} {getattr(s, n)!r}" for n in commands.flag_fields("chat")), timeout=15)
            return
        name, v = value
        if name == "gate":
            self._cmd_gate(v)
            return
        self._settings(**{name: v})
        self.notify(f"{name} = {getattr(self.assistant.settings, name)!r}")

    def _cmd_recalibrate(self, rho: float | None) -> None:
        self._settings()  # refused while loading
        tau, how, path = self.assistant.recalibrate(rho)
        self.config = self.assistant.config
        self.notify(f"τ {tau:.4f} ({how}); saved to {path}", timeout=10)

    def _cmd_model(self, spec: str) -> None:
        if self.generating or self.assistant is None:
            raise commands.CommandError("wait for the current answer or load to finish first")
        self.reload_model(spec)

    @work(thread=True, exclusive=True, group="load")
    def reload_model(self, spec: str) -> None:
        self.post_message(LoadProgress(f"loading model {spec}"))
        try:
            bb = self.assistant.reload_model(spec)
        except Exception as e:
            self.call_from_thread(self.notify, f"could not load {spec}: {e}", severity="error", timeout=10)
            self.call_from_thread(self._status)
            return
        self.call_from_thread(self.notify, f"model {bb.model_id} loaded")
        self.call_from_thread(self._status)

    def _cmd_index(self, arg: str) -> None:
        """`/index DIR` opens DIR instead; `/index add DIR` searches DIR beside the open indexes;
        `/index get NAME` builds a bigger index in the background first (`index_get.py`).
        Either is searched as the session searches (its retriever mode), an unfinished build of it
        resumed first, in a worker."""
        head, _, rest = arg.partition(" ")
        if head == "get":  # a build in the background: the chat goes on meanwhile
            self.start_get(rest.strip())
            return
        if self.generating or self.assistant is None:
            raise commands.CommandError("wait for the current answer or load to finish first")
        add = head == "add" and bool(rest.strip())
        self.open_index(rest.strip() if add else arg, add)

    @work(thread=True, exclusive=True, group="load")
    def open_index(self, folder: str, add: bool) -> None:
        def progress(done: int, total: int) -> None:
            self.post_message(LoadProgress(f"index {folder} building", done, total))

        try:
            self.assistant.open_index(folder, add=add, progress=progress)
        except Exception as e:
            self.call_from_thread(self.notify, f"could not open index {folder}: {e}", severity="error", timeout=10)
            self.call_from_thread(self._status)
            return
        opened = self.assistant.index
        self.index_label = " + ".join(p.name for p in opened.paths)
        self.call_from_thread(self.notify, f"index {' + '.join(map(str, opened.paths))} opened "
                                           f"({opened.size:,} passages, {opened.mode})")
        self.call_from_thread(self._status)

    def _cmd_export(self, target: str | None) -> None:
        if self.decisions is None:
            raise commands.CommandError("no decision log is open, so there is no transcript to export")
        turns = [(m.role, m.text, self.decisions.get(m.decision_id) if m.decision_id else None)
                 for m in self.decisions.messages(self.session)]
        path = Path(target or f"targ-chat-{self.session}.md").expanduser()
        path.write_text(commands.export_markdown(f"targ-chat {self.session}", turns), encoding="utf-8")
        self.notify(f"chat exported to {path}")

    def _cmd_new(self, _value) -> None:
        self.action_new_chat()

    def _cmd_help(self, _value) -> None:
        self.query_one(ChatLog).add("system", commands.help_text(commands.KEYS))
