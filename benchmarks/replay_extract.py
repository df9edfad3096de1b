"""Rebuild sft_grid/conf/replay/lin2024_sft.csv, the replay backend's real fine-tuning curves, from a fetched copy.

The source: Lin et al., ICML 2024, "Selecting Large Language Model to Fine-tune via Rectified Scaling Law",
github.com/linhaowei1/Fine-tuning-Scaling-Law (Apache-2.0), its benchmark/{flan,gigaword,wmt19}.csv: per model
(30 of them), the test loss after fine-tuning on a subset of 0, 200, 400, ..., 1638400 examples, with the model's
parameter count and family. The same curves (without the 0 and 1638400 columns' layout) are ScaleBench's
`sft_scaling_law` set in PlanarG/active-sl, which deleted them from its tree before adding its licence; the
original authors' Apache-2.0 release is the one shipped here.

Only data is copied: the three tables are read as they are and written as one long CSV (dataset, model, family,
params, examples, loss), rows in the source's order; the zero-shot column (0 examples) is kept (examples 0). No
value is changed or rounded.

    python benchmarks/replay_extract.py <git dir of the fetched repository> [--commit <sha>] [--out <csv>]
"""

from __future__ import annotations

import argparse
import csv
import io
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "sft_grid" / "conf" / "replay" / "lin2024_sft.csv"
COMMIT = "5214568013af65e3cefd03860ecd7bc9358b308c"
DATASETS = ("flan", "gigaword", "wmt19")
COLUMNS = ("dataset", "model", "family", "params", "examples", "loss")


def rows(git_dir: Path, commit: str) -> list[dict[str, str]]:
    out = []
    for dataset in DATASETS:
        text = subprocess.run(
            ["git", "--git-dir", str(git_dir), "show", f"{commit}:benchmark/{dataset}.csv"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        reader = csv.reader(io.StringIO(text))
        header = next(reader)
        sizes = [h for h in header[1:] if h.isdigit()]
        for rec in reader:
            if not rec:
                continue
            by = dict(zip(header, rec, strict=True))
            out += [
                {
                    "dataset": dataset,
                    "model": by[header[0]],
                    "family": by["family"],
                    "params": by["size"],
                    "examples": size,
                    "loss": by[size],
                }
                for size in sizes
            ]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("git_dir", type=Path)
    ap.add_argument("--commit", default=COMMIT)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    found = rows(args.git_dir, args.commit)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(found)
    args.out.write_text(buf.getvalue())
    print(f"{len(found)} rows -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
