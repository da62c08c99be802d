"""The τ ablation table (issue: BFT for SASRec, item 6) from run directories.

    bftrec-report ablation --runs results/office_sasrec/ablation --out results/office_sasrec/tau_ablation

Reads each run's ``metrics.json``. Runs made before the trainer logged the initial mean Kalman gain
carry it in ``gain_first_batch.json`` next to ``metrics.json``, written once by
``bftrec.evaluate.replay_gain`` (which rebuilds the model with the run's seed, calibrates on the same
batch, then loads the run's checkpoint); a run without either file is replayed now, which needs its
``checkpoint.pt`` and the data root. One row per cell (tau.scale x tau.kind x tau.freq_slope); the row with the best
validation NDCG@10 is marked: that choice sets the defaults of ``configs/layer/bft.yaml``.

    bftrec-report ablation --runs results/tau_ablation_count/runs --out results/tau_ablation_count/tables

A folder of tagged variants (``configs/experiment/tau_ablation_count.yaml``: every run tagged ``tau=<name>``)
gives instead one table per dataset in ``--out/<dataset>.md|csv``, one row per variant, values mean ± std over
seeds: validation NDCG@10 (the selection metric; ranks.csv.gz holds only test ranks, so no paired test on
validation) and its difference to ``tau=default``; test HR@10 and NDCG@10 with a two-sided Wilcoxon
signed-rank p over users of the seed-averaged per-user metric against ``tau=default``
(``paired_p``); the initial and final mean K per layer (``mechanism.gain_first_batch``); λ⁰ of
the Q0 and Q4 item-frequency bins of the test histories at the best checkpoint
(``mechanism.by_item_freq[].lam0``), their ratio, and how far each moved from its start: the start is
``lam0_start`` where the run recorded it, else exp(τ₀) = 1 where the config fixes it (``tau.scale=count``
or ``unit`` with ``freq_slope=0``), and the start ratio Q0/Q4 is 1 for any ``freq_slope=0``; otherwise
``?``. The best row by validation NDCG@10 is marked, with its margin to the runner-up and to the
default; ``--compare <runs>`` adds a line for the v1 (``bft.units=h``) SASRec bft cell found there.
Missing cells (every dataset x variant x seed found, or ``--grid``'s sweep) make the tables PARTIAL.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from bftrec.report.cells import fmt, pval
from bftrec.report.runs import check_comparable, command_line, describe_missing, header, load_runs, missing_cells
from bftrec.report.tables import matched_seeds, paired_p

DEFAULT = "tau=default"
VARIANT_DIR = Path(__file__).resolve().parent.parent / "configs" / "tau_variant"


def first_batch_gain(run: dict) -> dict:
    """Initial/final K on the first batch: from metrics.json, else from the run's
    ``gain_first_batch.json`` (committed), else replayed from its checkpoint and written there."""
    gain = run.get("mechanism", {}).get("gain_first_batch")
    if gain is not None:
        return gain
    cached = run["_ranks"].parent / "gain_first_batch.json"
    if cached.exists():
        return json.loads(cached.read_text())
    from bftrec.evaluate import replay_gain  # needs the run's checkpoint.pt and the data root

    gain = replay_gain(run["_ranks"].parent)
    cached.write_text(json.dumps(gain, indent=2) + "\n")
    return gain


def row(run: dict) -> dict:
    tau = run["layer_config"]["tau"]
    mech = run.get("mechanism", {})
    gain = first_batch_gain(run)
    k_list = lambda xs: " / ".join(f"{x:.3f}" for x in xs)  # noqa: E731
    return {
        "tau.scale": tau["scale"], "tau.kind": tau["kind"], "tau.freq_slope": tau["freq_slope"],
        "valid HR@10": run["valid"]["HR@10"], "valid NDCG@10": run["valid"]["NDCG@10"],
        "test HR@10": run["test"]["overall"]["HR@10"], "test NDCG@10": run["test"]["overall"]["NDCG@10"],
        "Q0 test HR@10": run["test"]["by_item_freq"][0]["HR@10"],
        "cold test HR@10": run["test"]["cold_users"]["HR@10"],
        "initial K (per layer)": k_list(gain["initial_K_per_layer"]),
        "final K (per layer)": k_list(gain["final_K_per_layer"]),
        "final K test histories": k_list([layer["K"] for layer in mech["per_layer"]]),
        "best epoch": run["best_epoch"],
    }


def v1_table(runs: list[dict], args) -> None:
    """The v1 table: one row per (tau.scale, tau.kind, tau.freq_slope) cell, one seed each."""
    df = pd.DataFrame([row(r) for r in runs]).sort_values(["tau.scale", "tau.kind", "tau.freq_slope"])
    best = df["valid NDCG@10"].idxmax()
    df["chosen"] = ""
    df.loc[best, "chosen"] = "best valid NDCG@10"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out.with_suffix(".csv"), index=False)
    cells = ", ".join(f"{k}={df.loc[best, k]}" for k in ("tau.scale", "tau.kind", "tau.freq_slope"))
    text = (f"# τ ablation (SASRec + BFT, one seed per cell)\n\n{header(runs, command=args.command)}\n"
            f"- K: mean Kalman gain over real tokens; 'initial'/'final' on the first training batch (after "
            f"calibration / at the best checkpoint; from metrics.json or the run's gain_first_batch.json, "
            f"replayed from its checkpoint), 'test histories' on the test inputs\n"
            f"- chosen by validation NDCG@10: {cells}\n\n"
            f"{df.to_markdown(index=False, floatfmt='.4f')}\n")
    args.out.with_suffix(".md").write_text(text)
    print(json.dumps({"chosen": {k: df.loc[best, k] for k in ("tau.scale", "tau.kind", "tau.freq_slope")}},
                     default=str))



# ---------------------------------------------------------------------------------------------
# variants (configs/experiment/tau_ablation_count.yaml): one row per tag, seeds averaged
# ---------------------------------------------------------------------------------------------
def grid_expected(path: Path) -> tuple[list[str], list[str], list[int]]:
    """(datasets, tags, seeds) a variant sweep expects: ``hydra.sweeper.params`` ``dataset``,
    ``+tau_variant`` (each variant's tag read from ``configs/tau_variant/<name>.yaml``) and ``seed``."""
    try:
        params = yaml.safe_load(path.read_text())["hydra"]["sweeper"]["params"]
        names = [v.strip() for v in str(params["+tau_variant"]).split(",")]
        tags = [yaml.safe_load((VARIANT_DIR / f"{n}.yaml").read_text())["tag"] for n in names]
        return ([d.strip() for d in str(params["dataset"]).split(",")], tags,
                [int(x) for x in str(params["seed"]).split(",")])
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError) as e:
        raise SystemExit(f"bftrec-report ablation: --grid {path} is not a variant sweep with dataset, +tau_variant and "
                         f"seed in hydra.sweeper.params ({type(e).__name__}: {e}); pass "
                         "configs/experiment/tau_ablation_count.yaml") from None


