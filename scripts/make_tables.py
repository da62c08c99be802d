"""Tables from run directories: numbers come only from ``metrics.json`` and ``ranks.csv.gz``, never logs.

``config.yaml`` and ``env.json`` are read too, for the comparability check and the header.

    python scripts/make_tables.py --runs results/office_sasrec/runs --out results/office_sasrec/tables
    python scripts/make_tables.py --runs results/paper_cpu/runs --grid configs/experiment/paper/cpu.yaml \
        --out results/paper_cpu/tables

Missing cells are never papered over: with ``--grid`` the expected cells are the grid config's
``hydra.sweeper.params`` (dataset x model x layer x seed); without it, every (dataset, model, tag,
layer) found is expected for every seed found, and an untagged BFT cell expects its standard twin.
A missing cell stops the script with the list (``--allow-partial`` writes the tables anyway and
names the missing cells in every header). Runs outside ``--grid`` are left out and named in the header.
Always an error: two runs of one cell, and runs compared with each other (seeds of a cell, BFT and its
standard twin) whose protocol or config differ beyond the layer, seed and tag.

Writes ``overall``, ``strata``, ``mechanism`` and ``summary`` tables as markdown and csv. A cell groups runs by
(dataset, model, tag, layer); values are mean ± std over seeds. BFT is compared with the standard
layer of the same (dataset, model) and tag, else the untagged one: relative gain of the means, and a paired test
over users — each user's metric is first averaged over seeds (seeds never count as extra users),
then a Wilcoxon signed-rank test (scipy) on the per-user differences. Every table starts with a
header: protocol, commit, hardware and date of the runs.
"""
from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from scipy.stats import wilcoxon

from bftrec.grid import AXES, config_diff, sweep_axes

METRICS = ("HR@10", "NDCG@10")


def load_runs(root: Path) -> list[dict]:
    """Every run below ``root``: its metrics.json plus the path of its ranks.csv.gz."""
    runs = []
    for mpath in sorted(root.rglob("metrics.json")):
        if mpath.parent.name.startswith("eval_"):
            continue  # re-scored copies (bftrec-eval) are not extra seeds
        m = json.loads(mpath.read_text())
        env = mpath.parent / "env.json"
        m["_env"] = json.loads(env.read_text()) if env.exists() else {}
        m["_ranks"] = mpath.parent / "ranks.csv.gz"
        m["_dir"] = mpath.parent
        m["tag"] = m.get("tag") or ""  # older runs wrote tag: null
        runs.append(m)
    if not runs:
        raise SystemExit(f"make_tables: no metrics.json under {root}; run the experiment first")
    return runs


def grid_cells(path: Path) -> set:
    """(dataset, model, tag "", layer, seed) of every cell a grid config sweeps (``hydra.sweeper.params``)."""
    try:
        axes = sweep_axes(path)
    except SystemExit as e:
        raise SystemExit(f"make_tables: {e}") from None
    return {(d, m, "", layer, int(s)) for d, m, layer, s in itertools.product(*(axes[k] for k in AXES))}


def missing_cells(runs: list[dict], expected: set | None = None) -> list[str]:
    """Cells expected but absent, as ``dataset/model[/tag]/layer: seeds a, b`` lines.

    Raises:
        SystemExit: two runs of the same cell (seeds would be double counted); names both folders.
    """
    found: dict = {}
    for r in runs:
        found.setdefault((r["dataset"], r["model"], r.get("tag", ""), r["layer"], r["seed"]), []).append(r["_dir"])
    dups = [f"{cell_name(*k[:4])} seed {k[4]}: {', '.join(map(str, v))}" for k, v in found.items() if len(v) > 1]
    if dups:
        raise SystemExit(f"make_tables: {len(dups)} cell(s) with more than one run; keep one each: {'; '.join(dups)}")
    if expected is None:
        seeds = {k[4] for k in found}
        groups = {k[:4] for k in found} | {(d, m, "", "standard") for d, m, t, layer, _ in found
                                           if layer != "standard" and not t}
        expected = {g + (s,) for g in groups for s in seeds}
    by_group: dict = {}
    for d, m, t, layer, s in sorted(expected - set(found)):
        by_group.setdefault(cell_name(d, m, t, layer), []).append(str(s))
    return [f"{g}: seeds {', '.join(s)}" for g, s in by_group.items()]


