"""sqlite-utils without pandas: its `db` module imports pandas whenever pandas is installed (the
`eval` extra installs it), only to map `pandas.Timestamp` to TEXT, which nothing here ever
inserts. That import was 0.23 of the 0.28 s sqlite-utils took to load, paid by every `targ ask`
and chat start that opens the decision log. `load()` imports sqlite-utils with pandas hidden for
that one import (where pandas is not loaded yet); pandas imports as usual afterwards.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def load() -> ModuleType:
    if "sqlite_utils" not in sys.modules and "pandas" not in sys.modules and importlib.util.find_spec("pandas"):
        sys.modules["pandas"] = None  # type: ignore[assignment]  # `import pandas` raises ImportError
        try:
            import sqlite_utils  # noqa: F401
        except ImportError:  # a version that needs pandas after all: the plain import below
            sys.modules.pop("sqlite_utils", None)
        finally:
            del sys.modules["pandas"]
    import sqlite_utils

    return sqlite_utils