def variant_missing(runs: list[dict], grid: Path | None) -> list[tuple]:
    """Missing (dataset, model, tag, layer, seed) cells: every dataset x tag x seed found (or ``grid``'s)."""
    model, layer = runs[0]["model"], runs[0]["layer"]
    if grid is not None:
        datasets, tags, seeds = grid_expected(grid)
    else:
        datasets, tags, seeds = ({r[k] for r in runs} for k in ("dataset", "tag", "seed"))
    return missing_cells(runs, {(d, model, t, layer, s) for d in datasets for t in tags for s in seeds})


def lam0_bins(run: dict) -> dict:
    """λ⁰ of the first (Q0) and last (Q4) item-frequency bin at the best checkpoint, and at the start:
    ``lam0_start`` when recorded, else 1 where the config fixes it (τ₀ = 0: ``tau.scale`` count or unit,
    ``freq_slope`` 0); the start ratio Q0/Q4 is 1 for any ``freq_slope`` 0; None where unknown."""
    tau = run["layer_config"]["tau"]
    bins = run["mechanism"]["by_item_freq"]
    lo, hi = bins[0], bins[-1]
    flat = tau["freq_slope"] == 0.0
    fixed = 1.0 if flat and tau["scale"] in ("count", "unit") else None
    out = {"lo_bin": lo["bin"], "hi_bin": hi["bin"], "lo": lo["lam0"], "hi": hi["lam0"],
           "ratio": lo["lam0"] / hi["lam0"]}
    out["lo_start"] = lo.get("lam0_start", fixed)
    out["hi_start"] = hi.get("lam0_start", fixed)
    out["ratio_start"] = (out["lo_start"] / out["hi_start"] if "lam0_start" in lo and "lam0_start" in hi
                          else (1.0 if flat else None))
    return out