def cell_name(dataset: str, model: str, tag: str, layer: str) -> str:
    return "/".join(x for x in (dataset, model, tag, layer) if x)


def _config(run: dict) -> dict:
    path = run["_dir"] / "config.yaml"
    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


def check_comparable(groups: dict) -> None:
    """Refuse to compare runs whose protocol or config differ beyond layer.*, seed and tag (one line).

    Compared are the seeds of a cell and a BFT cell with its standard baseline (``baseline``).
    """
    allowed = ("layer.", "seed", "tag", "tuned_config")
    for key, rs in groups.items():
        base = baseline(groups, key) if key[3] != "standard" else None
        pool = rs + (base or [])
        ref, ref_cfg = pool[0], _config(pool[0])
        ref_proto = {k: v for k, v in ref["protocol"].items() if k != "repeat_target_share"}
        for r in pool[1:]:
            proto = {k: v for k, v in r["protocol"].items() if k != "repeat_target_share"}
            diff = [k for k in sorted(set(proto) | set(ref_proto)) if proto.get(k) != ref_proto.get(k)]
            diff += [k for k in config_diff(ref_cfg, _config(r)) if not k.startswith(allowed)]
            if diff:
                raise SystemExit(f"make_tables: {ref['_dir']} and {r['_dir']} are compared in one table but differ "
                                 f"at {', '.join(diff[:6])}; rerun one of them or keep them in separate folders")


def select_runs(root: Path, grid: Path | None, allow_partial: bool, prog: str = "make_tables") -> tuple:
    """Runs of ``root`` ready for tables or figures: (runs, missing cell lines, ignored run folders).

    With ``grid``, runs outside it are left out (and returned as ignored). Raises SystemExit on
    missing cells unless ``allow_partial``, on duplicate runs and on runs that are not comparable.
    """
    runs = load_runs(root)
    ignored = []
    cells_ = grid_cells(grid) if grid is not None else None
    if cells_ is not None:
        ignored = [str(r["_dir"]) for r in runs
                   if (r["dataset"], r["model"], r["tag"], r["layer"], r["seed"]) not in cells_]
        runs = [r for r in runs if str(r["_dir"]) not in ignored]
        if not runs:
            raise SystemExit(f"{prog}: no run under {root} belongs to the grid {grid}")
    missing = missing_cells(runs, cells_)
    if missing and not allow_partial:
        raise SystemExit(f"{prog}: cells missing under {root}: {'; '.join(missing)}. Finish them (a grid "
                         "rerun skips finished cells) or pass --allow-partial")
    check_comparable(cells(runs))
    return runs, missing, ignored


@functools.cache
def rank_table(path: Path) -> pd.DataFrame:
    """A run's ranks.csv.gz, read once (every stratum, metric and comparison reuses it; do not mutate)."""
    return pd.read_csv(path)


def per_user(run: dict, metric: str) -> pd.Series:
    """Per-user 0/1 hit or NDCG at 10 from the run's rank table, indexed by user."""
    r = rank_table(run["_ranks"])
    k = int(metric.split("@")[1])
    val = (r["rank"] <= k).astype(float)
    if metric.startswith("NDCG"):
        val = val / np.log2(r["rank"] + 1)
    return pd.Series(val.to_numpy(), index=r["user"].to_numpy())


def paired_p(bft_runs: list[dict], std_runs: list[dict], metric: str, users=None) -> float | None:
    """Wilcoxon signed-rank p-value over users of seed-averaged per-user metrics (None if undefined)."""
    a = pd.concat([per_user(r, metric) for r in bft_runs], axis=1).mean(axis=1)
    b = pd.concat([per_user(r, metric) for r in std_runs], axis=1).mean(axis=1)
    a, b = a.align(b, join="inner")
    if users is not None:
        a, b = a[a.index.isin(users)], b[b.index.isin(users)]
    d = (a - b).to_numpy()
    if len(d) == 0 or np.all(d == 0):
        return None
    return float(wilcoxon(a.to_numpy(), b.to_numpy()).pvalue)


