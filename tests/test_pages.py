"""The kernels' weights on 2 MB pages (targ_mlx/runtime/native/pages.py): which memory is asked
for, that the OS really moves the weights there, and that the model computes the same bits."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest

from targ_mlx.runtime.native import pages

MB = 1 << 20
REPO = Path(__file__).resolve().parents[1]
SKIP = 77  # the exit status of a skipped check (as automake's tests use it)


def test_spans_merge_neighbours_and_keep_whole_huge_pages_inside():
    base = 64 * pages.HUGE
    ranges = [
        (base + 16, base + 3 * MB),  # an allocator header in front of the first array
        (base + 3 * MB + 4096 + 16, base + 9 * MB + 5),  # the next mapping: one run with the first
        (base + 40 * MB, base + 41 * MB),  # alone and under 2 MB: no whole page inside
    ]
    assert pages.spans(ranges) == [(base + pages.HUGE, base + 8 * MB)]
    assert pages.spans([]) == []


def test_an_unknown_mode_names_the_choices():
    from targ_mlx.errors import ModelLoadError
    from targ_mlx.runtime.backbone import load_backbone

    with pytest.raises(ValueError, match=r"'huge'.*advise, collapse, off"):
        pages.huge_pages([], "huge")
    with pytest.raises(ModelLoadError, match=r"huge_pages='big': use one of advise, collapse, off"):
        load_backbone("smollm2-135m", huge_pages="big")


def _thp_mode() -> str:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "none"
    m = re.search(r"\[(\w+)\]", text)
    return m.group(1) if m else "none"


@pytest.mark.skipif(not sys.platform.startswith("linux") or _thp_mode() in ("never", "none"),
                    reason="no transparent huge pages on this OS")
def test_collapsed_weights_sit_on_huge_pages_and_give_the_same_logits():
    # In a process of its own: the process's huge-page total is the measure, and in the suite's
    # process it also moved with memory earlier tests' models left on huge pages and gave back
    # (MLX reuses it; 0.65 of the collapsed bytes, once, in a whole-suite run).
    run = subprocess.run([sys.executable, "-c", "from tests.test_pages import collapse_check; collapse_check()"],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    if run.returncode == SKIP:
        pytest.skip(run.stdout.strip().splitlines()[-1])
    assert run.returncode == 0, run.stdout + run.stderr


def collapse_check() -> None:
    """The test's body (exit status 0: passed, SKIP: skipped with the reason on stdout)."""
    from targ_mlx import bind_openblas

    bind_openblas()
    from targ_mlx.runtime.backbone import load_backbone

    bb = load_backbone("smollm2-135m", huge_pages="off")  # on 4 KB pages at load
    if bb.engine.name != "targ_mlx.runtime.native":
        _skip("the CPU kernels are not this machine's engine")
    prompt = bb.tokenizer.encode("The capital of France is")

    def logits():
        out = bb.prefill(prompt, bb.make_cache())
        mx.eval(out)
        return out

    before = logits()
    had = pages.anon_huge_bytes()
    if had is None:
        _skip("this OS does not say which memory is on huge pages (/proc/self/smaps_rollup)")
    got = bb.engine.huge_pages("collapse")
    if got == 0:
        _skip("this kernel has no MADV_COLLAPSE (Linux 6.1+)")
    # SmolLM2's ~90 MB of weights: its small matrices lie apart in the heap, so about two thirds
    # are in whole 2 MB pages (the 1.5B's large ones: 1,062 of 1,076 MB)
    assert got >= 16 * MB, got
    assert pages.anon_huge_bytes() - had >= 0.8 * got, (pages.anon_huge_bytes(), had, got)
    assert mx.array_equal(logits(), before)


def _skip(reason: str) -> None:
    print(reason, flush=True)
    sys.exit(SKIP)
