"""Widgets of the chat app: chat log, prompt, decision panel, sources panel, status bar."""

from tui.widgets.chat import ChatLog, MessageView
from tui.widgets.decision import DecisionInfo, DecisionPanel
from tui.widgets.prompt import PromptArea
from tui.widgets.sources import SourcesPanel
from tui.widgets.status import StatusBar

__all__ = ["ChatLog", "DecisionInfo", "DecisionPanel", "MessageView", "PromptArea", "SourcesPanel", "StatusBar"]