def fmt(values: list[float], digits: int = 4) -> str:
    v = [x for x in values if x is not None]
    if not v:
        return "–"
    return f"{np.mean(v):.{digits}f} ± {np.std(v, ddof=1):.{digits}f}" if len(v) > 1 else f"{v[0]:.{digits}f} (1 seed)"


def gain(bft: list, std: list) -> str:
    b, s = np.mean([x for x in bft if x is not None]), np.mean([x for x in std if x is not None])
    return f"{100 * (b - s) / s:+.1f}%" if s else "–"


QUIET = ("dataset=", "model=", "layer=", "seed=", "experiment=", "out_root=", "data_root=", "cache_dir=",
         "hydra", "trainer.num_threads=", "trainer.progress=", "trainer.device=", "log_level=")


def extra_overrides(runs: list[dict]) -> list[str]:
    """Command-line overrides of the runs (``.hydra/overrides.yaml``) other than the grid axes and
    where-and-how-fast settings, with how many runs used each: a trial ``trainer.epochs=2`` shows."""
    count: dict = {}
    for r in runs:
        path = r["_dir"] / ".hydra" / "overrides.yaml"
        for o in (yaml.safe_load(path.read_text()) or []) if path.exists() else []:
            if not o.lstrip("+~").startswith(QUIET):
                count[o] = count.get(o, 0) + 1
    return [f"{o} ({n} runs)" for o, n in sorted(count.items())]


def header(runs: list[dict], missing: list[str], ignored: list[str] = ()) -> str:
    shas = sorted({r["_env"].get("git_sha", "?")[:10] + ("+dirty" if r["_env"].get("git_dirty") else "")
                   for r in runs})
    hw = sorted({f"{r['_env'].get('device', '?')} ({r['_env'].get('device_name', '')}, "
                 f"{r['_env'].get('threads', '?')} threads)" for r in runs})
    dates = sorted(r["_env"].get("started", "?")[:10] for r in runs)
    protocols: dict = {}
    for r in runs:
        p = r["protocol"]
        text = (f"{p['split']}; candidates: {p['candidates']}; history excluded: {p['exclude_history']} "
                f"(repeat target: {p['repeat_target']}); ties: {p['ties']}; selection: {p['epoch_selection']}")
        protocols.setdefault(text, set()).add(r["dataset"])
    lines = [f"- protocol: {t}" + (f" [{', '.join(sorted(d))}]" if len(protocols) > 1 else "")
             for t, d in protocols.items()]
    lines += [f"- commit(s): {', '.join(shas)}; hardware: {'; '.join(hw)}; run dates: {dates[0]} .. {dates[-1]}",
              f"- runs: {len(runs)}; generated by `python {' '.join(sys.argv)}` "
              "(numbers from metrics.json and ranks.csv.gz only)"]
    extra = extra_overrides(runs)
    if extra:
        lines.append(f"- overrides beyond dataset, model, layer, seed: {'; '.join(extra)}")
    if missing:
        lines.append(f"- **PARTIAL: {len(missing)} cell groups missing** ({'; '.join(missing)}); "
                     "means, gains and p-values use the seeds present")
    if ignored:
        lines.append(f"- left out: {len(ignored)} runs outside the grid ({'; '.join(ignored)})")
    return "\n".join(lines)


def cells(runs: list[dict]) -> dict:
    out: dict = {}
    for r in runs:
        out.setdefault((r["dataset"], r["model"], r.get("tag", ""), r["layer"]), []).append(r)
    return out


def baseline(groups: dict, key: tuple) -> list[dict] | None:
    ds, model, tag, _ = key
    return groups.get((ds, model, tag, "standard")) or groups.get((ds, model, "", "standard"))