def _mean(xs: list) -> float | None:
    """Mean over seeds; None when any seed's value is unknown."""
    return None if not xs or any(x is None for x in xs) else float(np.mean(xs))


def _moved(starts: list, ends: list) -> str:
    """``start → end ± std (×factor)``; ``? → end`` when the start is unknown for some seed."""
    end = fmt(ends, 3)
    if any(s is None for s in starts):
        return f"? → {end}"
    s = float(np.mean(starts))
    return f"{s:.3g} → {end} (×{np.mean(ends) / s:.3f})"


def _k(gains: list[dict], key: str) -> str:
    per_layer = np.mean([g[key] for g in gains], axis=0)  # (n_layers,) mean over seeds
    return " / ".join(f"{x:.3f}" for x in per_layer)


def variant_rows(groups: dict, n_seeds: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(markdown rows, numeric rows) of one dataset's variants; ``groups``: tag -> runs (sorted by seed)."""
    base = groups.get(DEFAULT)
    md, num = [], []
    for tag, rs in sorted(groups.items(), key=lambda kv: (kv[0] != DEFAULT, kv[0])):
        tau = rs[0]["layer_config"]["tau"]
        seeds = [r["seed"] for r in rs]
        valid = [r["valid"]["NDCG@10"] for r in rs]
        test = {m: [r["test"]["overall"][m] for r in rs] for m in ("HR@10", "NDCG@10")}
        p = {m: paired_p(rs, base, m) if base and tag != DEFAULT else None for m in test}
        lam = [lam0_bins(r) for r in rs]
        gains = [first_batch_gain(r) for r in rs]
        delta = rel = None
        if base:  # the difference on the seeds both have, as its p-value (matched_seeds)
            mine, theirs = matched_seeds(rs, base)
            ref = float(np.mean([r["valid"]["NDCG@10"] for r in theirs]))
            delta = float(np.mean([r["valid"]["NDCG@10"] for r in mine])) - ref
            rel = 100 * delta / ref if ref else float("nan")
        b0, b4 = lam[0]["lo_bin"], lam[0]["hi_bin"]
        md.append({
            "variant": tag.removeprefix("tau="), "tau.scale": tau["scale"], "tau.kind": tau["kind"],
            "tau.freq_slope": tau["freq_slope"], "tau.lr_scale": tau.get("lr_scale", 1.0),
            "seeds": (str(len(rs)) if len(rs) >= n_seeds
                      else f"{len(rs)} of {n_seeds} (seed {', '.join(map(str, seeds))})"),
            "valid NDCG@10": fmt(valid),
            "Δ valid NDCG@10 vs default": "" if tag == DEFAULT or delta is None else
            f"{delta:+.4f} ({rel:+.1f}%)",
            **{f"test {m}": fmt(v) for m, v in test.items()},
            **{f"p test {m} vs default": "" if tag == DEFAULT else pval(p[m]) for m in test},
            "K initial (per layer)": _k(gains, "initial_K_per_layer"),
            "K final (per layer)": _k(gains, "final_K_per_layer"),
            f"λ⁰ {b0}: start → best": _moved([x["lo_start"] for x in lam], [x["lo"] for x in lam]),
            f"λ⁰ {b4}: start → best": _moved([x["hi_start"] for x in lam], [x["hi"] for x in lam]),
            f"λ⁰ {b0}/{b4}: start → best": _moved([x["ratio_start"] for x in lam], [x["ratio"] for x in lam]),
            "best epoch": fmt([r["best_epoch"] for r in rs], 1) if len(rs) > 1 else f"{rs[0]['best_epoch']} (1 seed)",
        })
        num.append({"variant": md[-1]["variant"], **{k: md[-1][k] for k in ("tau.scale", "tau.kind", "tau.freq_slope",
                                                                           "tau.lr_scale")},
                    "n_seeds": len(rs), "seeds": " ".join(map(str, seeds)),
                    "valid_NDCG@10_mean": float(np.mean(valid)), "valid_NDCG@10_std": _std(valid),
                    "delta_valid_NDCG@10_vs_default": delta if tag != DEFAULT else None,
                    **{f"test_{m}_{s}": f(v) for m, v in test.items() for s, f in (("mean", np.mean), ("std", _std))},
                    **{f"p_test_{m}_vs_default": p[m] for m in test},
                    **{f"lam0_{b}_{w}": _mean([x[k] for x in lam]) for b, k0 in ((b0, "lo"), (b4, "hi"))
                       for w, k in (("start", f"{k0}_start"), ("best", k0))},
                    "lam0_ratio_start": _mean([x["ratio_start"] for x in lam]),
                    "lam0_ratio_best": _mean([x["ratio"] for x in lam])})
    return pd.DataFrame(md), pd.DataFrame(num)


def _std(v: list) -> float | None:
    return float(np.std(v, ddof=1)) if len(v) > 1 else None


def choice_line(num: pd.DataFrame) -> tuple[str, str]:
    """(best variant, one line: the best row by validation NDCG@10, its margin to the runner-up and to the default)."""
    order = num.sort_values("valid_NDCG@10_mean", ascending=False).reset_index(drop=True)
    best = order.loc[0]
    line = f"- best by validation NDCG@10: **{best['variant']}** ({best['valid_NDCG@10_mean']:.4f})"
    if len(order) > 1:
        up = order.loc[1]
        margin = best["valid_NDCG@10_mean"] - up["valid_NDCG@10_mean"]
        line += f"; margin to the runner-up {up['variant']}: {margin:+.4f}"
    default = num[num["variant"] == DEFAULT.removeprefix("tau=")]
    if len(default) and best["variant"] != default.iloc[0]["variant"]:
        d = default.iloc[0]["valid_NDCG@10_mean"]
        diff = best["valid_NDCG@10_mean"] - d
        line += f"; to the default: {diff:+.4f} ({100 * diff / d:+.1f}%)"
    elif len(default):
        line += " (the default itself)"
    return str(best["variant"]), line


def compare_line(dataset: str, groups: dict, best: str, others: list[dict]) -> str | None:
    """One line: the v1 (``bft.units=h``: ``layer=bft_h``, or a legacy ``bft`` run) SASRec cell of
    ``others`` on ``dataset`` against the best ``count`` variant and the default (validation NDCG@10,
    seed means; test NDCG@10 with p)."""
    from bftrec.config import upgrade_legacy_layer

    h = [r for r in others if r["dataset"] == dataset and r["model"] == "sasrec" and r["layer"] in ("bft", "bft_h")
         and upgrade_legacy_layer(r["layer_config"]).get("bft", {}).get("units") == "h"]
    if not h:
        return f"- v1 (bft.units=h) SASRec bft on {dataset}: no run under --compare"
    parts = []
    for name in dict.fromkeys([best, DEFAULT.removeprefix("tau=")]):
        rs = groups.get(f"tau={name}")
        if not rs:
            continue
        hm, rm = matched_seeds(h, rs)  # seed s against seed s, as the p-value
        hv_m = float(np.mean([r["valid"]["NDCG@10"] for r in hm]))
        cv = float(np.mean([r["valid"]["NDCG@10"] for r in rm]))
        verdict = "h BEATS count on validation" if hv_m > cv else "count beats h on validation"
        test_diff = (np.mean([r["test"]["overall"]["NDCG@10"] for r in hm])
                     - np.mean([r["test"]["overall"]["NDCG@10"] for r in rm]))
        parts.append(f"vs {name}: {hv_m - cv:+.4f} valid NDCG@10 ({verdict}); test NDCG@10 "
                     f"{test_diff:+.4f} (p {pval(paired_p(h, rs, 'NDCG@10'))})")
    seeds = ", ".join(str(r["seed"]) for r in sorted(h, key=lambda r: r["seed"]))
    valid = fmt([r["valid"]["NDCG@10"] for r in h])
    return (f"- v1 (bft.units=h) SASRec bft, {h[0]['_dir'].parent}: valid NDCG@10 {valid} "
            f"(seeds {seeds}), test NDCG@10 {fmt([r['test']['overall']['NDCG@10'] for r in h])}; " + "; ".join(parts))


VARIANT_NOTE = (
    "- one row per variant (configs/tau_variant/*.yaml), mean ± std over seeds (sample std); selection metric: "
    "validation NDCG@10 (ranks.csv.gz holds test ranks only, so validation has no paired test)\n"
    "- p: two-sided Wilcoxon signed-rank test over test users of the per-user metric averaged over seeds, against "
    "tau=default (unadjusted)\n"
    "- K: mean Kalman gain over real tokens of the first training batch, per layer, seed mean: 'initial' after "
    "calibration before the first step, 'final' at the best checkpoint (mechanism.gain_first_batch)\n"
    "- λ⁰: mean initial precision over the test-history tokens of the bin's items (mechanism.by_item_freq[].lam0) at "
    "the best checkpoint; start: mechanism lam0_start where recorded, else exp(τ₀) = 1 where the config fixes it "
    "(tau.scale=count, freq_slope 0), '?' where it needs the run's n̄ or the bin's counts; (×f): best / start")


def variant_tables(runs: list[dict], args) -> None:
    """Per dataset ``<out>/<dataset>.md|csv``; prints the chosen variant per dataset as JSON."""
    for r in runs:  # the tag names the variant: +tau_variant is no extra override
        r["_overrides"] = [o for o in r["_overrides"] if not o.startswith("+tau_variant=")]
    missing = variant_missing(runs, args.grid)
    groups_all: dict = {}
    for r in runs:
        groups_all.setdefault((r["dataset"], r["model"], r["tag"], r["layer"]), []).append(r)
    check_comparable(groups_all)
    n_seeds = len({s for *_, s in missing} | {r["seed"] for r in runs})
    others = load_runs(args.compare) if args.compare else []
    args.out.mkdir(parents=True, exist_ok=True)
    chosen = {}
    for ds in sorted({r["dataset"] for r in runs}):
        rs = [r for r in runs if r["dataset"] == ds]
        groups: dict = {}
        for r in sorted(rs, key=lambda r: r["seed"]):
            groups.setdefault(r["tag"], []).append(r)
        md, num = variant_rows(groups, n_seeds)
        best, line = choice_line(num)
        chosen[ds] = best
        md["chosen"] = np.where(md["variant"] == best, "best valid NDCG@10", "")
        miss = [m for m in missing if m[0] == ds]
        lines = [line] + ([compare_line(ds, groups, best, others)] if args.compare else [])
        if DEFAULT not in groups:
            lines.append(f"- no {DEFAULT} run: no differences or p-values against the default")
        title = (f"# τ ablation under bft.units=count: {ds}, {rs[0]['model']} + {rs[0]['layer']}"
                 + (" (PARTIAL)" if miss else ""))
        text = (f"{title}\n\n{header(rs, miss, command=args.command)}\n{VARIANT_NOTE}\n" + "\n".join(lines)
                + f"\n\n{md.to_markdown(index=False)}\n")
        (args.out / f"{ds}.md").write_text(text)
        num.to_csv(args.out / f"{ds}.csv", index=False)
    for ds in sorted({m[0] for m in missing} - set(chosen)):  # expected (--grid) but no run yet
        miss = [m for m in missing if m[0] == ds]
        (args.out / f"{ds}.md").write_text(f"# τ ablation under bft.units=count: {ds} (PARTIAL: no run yet)\n\n"
                                           + "\n".join(f"- missing: {x}" for x in describe_missing(miss)) + "\n")
    print(json.dumps({"chosen": chosen, "partial": bool(missing),
                      "missing": describe_missing(missing) if missing else []}))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="bftrec-report ablation", description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True,
                    help="v1 cells: path without suffix (writes .md and .csv); variants: a folder")
    ap.add_argument("--compare", type=Path, help="variants: runs holding the v1 (bft.units=h) SASRec bft cell")
    ap.add_argument("--grid", type=Path, help="variants: the sweep config whose dataset x variant x seed is expected")
    args = ap.parse_args(argv)
    args.command = command_line("ablation", argv)
    runs = load_runs(args.runs)
    plain = [str(r["_dir"]) for r in runs if "tau" not in (r.get("layer_config") or {})]
    if plain:
        raise SystemExit(f"bftrec-report ablation: {len(plain)} run(s) under {args.runs} have no τ settings (not a BFT "
                         f"layer), e.g. {plain[0]}; give a folder of BFT runs of the τ ablation")
    if all(r["tag"].startswith("tau=") for r in runs):
        variant_tables(runs, args)
    elif args.compare or args.grid:
        raise SystemExit("bftrec-report ablation: --compare and --grid need a folder of tau=<variant> runs "
                         f"(configs/experiment/tau_ablation_count.yaml); {args.runs} holds untagged runs")
    else:
        v1_table(runs, args)


if __name__ == "__main__":
    main()
