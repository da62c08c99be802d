"""Collect the finished cells of a grid run elsewhere into a committed results folder (no checkpoints).

A grid runs into a scratch ``out_root`` (checkpoints are large and never committed). This copies each
cell that finished there into ``--dst`` and appends the cell's ledger line to ``--dst``'s ledger, so
that ``bftrec-report tables`` / ``figures`` on ``--dst`` see it and the record of where and at which
commit it ran travels with it. It schedules nothing: Hydra still runs the cells (``bftrec.grid``).

A cell is collected when its last line with status ``ran`` or ``resumed`` in the source ledger
(``<src>/ledger.jsonl``; the folder holds the run that line describes) is not yet in the destination
ledger (same cell and ``written``) and its folder holds ``metrics.json``. Checkpoints (``*.pt``) and
lock files are left behind.

Usage:
    python scripts/collect_cells.py --src /scratch/pm/runs --dst results/paper_main/runs [--commit] \
        [--only 'beauty/sasrec/*' ...]

``--commit`` makes one git commit per cell in the repository holding ``--dst``, of that cell's files and
the ledger only (whatever else is staged stays staged), its message, prefixed with the name of
``--dst``'s parent folder (``paper_main``), giving test HR@10, the best epoch, the wall time and the
commit the cell ran at. Exit status: 0, also when there is nothing new (it says so).

Errors (one line, exit 2; checked before a cell's files are touched): no source ledger; a torn or
non-record ledger line; a cell that is not a relative ``dataset/model/layer/seedK`` path (or
``dataset/model/layer/<variant>/seedK``, as the SNR sweep's ``rate0.1``); a ledger line or
``metrics.json`` missing a field; a failed git command (the cell's ledger line is taken back); a destination
cell that already holds a different ``metrics.json`` (never overwritten: move it away, or pass
``--replace`` to overwrite it on purpose); an ``--only`` pattern that matches no finished cell of the source.
"""
from __future__ import annotations

import argparse
import filecmp
import json
import logging
import shutil
import subprocess
import sys
from fnmatch import fnmatch
from pathlib import Path

log = logging.getLogger("collect_cells")
DONE = ("ran", "resumed")
LEFT_BEHIND = ("*.pt", "*.pth", ".lock", "__pycache__")


def read_ledger(path: Path) -> list[tuple[str, dict]]:
    """The (raw line, parsed record) pairs of a ledger; blank lines skipped, a torn or odd line named."""
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            raise SystemExit(f"collect_cells: {path}:{n} is not a JSON line (a torn write?); "
                             "fix or delete that line and rerun") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("cell"), str):
            raise SystemExit(f"collect_cells: {path}:{n} is not a ledger record (a JSON object with a 'cell'); "
                             "fix or delete that line and rerun")
        out.append((line, rec))
    return out


def _check_cell(cell: str, src_ledger: Path) -> None:
    """Refuse, in one line, a ledger cell that is not a relative ``dataset/model/layer/[variant/]seedK`` path
    (an absolute cell is a run outside the sweep folder: collecting it could delete the source)."""
    p = Path(cell)
    if p.is_absolute() or len(p.parts) not in (4, 5) or ".." in p.parts or not p.parts[-1].startswith("seed"):
        raise SystemExit(f"collect_cells: {src_ledger} names cell {cell!r}, not a dataset/model/layer/[variant/]"
                         "seedK path under --src; collect that run by hand")


