"""The import graph of targ_mlx and tui: no circles (lazy imports inside functions included),
the CPU kernels package stands alone, and the core never reaches up to the TUI or the CLIs."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENTRY_POINTS = {"targ_mlx.cli", "targ_mlx.calibration.cli", "targ_mlx.calibration.__main__", "targ_mlx.__main__",
                "targ_mlx.eval.__main__", "targ_mlx.index.__main__", "targ_mlx.runtime.native.__main__",
                "targ_mlx.server.__main__", "tui.__main__"}
CONSOLE_SCRIPT_HOLDERS = {"targ_mlx.eval"}  # its __init__ holds `targ-eval`, a lazy call of __main__


def _module(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    files = {_module(p): p for pkg in ("targ_mlx", "tui") for p in (REPO / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                if name in files and name != mod:
                    graph[mod].add(name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def _parents(mod: str) -> set[str]:
    parts = mod.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def test_no_import_circles():
    graph = import_graph()
    # a package's __init__ importing its submodules is not a circle of concepts
    flat = {m: {d for d in deps if d not in _parents(m)} for m, deps in graph.items()}
    assert cycles(flat) == []


def test_retrieval_does_not_import_the_index():
    assert not {d for d in import_graph()["targ_mlx.retrieval"] if d.startswith("targ_mlx.index")}


def test_native_imports_nothing_else_from_targ_mlx():
    graph = import_graph()
    for mod, deps in graph.items():
        if mod.startswith("targ_mlx.runtime.native") and mod != "targ_mlx.runtime.native.__main__":
            assert {d for d in deps if not d.startswith("targ_mlx.runtime.native")} == set(), mod


def test_the_core_never_imports_the_tui_or_an_entry_point():
    graph = import_graph()
    for mod, deps in graph.items():
        if mod.startswith("targ_mlx") and mod not in ENTRY_POINTS | CONSOLE_SCRIPT_HOLDERS:
            assert {d for d in deps if d.startswith("tui") or d in ENTRY_POINTS} == set(), mod
    for mod, deps in graph.items():
        if mod.startswith("tui") and mod != "tui.__main__":
            assert {d for d in deps if d in ENTRY_POINTS} == set(), mod


# Lowest first; a module imports only from its own layer or below. Prefix match, longest wins.
LAYERS = (
    ("targ_mlx", "targ_mlx._blas", "targ_mlx.defaults", "targ_mlx.errors", "targ_mlx.records",
     "targ_mlx.retrieval", "targ_mlx.calibration", "targ_mlx.runtime.native", "targ_mlx.eval.metrics",
     "targ_mlx.probes"),
    ("targ_mlx.gates",),  # pure: imports defaults only, so the config and the log read its registry
    ("targ_mlx.settings",),  # the answer fields: the config file is checked against them
    ("targ_mlx.config", "targ_mlx.log.store", "targ_mlx.runtime.model_files", "targ_mlx.runtime.model_spec",
     "targ_mlx.prompts", "targ_mlx.runtime.tokenizer", "targ_mlx.runtime.gguf", "targ_mlx.runtime.repack", "targ_mlx.index"),
    ("targ_mlx.log.transcript", "targ_mlx.runtime.sampling", "targ_mlx.runtime.engine"),
    ("targ_mlx.flags",),
    ("targ_mlx.log.decisions", "targ_mlx.runtime.backbone"),
    ("targ_mlx.runtime.draft", "targ_mlx.runtime.batch", "targ_mlx.calibration.rows", "targ_mlx.conversation",
     "targ_mlx.calibration.refit", "targ_mlx.rerank"),
    ("targ_mlx.pipeline",),
    ("targ_mlx.runner",),
    ("targ_mlx.session",),
    ("targ_mlx.assistant", "targ_mlx.eval", "targ_mlx.server", "targ_mlx.calibration.evidence"),
    ("targ_mlx.cli", "targ_mlx.calibration.cli", "targ_mlx.calibration.fit", "targ_mlx.calibration.__main__",
     "targ_mlx.__main__", "targ_mlx.eval.__main__", "targ_mlx.index.__main__",
     "targ_mlx.runtime.native.__main__", "targ_mlx.server.__main__", "tui"),
)


def test_the_runtime_knows_nothing_of_the_targ_core():
    """The model runtime (targ_mlx.runtime) never imports gates, retrieval, prompts or the runner."""
    core = ("targ_mlx.gates", "targ_mlx.retrieval", "targ_mlx.prompts", "targ_mlx.runner", "targ_mlx.pipeline",
            "targ_mlx.assistant", "targ_mlx.index", "targ_mlx.eval")
    graph = import_graph()
    for mod, deps in graph.items():
        if mod.startswith("targ_mlx.runtime"):
            assert {d for d in deps if d.startswith(core)} == set(), mod


def layer_of(mod: str) -> int:
    best, level = -1, None
    for i, names in enumerate(LAYERS):
        for name in names:
            if (mod == name or mod.startswith(name + ".")) and len(name) > best:
                best, level = len(name), i
    assert level is not None, f"{mod} has no layer in LAYERS"
    return level


def test_no_import_from_a_lower_layer_back_up():
    graph = import_graph()
    up = [(m, d) for m, deps in graph.items() for d in deps
          if d not in _parents(m) and m not in CONSOLE_SCRIPT_HOLDERS and layer_of(d) > layer_of(m)]
    assert up == []


# The faces parse, call the session and render: they import the session and the shared vocabulary
# (records, errors, defaults, gate names) only, never the runtime, the index, the log or the runner.
FACE_VOCABULARY = ("targ_mlx", "targ_mlx.session", "targ_mlx.errors", "targ_mlx.records", "targ_mlx.defaults",
                   "targ_mlx.gates")


def _imports(source: str, modules: set[str]) -> set[str]:
    """The targ_mlx modules `source` imports: `from P import X` counts as importing P.X where that is
    one of `modules` (a submodule), else P, so `from targ_mlx import runner` is targ_mlx.runner."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                      for a in node.names}
    return {m for m in found if m.startswith("targ_mlx")}


