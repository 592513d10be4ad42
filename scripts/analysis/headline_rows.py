"""results/README.md's headline rows from each cell folder's overview.md (what `--report-only`
writes): Never, Always, margin @ rate, evidence @ reading rate, random @ that rate, oracle,
evidence − random (bold where its CI is above 0, as the cell's summary.md judges it), evidence − margin, evidence − Always, AUROC
'helps' of U_mar / U_evi, hit@5. Prints one row per LABEL=FOLDER:DATASET.

    python scripts/analysis/headline_rows.py "SmolLM2 · clean · NQ-Open=results/smollm2-135m/clean:nq_open"
"""

from __future__ import annotations

import argparse
from pathlib import Path


def overview_rows(folder: Path) -> dict[tuple[str, str], list[str]]:
    """(dataset, gate) -> the overview table's cells."""
    out = {}
    for line in (folder / "overview.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 17 and cells[1] in ("margin", "evidence"):
            out[(cells[0], cells[1])] = cells
    return out


def beats_random(folder: Path, dataset: str) -> bool:
    """The dataset's summary.md verdict on the evidence gate's accuracy against random (its CI
    above 0, judged unrounded: an overview's "+0.0" lower bound may be just above 0 or 0)."""
    text = (folder / dataset / "summary.md").read_text(encoding="utf-8")
    block = text.split("**Budget-calibrated evidence gate, accuracy**", 1)[1]
    row = next(line for line in block.splitlines() if line.startswith("| gate − random at the same rate"))
    return row.rstrip(" |").endswith("beats random: yes")


def headline(label: str, folder: Path, dataset: str) -> str:
    rows = overview_rows(folder)
    m, e = rows[(dataset, "margin")], rows[(dataset, "evidence")]
    random_point = e[7].split(" [")[0]
    cells = [label, e[4], e[5], m[6], e[6], random_point, e[8], f"**{e[11]}**" if beats_random(folder, dataset) else e[11], e[13], e[10],
             f"{m[15].split(' [')[0]} / {e[15].split(' [')[0]}", e[16]]
    return "| " + " | ".join(cells) + " |"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cells", nargs="+", metavar="LABEL=FOLDER:DATASET")
    args = ap.parse_args(argv)
    for spec in args.cells:
        label, rest = spec.rsplit("=", 1)
        folder, dataset = rest.rsplit(":", 1)
        print(headline(label, Path(folder), dataset))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
