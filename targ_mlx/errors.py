"""Named errors of the answer path. Each message is one line naming the value and the fix."""


class TargError(Exception):
    """Base class: the CLI prints `str(e)` on one line and exits non-zero."""


class ModelLoadError(TargError):
    """A model spec, file or package that cannot be loaded."""


class QuestionError(TargError, ValueError):
    """An empty question, or one that cannot fit the model's context window."""


def run_main(fn, args, interrupted: str = "interrupted") -> int:
    """Run a CLI body: our errors and bad values become one `error: ...` line and exit code 2."""
    import sys

    try:
        return fn(args)
    except (TargError, ValueError, FileNotFoundError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(interrupted, file=sys.stderr)
        return 130
