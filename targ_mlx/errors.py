"""Named errors of the answer path. Each message is one line naming the value and the fix."""


class TargError(Exception):
    """Base class: the CLI prints `str(e)` on one line and exits non-zero."""


class ModelLoadError(TargError):
    """A model spec, file or package that cannot be loaded."""


class QuestionError(TargError, ValueError):
    """An empty question, or one that cannot fit the model's context window."""