def overall_table(groups: dict) -> pd.DataFrame:
    rows = []
    for key, rs in sorted(groups.items()):
        row = {"dataset": key[0], "model": key[1], "tag": key[2], "layer": key[3], "seeds": len(rs)}
        base = baseline(groups, key) if key[3] != "standard" else None
        for m in METRICS:
            vals = [r["test"]["overall"][m] for r in rs]
            row[m] = fmt(vals)
            if base:
                row[f"{m} gain"] = gain(vals, [r["test"]["overall"][m] for r in base])
                p = paired_p(rs, base, m)
                row[f"{m} p"] = f"{p:.3g}" if p is not None else "–"
        row["valid NDCG@10"] = fmt([r["valid"]["NDCG@10"] for r in rs])
        epochs = [r["best_epoch"] for r in rs]
        row["best epoch"] = f"{np.mean(epochs):.1f} ± {np.std(epochs, ddof=1) if len(epochs) > 1 else 0.0:.1f}"
        rows.append(row)
    return pd.DataFrame(rows).fillna("")


def strata_table(groups: dict) -> pd.DataFrame:
    rows = []
    for key, rs in sorted(groups.items()):
        base = baseline(groups, key) if key[3] != "standard" else None
        strata = [(b["bin"], i, f"{b['lo']}-{b['hi']}") for i, b in enumerate(rs[0]["test"]["by_item_freq"])]
        strata += [("cold", "cold_users", f"hist<={rs[0]['test']['cold_users']['max_history']}"),
                   ("warm", "warm_users", "")]
        for name, where, rng in strata:
            def get(r, m, where=where):
                return (r["test"]["by_item_freq"][where] if isinstance(where, int) else r["test"][where])[m]
            row = {"dataset": key[0], "model": key[1], "tag": key[2], "layer": key[3], "stratum": name,
                   "range": rng, "users": get(rs[0], "n_users")}
            users = _stratum_users(rs[0], where)
            for m in METRICS:
                vals = [get(r, m) for r in rs]
                row[m] = fmt(vals)
                if base:
                    row[f"{m} gain"] = gain(vals, [get(r, m) for r in base])
                    p = paired_p(rs, base, m, users)
                    row[f"{m} p"] = f"{p:.3g}" if p is not None else "–"
            rows.append(row)
    return pd.DataFrame(rows).fillna("")


def _stratum_users(run: dict, where) -> np.ndarray:
    r = rank_table(run["_ranks"])
    if isinstance(where, int):
        b = run["test"]["by_item_freq"][where]
        if b["lo"] is None:
            return np.array([], dtype=np.int64)
        return r["user"][(r["target_count"] >= b["lo"]) & (r["target_count"] <= b["hi"])].to_numpy()
    thr = run["test"]["cold_users"]["max_history"]
    sel = r["history_len"] <= thr if where == "cold_users" else r["history_len"] > thr
    return r["user"][sel].to_numpy()


def mechanism_table(groups: dict) -> pd.DataFrame:
    rows = []
    for key, rs in sorted(groups.items()):
        if "mechanism" not in rs[0]:
            continue
        for i, b in enumerate(rs[0]["mechanism"]["by_item_freq"]):
            rows.append({"dataset": key[0], "model": key[1], "tag": key[2], "stratum": b["bin"],
                         "range": f"{b['lo']}-{b['hi']}",
                         "mean K": fmt([r["mechanism"]["by_item_freq"][i]["K"] for r in rs]),
                         "mean λ0": fmt([r["mechanism"]["by_item_freq"][i]["lam0"] for r in rs])})
        for g in ("cold_users", "warm_users"):
            rows.append({"dataset": key[0], "model": key[1], "tag": key[2], "stratum": g.split("_")[0],
                         "range": "", "mean K": fmt([r["mechanism"][g]["K"] for r in rs]),
                         "mean λ0": fmt([r["mechanism"][g]["lam0"] for r in rs])})
        for layer in rs[0]["mechanism"]["per_layer"]:
            i = layer["layer"]
            init = [(r["mechanism"].get("gain_first_batch") or {}).get("initial_K_per_layer") for r in rs]
            rows.append({"dataset": key[0], "model": key[1], "tag": key[2], "stratum": f"layer {i}",
                         "range": "all tokens",
                         "mean K": fmt([r["mechanism"]["per_layer"][i]["K"] for r in rs]),
                         "mean λ0": "",
                         # K before the first step, on the first training batch (metrics.json gain_first_batch)
                         "K at init": fmt([k[i] if k else None for k in init], digits=5)})
    return pd.DataFrame(rows)


