"""Named errors of the answer path, and the one CLI error handler every entry point uses.

Each message is one line naming the value and the fix.
"""

import re
import sys

EXIT_ERROR = 2  # bad input or a named error: the same code argparse gives a bad flag
EXIT_INTERRUPTED = 130
_BAD_TEXT = re.compile("[\x00\ud800-\udfff]")


class TargError(Exception):
    """Base class: the CLI prints `str(e)` on one line and exits non-zero."""


class ModelLoadError(TargError):
    """A model spec, file or package that cannot be loaded."""


class NoRetrieverError(TargError):
    """A question the gate would search or read for, with no index open."""

    def __init__(self, message: str = "this question needs retrieval but no index is open; pass --index DIR "
                                      "(or build one: python -m targ_mlx.index build)"):
        super().__init__(message)


class QuestionError(TargError, ValueError):
    """An empty question, or one that cannot fit the model's context window."""


class BadTextError(QuestionError):
    """Text no tokenizer or file system call can take: a lone surrogate or a NUL."""


def check_text(text: str, what: str = "question") -> str:
    """`text` unchanged, or `BadTextError` naming the first character the tokenizer cannot take.

    A lone surrogate (U+D800-U+DFFF) is what invalid UTF-8 becomes in a Python string (argv and
    file names decode with surrogateescape) and what a JSON escape like "\\ud800" decodes to; UTF-8
    cannot encode it, so the tokenizer fails deep inside with a TypeError. NUL ends C strings.
    """
    bad = _BAD_TEXT.search(text)
    if bad is not None:
        code, at = ord(bad.group()), bad.start() + 1
        if code == 0:
            raise BadTextError(f"{what} holds a NUL character (U+0000) at character {at}: remove it")
        raise BadTextError(f"{what} holds U+{code:04X} at character {at}, a lone surrogate (invalid UTF-8 "
                           "or a broken \\u escape): send valid UTF-8 text")
    return text


def run_cli(parser, fn, argv: list[str] | None = None, **kw) -> int:
    """An entry point's `main(argv)`: parse, set up logging, run `fn(args)` under `run_main`."""
    import logging

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return run_main(fn, args, **kw)


def run_main(fn, args, interrupted: str = "interrupted", errors: tuple[type[BaseException], ...] = ()) -> int:
    """Run a CLI body: our errors and bad values become one `error: ...` line and `EXIT_ERROR`.

    Args:
        fn: the body, `fn(args) -> int | None` (None means success).
        errors: further exception types to report the same way (e.g. a package's own base error).
    """
    try:
        return fn(args) or 0
    except (TargError, ValueError, FileNotFoundError, ImportError, *errors) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(interrupted, file=sys.stderr)
        return EXIT_INTERRUPTED