def _face_violations(imported: set[str], own: tuple[str, ...]) -> set[str]:
    """What a face imports beyond the vocabulary, the session's and gates' modules and its `own`."""
    allowed = FACE_VOCABULARY + own
    return {m for m in imported if m not in allowed and not m.startswith(tuple(a + "." for a in allowed[1:]))}


def _faces() -> dict[Path, tuple[str, ...]]:
    """Each face's files and what else it may import (its own package)."""
    faces = {p: () for p in (REPO / "tui").rglob("*.py")}
    faces[REPO / "targ_mlx" / "cli.py"] = ("targ_mlx.server",)
    faces |= {p: ("targ_mlx.server",) for p in (REPO / "targ_mlx" / "server").rglob("*.py")}
    faces[REPO / "targ_mlx" / "eval" / "__main__.py"] = ("targ_mlx.eval", "targ_mlx.retrieval")
    return faces


def test_the_faces_import_only_the_session_and_the_vocabulary():
    modules = set(import_graph())
    bad = {}
    for path, own in _faces().items():
        extra = _face_violations(_imports(path.read_text(encoding="utf-8"), modules), own)
        if extra:
            bad[str(path.relative_to(REPO))] = sorted(extra)
    assert bad == {}


def test_the_face_rule_sees_a_submodule_imported_from_its_package():
    """`from targ_mlx import runner` imports targ_mlx.runner, not the package's vocabulary; a name
    the package itself defines (bind_openblas) is the package."""
    modules = set(import_graph())
    assert "targ_mlx.runner" in modules and "targ_mlx.bind_openblas" not in modules
    source = "from targ_mlx import bind_openblas, runner\nfrom targ_mlx.runtime import backbone\n"
    assert _imports(source, modules) == {"targ_mlx", "targ_mlx.runner", "targ_mlx.runtime.backbone"}
    assert _face_violations(_imports(source, modules), ()) == {"targ_mlx.runner", "targ_mlx.runtime.backbone"}
    assert _face_violations(_imports("from targ_mlx import bind_openblas, errors\n", modules), ()) == set()


def test_the_chat_app_imports_at_most_six_targ_mlx_names():
    lines = set()
    for path in (REPO / "tui").rglob("*.py"):
        for line in path.read_text(encoding="utf-8").splitlines():
            m = re.match(r"^\s*(from|import) targ_mlx[a-zA-Z_.]*", line)
            if m:
                lines.add(m.group())
    assert len(lines) <= 6, sorted(lines)


def test_no_face_probes_a_retriever_with_getattr():
    """What faces know of an index is `targ_mlx.index.describe`'s (the session's `index`)."""
    hits = []
    for path in [*(REPO / "tui").rglob("*.py"), *(REPO / "targ_mlx").rglob("*.py")]:
        if "index" in path.relative_to(REPO).parts[:2]:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"getattr\((self\.)?_?retriever\b|getattr\(current\b", line):
                hits.append(f"{path.relative_to(REPO)}:{n}")
    assert hits == []


def test_the_session_door_names_for_static_tools_what_it_loads_at_run_time():
    """targ_mlx.session hands its names out lazily (`_WHERE`) and names them again under
    TYPE_CHECKING for type checkers and farm-studio: a name in one list and not the other would be
    a name static tools cannot follow, or one the door does not hand out; each must load."""
    import importlib

    import targ_mlx.session as door

    tree = ast.parse((REPO / "targ_mlx" / "session" / "__init__.py").read_text(encoding="utf-8"))
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    static = {a.asname or a.name for n in block.body if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    assert static == set(door._WHERE)
    for name in door._WHERE:
        assert getattr(door, name) is not None
    assert importlib.import_module("targ_mlx.index.named") is door.named_index