def _read_metrics(path: Path) -> dict:
    """A cell's ``metrics.json``; an unreadable one is a one-line SystemExit."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        raise SystemExit(f"collect_cells: {path} is not valid JSON (a torn write?); rerun that cell or "
                         "collect it by hand") from None


def pending(src: Path, dst: Path, only: tuple[str, ...] = ()) -> list[tuple[str, dict]]:
    """For each cell whose last finished line in ``src``'s ledger is not yet in ``dst``'s ledger, that
    line (the folder holds the run it describes), in ledger order. ``only``: shell patterns on the cell path
    (``beauty/sasrec/*``); with any, a cell matching none is left where it is."""
    src_ledger = src / "ledger.jsonl"
    if not src_ledger.exists():
        raise SystemExit(f"collect_cells: no ledger at {src_ledger}; --src must be a grid's runs folder "
                         "(<out_root>/runs)")
    dst_ledger = dst / "ledger.jsonl"
    have = {(r["cell"], r.get("written")) for _, r in read_ledger(dst_ledger)} if dst_ledger.exists() else set()
    last: dict[str, tuple[str, dict]] = {}  # cell -> its last finished line
    for line, r in read_ledger(src_ledger):
        if r.get("status") in DONE:
            _check_cell(r["cell"], src_ledger)
            last.pop(r["cell"], None)
            last[r["cell"]] = (line, r)
    for o in only:  # a pattern that matches no finished cell is a typo (``beauty/sasrec``), not "nothing new"
        if not any(fnmatch(cell, o) for cell in last):
            raise SystemExit(f"collect_cells: --only {o!r} matches no finished cell in {src_ledger}; a pattern "
                             "matches the whole cell path, e.g. 'beauty/sasrec/*' for beauty/sasrec/bft/seed0")
    todo = []
    for line, r in last.values():
        if (r["cell"], r.get("written")) in have or (only and not any(fnmatch(r["cell"], o) for o in only)):
            continue
        if (src / r["cell"] / "metrics.json").exists():
            todo.append((line, r))
        else:
            log.warning("%s: ledger says %s but the folder has no metrics.json; skipped", r["cell"], r["status"])
    return todo


def commit_message(record: dict, metrics: dict, prefix: str = "paper_main") -> str:
    """One-line commit message for a collected cell.

    Raises:
        SystemExit: the ledger line or ``metrics.json`` lacks a field the message needs (one line).
    """
    try:
        cell = " ".join(record["cell"].split("/"))
        seconds = f"{round(record['wall_s']):,} s" + (" in its last segment" if record["status"] == "resumed" else "")
        return (f"{prefix}: {cell} (test HR@10 {metrics['test']['overall']['HR@10']:.4f}, "
                f"best epoch {metrics['best_epoch']} of {metrics['epochs_run']}; {seconds}, "
                f"status {record['status']}, at {str(record.get('git_sha', '?'))[:7]})")
    except (KeyError, TypeError, ValueError) as e:
        raise SystemExit(f"collect_cells: cell {record.get('cell')!r}: its ledger line or metrics.json lacks "
                         f"{e!s} (an unfinished or foreign run?); collect it by hand") from None


def _git(repo: Path, *args: str) -> str:
    """Run ``git -C repo args``; a failure is a one-line SystemExit with git's first message line."""
    r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if r.returncode != 0:
        first = (r.stderr.strip().splitlines() or ["(no message)"])[0]
        raise SystemExit(f"collect_cells: `git {' '.join(args[:2])}` failed in {repo}: {first}; "
                         "run it on a --dst inside a git repository, or drop --commit")
    return r.stdout.strip()


def collect(src: Path, dst: Path, replace: bool = False, commit: bool = False,
            only: tuple[str, ...] = ()) -> list[str]:
    """Copy each pending cell of ``src`` into ``dst`` and append its ledger line; returns the cells.

    Everything that can fail is checked before a cell's files are touched; a failed commit takes the
    cell's ledger line back out, so a rerun collects it again.
    """
    todo = pending(src, dst, only)
    dst.mkdir(parents=True, exist_ok=True)
    repo = Path(_git(dst, "rev-parse", "--show-toplevel")) if commit and todo else None
    prefix = dst.resolve().parent.name or "runs"
    ledger = dst / "ledger.jsonl"
    done = []
    for line, r in todo:
        s, d = src / r["cell"], dst / r["cell"]
        if d.resolve() == s.resolve():
            raise SystemExit(f"collect_cells: --src and --dst hold the same folder {d}; nothing to copy")
        msg = commit_message(r, _read_metrics(s / "metrics.json"), prefix)
        if (d / "metrics.json").exists() and not filecmp.cmp(s / "metrics.json", d / "metrics.json", shallow=False):
            if not replace:
                raise SystemExit(f"collect_cells: {d} already holds a different metrics.json; move it away "
                                 "or pass --replace to overwrite it")
        if d.exists():
            shutil.rmtree(d)
        shutil.copytree(s, d, ignore=shutil.ignore_patterns(*LEFT_BEHIND))
        size = ledger.stat().st_size if ledger.exists() else 0
        with ledger.open("a") as f:
            f.write(line + "\n")
        if commit:
            paths = [str(d.resolve()), str(ledger.resolve())]
            try:
                _git(repo, "add", "--", *paths)
                _git(repo, "commit", "-q", "-m", msg, "--", *paths)  # only these paths, not the user's staging
            except SystemExit:
                with ledger.open("r+") as f:  # the ledger line goes back out: a rerun collects the cell again
                    f.truncate(size)
                raise
        log.info("%s", msg)
        done.append(r["cell"])
    if not done:
        log.info("nothing new to collect from %s", src)
    return done


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--src", type=Path, required=True, help="the grid's scratch runs folder (<out_root>/runs)")
    p.add_argument("--dst", type=Path, required=True, help="the committed runs folder, e.g. results/paper_main/runs")
    p.add_argument("--replace", action="store_true", help="overwrite a destination cell with different metrics")
    p.add_argument("--commit", action="store_true", help="one git commit per collected cell")
    p.add_argument("--only", action="append", default=[], metavar="PATTERN",
                   help="collect only cells whose path matches this shell pattern, e.g. 'beauty/sasrec/*' "
                        "(repeatable)")
    a = p.parse_args(argv)
    try:
        collect(a.src, a.dst, a.replace, a.commit, tuple(a.only))
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