def summary_table(overall: pd.DataFrame, strata: pd.DataFrame, mech: pd.DataFrame) -> pd.DataFrame:
    """One row per BFT cell with a baseline: the paper's claims side by side (overall, rarest bin Q0,
    cold users, and K / λ0 on the rarest and the most popular bin). Built from the other three tables."""
    key = ["dataset", "model", "tag"]
    rows = []
    for _, b in overall[overall["layer"] != "standard"].iterrows():
        if not b.get("HR@10 gain"):
            continue
        std = overall[(overall[key] == b[key]).all(axis=1) & (overall["layer"] == "standard")]
        st = strata[(strata[key] == b[key]).all(axis=1) & (strata["layer"] == b["layer"])].set_index("stratum")
        q0, qn = st.index[0], [x for x in st.index if x.startswith("Q")][-1]
        row = {**b[key].to_dict(), "seeds": b["seeds"],
               "HR@10 standard": std["HR@10"].iloc[0] if len(std) else "–", "HR@10 BFT": b["HR@10"],
               "HR@10 gain (p)": f"{b['HR@10 gain']} ({b['HR@10 p']})",
               "NDCG@10 gain (p)": f"{b['NDCG@10 gain']} ({b['NDCG@10 p']})",
               f"{q0} HR@10 gain (p)": f"{st.loc[q0, 'HR@10 gain']} ({st.loc[q0, 'HR@10 p']})",
               "cold HR@10 gain (p)": f"{st.loc['cold', 'HR@10 gain']} ({st.loc['cold', 'HR@10 p']})"}
        if len(mech):
            mk = mech[(mech[key] == b[key]).all(axis=1)].set_index("stratum")
            if q0 in mk.index:
                row[f"K {q0} / {qn}"] = f"{mk.loc[q0, 'mean K'].split(' ')[0]} / {mk.loc[qn, 'mean K'].split(' ')[0]}"
                row[f"λ0 {q0} / {qn}"] = (f"{mk.loc[q0, 'mean λ0'].split(' ')[0]} / "
                                          f"{mk.loc[qn, 'mean λ0'].split(' ')[0]}")
        rows.append(row)
    return pd.DataFrame(rows)


def write(df: pd.DataFrame, out: Path, name: str, title: str, head: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / f"{name}.csv", index=False)
    (out / f"{name}.md").write_text(f"# {title}\n\n{head}\n\n{df.to_markdown(index=False)}\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, required=True, help="folder searched for metrics.json")
    ap.add_argument("--out", type=Path, required=True, help="folder for the tables")
    ap.add_argument("--grid", type=Path, help="grid config whose cells are expected (configs/experiment/paper/*.yaml)")
    ap.add_argument("--allow-partial", action="store_true",
                    help="write tables despite missing cells (named in the header)")
    args = ap.parse_args(argv)
    runs, missing, ignored = select_runs(args.runs, args.grid, args.allow_partial)
    groups = cells(runs)
    head = header(runs, missing, ignored)
    overall, strata, mech = overall_table(groups), strata_table(groups), mechanism_table(groups)
    write(overall, args.out, "overall", "Overall test metrics (mean ± std over seeds)", head)
    write(strata, args.out, "strata", "Test metrics by stratum (mean ± std over seeds)", head)
    if len(mech):
        write(mech, args.out, "mechanism", "BFT mechanism by stratum (test histories, mean ± std over seeds)",
              head)
    summary = summary_table(overall, strata, mech)
    if len(summary):
        write(summary, args.out, "summary", "BFT against standard: overall, rarest items, cold users, mechanism "
              "(test; gains are relative, p from the paired Wilcoxon test)", head)


if __name__ == "__main__":
    main()
