"""Named errors of the index package; each message is one line naming the value and the fix."""

from __future__ import annotations

from targ_mlx.errors import TargError


class IndexError_(TargError):
    """Base of every error raised by `targ_mlx.index` (trailing _ avoids the builtin IndexError)."""


class IndexMissingError(IndexError_):
    """The index folder or one of its files is not there."""


class IndexCorruptError(IndexError_):
    """A file is truncated, unreadable or fails its checksum."""


class IndexMismatchError(IndexError_):
    """The index was built with other settings (encoder, dims, corpus) than the caller's."""


class CorpusError(IndexError_):
    """A corpus spec or file cannot be read."""


class IndexLockedError(IndexError_):
    """Another process (or thread) is building or updating the same index folder."""


class IndexWriteError(IndexError_):
    """The index folder, its .partial or its lock file cannot be written (read-only, disk full)."""
