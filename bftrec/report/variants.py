"""A variant table: tagged runs of one (dataset, backbone, layer) against a baseline tag, chosen by validation.

    bftrec-report variants --runs results/windows/runs --baseline windows=last \\
        --out results/windows/tables

For studies that change one setting at a time (training windows, the loss, ...): every run carries a
tag (``tag=windows=sliding``; an experiment config sets it from the swept key). One row per
(dataset, backbone, layer, tag), values mean ± std over seeds:

- validation NDCG@10 (the selection metric; ``ranks.csv.gz`` holds test ranks only, so there is no
  paired test on validation) and its relative difference to the baseline tag;
- test HR@10 and NDCG@10, with a two-sided Wilcoxon signed-rank p over users of the seed-averaged
  per-user metric against the baseline (``paired_p``);
- best epoch, epochs run and training seconds (``history.csv``).

Per (dataset, backbone, layer) the row with the best mean validation NDCG@10 is marked, with its
margin over the runner-up. Reads only ``metrics.json``, ``ranks.csv.gz`` and ``history.csv``.
``--grid <experiment yaml>`` lists the expected cells from its sweep and marks the table PARTIAL.
"""
from __future__ import annotations

import argparse
import itertools
import logging
from pathlib import Path

import numpy as np
import pandas as pd

from bftrec.report.cells import fmt, pval
from bftrec.report.runs import command_line, header, load_runs
from bftrec.report.tables import matched_seeds, paired_p

log = logging.getLogger("bftrec.report.variants")


def _train_s(run: dict) -> float | None:
    h = run["_dir"] / "history.csv"
    return float(pd.read_csv(h)["train_seconds"].sum()) if h.exists() else None


def _matched_valid(rs: list[dict], base: list[dict]) -> tuple[float, float]:
    """Mean validation NDCG@10 of ``rs`` and of ``base`` on the seeds both have (``matched_seeds``),
    the seeds its p-values use."""
    a, b = matched_seeds(rs, base)
    return (float(np.mean([r["valid"]["NDCG@10"] for r in a])), float(np.mean([r["valid"]["NDCG@10"] for r in b])))


def _rel(a: float, b: float | None) -> str:
    """Relative difference a / b − 1 as ``+1.2%``; ``–`` without a baseline or with a zero one."""
    return "–" if not b else f"{a / b - 1:+.1%}"


def variant_rows(runs: list[dict], baseline: str) -> pd.DataFrame:
    """One row per (dataset, model, layer, tag); see the module docstring."""
    groups: dict = {}
    seen: dict = {}
    for r in runs:
        key = (r["dataset"], r["model"], r["layer"], r["tag"], r["seed"])
        if key in seen:
            raise SystemExit(f"bftrec-report variants: two runs of {'/'.join(map(str, key[:4]))} seed {key[4]}: "
                             f"{seen[key]} and {r['_dir']}; keep one (seeds would be double counted)")
        seen[key] = r["_dir"]
        groups.setdefault((r["dataset"], r["model"], r["layer"]), {}).setdefault(r["tag"], []).append(r)
    rows = []
    if not any(baseline in tags for tags in groups.values()):
        raise SystemExit(f"bftrec-report variants: no runs tagged {baseline!r} (tags: "
                         f"{', '.join(sorted({t for tags in groups.values() for t in tags}))}); "
                         "pass --baseline <one of them>")
    for (d, m, layer), tags in sorted(groups.items()):
        if baseline not in tags:  # a study in progress: the baseline of this group has not run yet
            log.warning("%s/%s/%s: no %s run yet; its rows carry no comparison", d, m, layer, baseline)
        base = tags.get(baseline)
        block = []
        for tag in sorted(tags, key=lambda t: (t != baseline, t)):
            rs = tags[tag]
            valid = [r["valid"]["NDCG@10"] for r in rs]
            row = {"dataset": d, "model": m, "layer": layer, "tag": tag,
                   "seeds": ",".join(str(r["seed"]) for r in sorted(rs, key=lambda r: r["seed"])),
                   "valid NDCG@10": fmt(valid), "_valid": float(np.mean(valid)),
                   "valid vs baseline": "" if tag == baseline else
                   _rel(*_matched_valid(rs, base)) if base else "–"}
            for metric in ("HR@10", "NDCG@10"):
                row[f"test {metric}"] = fmt([r["test"]["overall"][metric] for r in rs])
                row[f"p {metric}"] = "" if tag == baseline or not base else pval(paired_p(rs, base, metric))
            train_s = [_train_s(r) for r in rs]
            row.update({"best epoch": fmt([r["best_epoch"] for r in rs], 0),
                        "epochs run": fmt([r["epochs_run"] for r in rs], 0),
                        "train s": fmt(train_s, 0) if None not in train_s else "–"})
            block.append(row)
        order = sorted(block, key=lambda x: -x["_valid"])
        for row in block:
            row["chosen"] = ""
        if len(order) > 1:
            margin = _rel(order[0]["_valid"], order[1]["_valid"])
            order[0]["chosen"] = f"best valid NDCG@10 ({margin} over {order[1]['tag']})"
        rows += block
    return pd.DataFrame(rows).drop(columns="_valid")


def expected_missing(runs: list[dict], grid: Path) -> list[str]:
    """Cells of ``grid``'s sweep (dataset x tag-setting x seed) without a finished run."""
    from bftrec.grid import sweep_axes

    axes = sweep_axes(grid, required=("dataset", "seed"))
    have = {(r["dataset"], r["_overrides_key"], r["seed"]) for r in runs}
    out = []
    keys = [k for k in axes if k not in ("dataset", "model", "layer", "seed")]
    for d in axes.get("dataset", []):
        for s in axes.get("seed", []):
            for combo in itertools.product(*([f"{k}={v}" for v in axes[k]] for k in keys)):
                if (d, tuple(combo), int(s)) not in have:
                    out.append(f"{d} {' '.join(combo)} seed {s}")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="bftrec-report variants", description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, nargs="+", required=True,
                    help="folder(s) searched for metrics.json; several: their union (a baseline committed elsewhere)")
    ap.add_argument("--baseline", required=True, help="the tag every other tag is compared with")
    ap.add_argument("--out", type=Path, required=True, help="folder for variants.md and variants.csv")
    ap.add_argument("--grid", type=Path, help="experiment config whose sweep lists the expected cells")
    args = ap.parse_args(argv)
    runs = load_runs(args.runs)  # exits in one line when there is none
    swept = set()
    if args.grid:
        from bftrec.grid import sweep_axes

        swept = set(sweep_axes(args.grid, required=("dataset", "seed"))) - {"dataset", "model", "layer", "seed"}
    for r in runs:
        r["_overrides_key"] = tuple(o for o in r["_overrides"] if o.partition("=")[0] in swept)
    missing = expected_missing(runs, args.grid) if args.grid else []
    df = variant_rows(runs, args.baseline)
    head = header(runs, command=command_line("variants", argv))
    if missing:
        head += f"\n- **PARTIAL: {len(missing)} cells missing**: {'; '.join(missing)}"
    head += ("\n- valid vs baseline: relative difference of the seed means of validation NDCG@10; p: two-sided "
             f"Wilcoxon signed-rank test over users of the seed-averaged per-user test metric against {args.baseline}")
    args.out.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out / "variants.csv", index=False)
    (args.out / "variants.md").write_text(f"# Variants against {args.baseline} (mean ± std over seeds)\n\n"
                                          f"{head}\n\n{df.to_markdown(index=False)}\n")
    log.info(f"wrote {args.out / 'variants.md'} and variants.csv ({len(df)} rows)")


if __name__ == "__main__":
    main()
