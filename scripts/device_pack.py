"""Pack a grid's out_root for the trip back from a borrowed GPU machine (scripts/device_grid.sh).

``cells.tgz``: every file of every cell except checkpoints (*.pt), plus the ledger and the logs beside
the runs. ``ckpt_<n>.tgz``: ``last.pt`` and ``checkpoint.pt`` of the cells that have no metrics.json (the
deadline cut them), most finished epochs first, as many cells per archive as fit 15 MiB of raw checkpoints,
while the archives stay under the limits of what comes back (8 files, 16 MB each, 64 MB in all); a cell
that does not fit is named in a warning and left behind. Unpack all of them into one folder to get the run
tree, and resume it with the grid's own command (bftrec.grid resumes a cell that holds last.pt).

Usage: python scripts/device_pack.py WORK OUT
"""
import logging
import sys
import tarfile
from pathlib import Path

import pandas as pd

log = logging.getLogger("device_pack")
MAX_FILES, MAX_FILE, MAX_TOTAL = 8, 15 * 2**20, 60 * 2**20


def epochs_done(cell: Path) -> int:
    """Epochs a cell has finished (rows of its history.csv; 0 without one)."""
    try:
        return len(pd.read_csv(cell / "history.csv"))
    except (OSError, ValueError):
        return 0


def checkpoints(cell: Path) -> list[Path]:
    """What a cut cell needs to resume: ``last.pt`` and, when its best epoch was saved, ``checkpoint.pt``."""
    return [cell / n for n in ("last.pt", "checkpoint.pt") if (cell / n).exists()]


def main(work: Path, out: Path) -> int:
    cells = sorted(p.parent for p in work.rglob("config.yaml") if p.parent.name != ".hydra")
    with tarfile.open(out / "cells.tgz", "w:gz") as tar:
        for path in sorted(work.rglob("*")):
            if path.is_file() and path.suffix != ".pt":
                tar.add(path, arcname=str(path.relative_to(work)))
    sent = [f for f in out.iterdir() if f.is_file()]  # cells.tgz and whatever the job wrote there before
    total, n = sum(f.stat().st_size for f in sent), len(sent)
    unfinished = sorted((c for c in cells if not (c / "metrics.json").exists()), key=epochs_done, reverse=True)
    # cells stopped before their first epoch ended have no last.pt: nothing to resume
    groups: list[list[Path]] = []  # cells per archive, most epochs first, up to MAX_FILE of raw checkpoints
    for cell in (c for c in unfinished if (c / "last.pt").exists()):
        raw = sum(f.stat().st_size for f in checkpoints(cell))
        if groups and sum(f.stat().st_size for c in groups[-1] for f in checkpoints(c)) + raw <= MAX_FILE:
            groups[-1].append(cell)
        else:
            groups.append([cell])
    for group in groups:
        name = out / f"ckpt_{n}.tgz"
        with tarfile.open(name, "w:gz") as tar:
            for cell in group:
                for ck in checkpoints(cell):
                    tar.add(ck, arcname=str(ck.relative_to(work)))
        size = name.stat().st_size
        if n + 1 > MAX_FILES or size > MAX_FILE or total + size > MAX_TOTAL:
            name.unlink()
            for cell in group:
                log.warning("left behind (limits): %s (%d epochs)", cell.relative_to(work), epochs_done(cell))
            continue
        total, n = total + size, n + 1
        log.info("checkpoints of %s: %s, %.1f MB", ", ".join(f"{c.relative_to(work)} ({epochs_done(c)} epochs)"
                                                           for c in group), name.name, size / 2**20)
    done = sum((c / "metrics.json").exists() for c in cells)
    log.info("%d cells, %d finished, %d unfinished; %d files back, %.1f MB", len(cells), done, len(cells) - done, n,
             total / 2**20)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if len(sys.argv) != 3:
        sys.exit("usage: python scripts/device_pack.py WORK OUT")
    for what, folder in (("WORK (the grid's out_root)", Path(sys.argv[1])), ("OUT", Path(sys.argv[2]))):
        if not folder.is_dir():
            sys.exit(f"device_pack: {what} {folder} is not a folder; pass existing folders")
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
