"""Readouts of the positive control (issue 46 item 2): can this BFT learn reliability where it exists?

    python results/positive_control/readout.py --root results/positive_control

Reads the runs under ``<root>/runs`` (configs/experiment/positive_control*.yaml; each with metrics.json,
ranks.csv.gz, config.yaml and, for the mechanism readouts, its checkpoint.pt) and the generator's ground
truth (``bftrec.data.synthetic.generate_with_truth``: which items are unreliable, which positions were
inserted, which users are noisy), and writes ``<root>/readout.json`` and ``<root>/readout.md``:

- per arm against ``standard`` on the planted data (and ``bft`` against ``standard`` on the clean null): the
  HR@10 gain with the training seed as the unit (``bftrec.report.stats``: mean per-seed gain, t-test over
  seeds, an interval with retraining and test-user noise, the gain detectable at power 0.8), for all users,
  for the users whose last history item is unreliable (the item to predict does not depend on it), for the
  noisy users and for those of them whose test target is genuine (not an inserted random item);
- per BFT arm and seed, on the test histories at the best checkpoint: the Spearman correlation of each item's
  mean λ⁰ with its true reliability (1 reliable, 0 not); the AUROC with which K (mean over blocks) separates
  planted tokens (unreliable items and inserted items) from clean ones, P(K_planted > K_clean), for both kinds
  together and apart (a Kalman filter that knows a token is unreliable trusts it less and the context more:
  a higher gain K on the observation, docs/BFT.md §2); and P(λ⁰_planted < λ⁰_clean). 0.5 = no separation.
"""
from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from scipy.stats import spearmanr
from sklearn.metrics import roc_auc_score

from bftrec.config import load_run_config
from bftrec.data.batches import loo_split, windows
from bftrec.data.synthetic import generate_with_truth
from bftrec.experiment import build, typed_groups
from bftrec.layers import masked_softmax
from bftrec.report.stats import mde_seeds, seed_t_p, seed_user_ci
from bftrec.trainer import load_checkpoint, load_weights

log = logging.getLogger("positive_control")
K = 10
# arm name -> (dataset, layer, tag) ; every arm is compared with standard on the same data
ARMS = {"bft": ("pc_planted", "bft", ""), "bft_h": ("pc_planted", "bft_h", ""),
        "bft tau=mlp": ("pc_planted", "bft", "tau=mlp"), "bft tau=lr100": ("pc_planted", "bft", "tau=lr100"),
        "oracle (standard, planted inputs dropped)": ("pc_oracle", "standard", ""),
        "clean null: bft": ("pc_clean", "bft", "")}
BASE = {"pc_planted": ("pc_planted", "standard", ""), "pc_oracle": ("pc_planted", "standard", ""),
        "pc_clean": ("pc_clean", "standard", "")}


def find_runs(root: Path) -> dict:
    """{(dataset, layer, tag): {seed: run dir}} of the finished runs (metrics.json present)."""
    out: dict = {}
    for m in sorted(root.rglob("metrics.json")):
        d = json.loads(m.read_text())
        out.setdefault((d["dataset"], d["layer"], d.get("tag") or ""), {})[d["seed"]] = m.parent
    return out


def user_truth(run_dir: Path) -> tuple[pd.DataFrame, dict, np.ndarray]:
    """Per test user (internal index): last history item unreliable, noisy user; the data's ground truth
    ({item id (internal) -> reliable}) and (nnz,) bool planted flags aligned to the data's item array."""
    g = typed_groups(load_run_config(run_dir))
    data, _, _ = build(g, torch.device("cpu"))
    frame, truth = generate_with_truth(g["dataset"].synthetic)
    if not np.array_equal(data.item_ids[data.items].astype(str), frame["item"].to_numpy(dtype=str)):
        raise SystemExit(f"positive_control: the data of {run_dir} do not line up with the generator's frame")
    reliable = np.array([True] + [truth["item_reliable"][str(i)] for i in data.item_ids[1:]])  # by internal id
    split = loo_split(data.items, data.offsets, "test")
    last = data.items[split.end - 1]
    noisy = np.array([truth["noisy_user"][str(u)] for u in data.user_ids[split.users]])
    target_inserted = truth["inserted"][split.end]  # the test target row itself is a random insertion
    users = pd.DataFrame({"user": split.users, "unreliable_last": ~reliable[last], "noisy": noisy,
                          "noisy_genuine_target": noisy & ~target_inserted})
    return users, {"reliable": reliable, "inserted": truth["inserted"], "data": data, "g": g}, truth["planted"]


def hits(run_dir: Path) -> pd.Series:
    r = pd.read_csv(run_dir / "ranks.csv.gz")
    return pd.Series((r["rank"] <= K).astype(float).to_numpy(), index=r["user"].to_numpy())


def compare(arm: dict, base: dict, users: pd.DataFrame) -> dict:
    """Seed-unit HR@10 gain of ``arm`` over ``base`` ({seed: run dir}) per user group."""
    seeds = sorted(set(arm) & set(base))
    out = {"seeds": seeds}
    groups = {"all users": np.ones(len(users), dtype=bool), "unreliable last item": users["unreliable_last"].to_numpy(),
              "noisy users": users["noisy"].to_numpy(),
              "noisy users, genuine target": users["noisy_genuine_target"].to_numpy()}
    for name, sel in groups.items():
        keep = users["user"].to_numpy()[sel]
        if not len(keep):
            out[name] = {"users": 0}
            continue
        pairs, gains = [], []
        for s in seeds:
            a, b = hits(arm[s]).loc[keep].to_numpy(), hits(base[s]).loc[keep].to_numpy()
            pairs.append((a, b))
            gains.append(a.sum() / b.sum() - 1 if b.sum() else None)
        ci = seed_user_ci(pairs)
        defined = bool(gains) and all(g is not None and np.isfinite(g) for g in gains)
        out[name] = {"users": int(sel.sum()), "HR@10 arm": float(np.mean([p[0].mean() for p in pairs])),
                     "HR@10 standard": float(np.mean([p[1].mean() for p in pairs])),
                     "gain_seeds": float(np.mean(gains)) if defined else None,
                     "seed_gains": gains, "p_seeds": seed_t_p(gains), "ci": ci,
                     "mde_seeds": mde_seeds(gains) if defined else None}
    return out


def trained_model(run_dir: Path) -> tuple | None:
    """(typed config groups, data, model at its best checkpoint in eval mode) of a run; None without its
    checkpoint.pt (not committed: rerun the cell)."""
    ck_path = run_dir / "checkpoint.pt"
    if not ck_path.exists():
        return None
    g = typed_groups(load_run_config(run_dir))
    device = torch.device("cpu")
    data, _, model = build(g, device)
    load_weights(model, load_checkpoint(ck_path, device, fix="rerun the cell"), ck_path, "rerun the cell")
    return g, data, model.eval()


@torch.no_grad()
def mechanism_readout(run_dir: Path, ctx: dict, planted: np.ndarray) -> dict | None:
    """Spearman(item mean λ⁰, reliability) and AUROCs of K and λ⁰ for planted tokens, on the test histories."""
    loaded = trained_model(run_dir)
    if loaded is None:
        return None
    g, data, model = loaded
    split = loo_split(data.items, data.offsets, "test")
    L = g["model"].max_len
    inserted = ctx["inserted"].astype(np.int64)
    toks = {"item": [], "planted": [], "inserted": [], "K": [], "lam0": []}
    for lo in range(0, len(split.users), 512):
        sl = slice(lo, lo + 512)
        x = windows(data.items, split.start[sl], split.end[sl], L)  # (B, L) left-padded item ids
        p = windows(planted.astype(np.int64), split.start[sl], split.end[sl], L)  # (B, L) 1 = planted
        ins = windows(inserted, split.start[sl], split.end[sl], L)
        mech = model.mechanism({"item_seq": torch.from_numpy(x)})
        valid = x != 0
        k = torch.stack([lay["K"] for lay in mech["layers"]]).mean(0).numpy()  # (B, L) mean over blocks
        toks["item"].append(x[valid])
        toks["planted"].append(p[valid].astype(bool))
        toks["inserted"].append(ins[valid].astype(bool))
        toks["K"].append(k[valid])
        toks["lam0"].append(mech["lam0"].numpy()[valid])
    t = {k: np.concatenate(v) for k, v in toks.items()}
    per_item = pd.DataFrame({"item": t["item"], "lam0": t["lam0"]}).groupby("item")["lam0"].mean()
    rel = ctx["reliable"][per_item.index.to_numpy()].astype(float)
    unrel = t["planted"] & ~t["inserted"]

    def auroc(score: np.ndarray, pos: np.ndarray, among: np.ndarray) -> float | None:
        """P(score of a positive > score of a negative) among the selected tokens."""
        y = pos[among]
        return float(roc_auc_score(y, score[among])) if 0 < y.sum() < len(y) else None

    clean = ~t["planted"]
    count = np.bincount(data.items, minlength=data.n_items + 1)[t["item"]].astype(float)  # each token's item count
    edges = np.quantile(count, [0.2, 0.4, 0.6, 0.8])
    cbin = np.searchsorted(edges, count, side="right")  # (T,) item-count quintile of each token

    def within_count(score: np.ndarray) -> float | None:
        """P(score_planted > score_clean) within each item-count quintile, token-weighted: the separation
        that item frequency alone does not explain (planted tokens are rarer)."""
        vals = [(auroc(score[cbin == q], t["planted"][cbin == q], np.ones((cbin == q).sum(), dtype=bool)),
                 (cbin == q).sum()) for q in range(5)]
        vals = [(v, w) for v, w in vals if v is not None]
        return float(np.average([v for v, _ in vals], weights=[w for _, w in vals])) if vals else None

    log_count = np.log1p(np.bincount(data.items, minlength=data.n_items + 1)[per_item.index.to_numpy()])
    partial = spearmanr(np.c_[per_item.to_numpy(), rel, log_count]).statistic  # (3, 3) rank correlations
    r_lr, r_lc, r_rc = partial[0, 1], partial[0, 2], partial[1, 2]
    tau = getattr(getattr(model, "stack", None), "tau", None)
    table = getattr(tau, "tau", None)  # (n_tokens, dims) with tau.kind=item
    lam = table.detach()[1:].float().exp().flatten().numpy() if isinstance(table, torch.nn.Parameter) else None
    return {"tokens": int(len(t["K"])), "planted share": float(t["planted"].mean()),
            "item lam0 min / median / max": [float(lam.min()), float(np.median(lam)), float(lam.max())]
            if lam is not None else None,
            "AUROC low item count alone, planted vs clean": auroc(-count, t["planted"], np.ones_like(clean)),
            "AUROC high K within item-count quintiles": within_count(t["K"]),
            "AUROC low lam0 within item-count quintiles": within_count(-t["lam0"]),
            "partial Spearman lam0 vs reliable given log count": float(
                (r_lr - r_lc * r_rc) / np.sqrt((1 - r_lc ** 2) * (1 - r_rc ** 2))),
            "spearman lam0 vs reliable (items)": float(spearmanr(per_item.to_numpy(), rel).statistic),
            "items": int(len(per_item)),
            "AUROC high K, planted vs clean": auroc(t["K"], t["planted"], np.ones_like(clean)),
            "AUROC high K, unreliable items vs clean": auroc(t["K"], unrel, unrel | clean),
            "AUROC high K, inserted vs clean": auroc(t["K"], t["inserted"], t["inserted"] | clean),
            "AUROC low lam0, planted vs clean": auroc(-t["lam0"], t["planted"], np.ones_like(clean)),
            "mean K planted / clean": [float(t["K"][t["planted"]].mean()), float(t["K"][clean].mean())]}


@torch.no_grad()
def attention_readout(run_dir: Path, planted: np.ndarray) -> dict | None:
    """``standard`` arms: the attention mass each history token receives from the scoring position (the
    last query; mean over heads and blocks), and the AUROC with which a low mass separates planted tokens
    from clean ones, P(mass_planted < mass_clean), overall and among the tokens at each distance from the
    end (attention favours recent tokens; the mean of the per-distance AUROCs, weighted by tokens)."""
    loaded = trained_model(run_dir)
    if loaded is None:
        return None
    g, data, model = loaded
    seen: list = []

    def hook(mod, args, _out):  # args = (x (B, T, D), masks, ...): the block's attention input
        q, k, _ = mod.heads(args[0])  # (B, H, T, d) each
        logits = q[:, :, -1:] @ k.transpose(-2, -1) / q.shape[-1] ** 0.5  # (B, H, 1, T)
        seen.append(masked_softmax(logits, args[1].attn[:, :, -1:]).mean(1)[:, 0])  # (B, T)

    handles = [b.attn.register_forward_hook(hook) for b in model.stack.blocks]
    split = loo_split(data.items, data.offsets, "test")
    L = g["model"].max_len
    mass, pl, dist = [], [], []
    for lo in range(0, len(split.users), 512):
        sl = slice(lo, lo + 512)
        x = windows(data.items, split.start[sl], split.end[sl], L)  # (B, L)
        p = windows(planted.astype(np.int64), split.start[sl], split.end[sl], L)
        seen.clear()
        model.encode(torch.from_numpy(x))
        m = torch.stack(seen).mean(0).numpy()  # (B, L) mean over blocks
        valid = x != 0
        mass.append(m[valid])
        pl.append(p[valid].astype(bool))
        dist.append(np.broadcast_to(np.arange(L)[::-1], x.shape)[valid])
    for h in handles:
        h.remove()
    mass, pl, dist = np.concatenate(mass), np.concatenate(pl), np.concatenate(dist)
    per, weights = [], []
    for d in np.unique(dist):
        sel = dist == d
        if 0 < pl[sel].sum() < sel.sum():
            per.append(roc_auc_score(pl[sel], -mass[sel]))
            weights.append(sel.sum())
    return {"AUROC low attention, planted vs clean": float(roc_auc_score(pl, -mass)),
            "same, within each distance from the end": float(np.average(per, weights=weights)),
            "mean attention planted / clean": [float(mass[pl].mean()), float(mass[~pl].mean())]}


def pct(x) -> str:
    return "–" if x is None else f"{100 * x:+.1f}%"


def markdown(out: dict) -> str:
    lines = ["# Positive control: readouts", "", f"Generated by `python results/positive_control/readout.py "
             f"--root {out['root']}`; statistics over training seeds (the unit of replication).", "",
             "## HR@10 gain over `standard` on the same data (mean per-seed gain; p: t-test over seeds; "
             "95% CI: retraining and test-user noise, `bftrec.report.stats.seed_user_ci`; MDE: gain detectable at "
             "power 0.8)", "",
             "| arm | group | seeds | users | HR@10 standard | HR@10 arm | gain | p_seeds | 95% CI | MDE |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    for arm, res in out["gains"].items():
        for group in ("all users", "unreliable last item", "noisy users", "noisy users, genuine target"):
            r = res[group]
            if not r["users"]:  # nothing planted (the clean null): the group is empty
                continue
            ci = f"[{pct(r['ci'][0])}, {pct(r['ci'][1])}]" if r["ci"] else "–"
            p = "–" if r["p_seeds"] is None else f"{r['p_seeds']:.3g}"
            mde = "–" if r["mde_seeds"] is None else f"{100 * r['mde_seeds']:.1f}%"
            lines.append(f"| {arm} | {group} | {len(res['seeds'])} | {r['users']} | {r['HR@10 standard']:.4f} | "
                         f"{r['HR@10 arm']:.4f} | {pct(r['gain_seeds'])} | {p} | {ci} | {mde} |")
    lines += ["", "## Mechanism against the ground truth (test histories, best checkpoint; mean ± SD over seeds)", "",
              "| arm | seeds | Spearman(λ⁰, reliable) | partial, given log count | AUROC high K: planted | "
              "unreliable items | inserted | within count quintiles | AUROC low λ⁰: planted | within count "
              "quintiles | low count alone | mean K planted / clean |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for arm, per_seed in out["mechanism"].items():
        rows = [v for v in per_seed.values() if v]
        if not rows:
            continue

        def ms(key, rows=rows):
            v = [r[key] for r in rows if r[key] is not None]
            return "–" if not v else f"{np.mean(v):.3f} ± {np.std(v, ddof=1):.3f}" if len(v) > 1 else f"{v[0]:.3f}"
        kp = np.mean([r["mean K planted / clean"] for r in rows], axis=0)
        lines.append(f"| {arm} | {len(rows)} | {ms('spearman lam0 vs reliable (items)')} | "
                     f"{ms('partial Spearman lam0 vs reliable given log count')} | "
                     f"{ms('AUROC high K, planted vs clean')} | {ms('AUROC high K, unreliable items vs clean')} | "
                     f"{ms('AUROC high K, inserted vs clean')} | {ms('AUROC high K within item-count quintiles')} | "
                     f"{ms('AUROC low lam0, planted vs clean')} | {ms('AUROC low lam0 within item-count quintiles')} | "
                     f"{ms('AUROC low item count alone, planted vs clean')} | {kp[0]:.3f} / {kp[1]:.3f} |")
    att = [v for v in out.get("attention", {}).values() if v]
    if att:
        def ma(key):
            v = [a[key] for a in att]
            return f"{np.mean(v):.3f} ± {np.std(v, ddof=1):.3f}" if len(v) > 1 else f"{v[0]:.3f}"
        mm = np.mean([a["mean attention planted / clean"] for a in att], axis=0)
        lines += ["", f"`standard` on the planted data ({len(att)} seeds): the attention mass the scoring position "
                  "gives each history token (mean over heads and blocks). AUROC of a low mass for planted tokens: "
                  f"{ma('AUROC low attention, planted vs clean')} over all tokens, "
                  f"{ma('same, within each distance from the end')} within each distance from the end; "
                  f"mean mass planted / clean {mm[0]:.4f} / {mm[1]:.4f}."]
    spread = [f"{arm} {', '.join(f'{v:.2g}' for v in np.median([r['item lam0 min / median / max'] for r in rows], 0))}"
              for arm, per_seed in out["mechanism"].items()
              if (rows := [v for v in per_seed.values() if v and v.get("item lam0 min / median / max")])]
    if spread:
        lines += ["", "Learned λ⁰ = e^τ over the item table (min, median, max; median over seeds): "
                  + "; ".join(spread)]
    lines += ["", "Best validation epochs (of the fixed 20): " + "; ".join(
        f"{k}: {v}" for k, v in out["best_epochs"].items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, required=True, help="the experiment's out_root (holds runs/)")
    args = ap.parse_args(argv)
    runs = find_runs(args.root / "runs")
    if not runs:
        raise SystemExit(f"positive_control: no finished run under {args.root / 'runs'}; run the experiment first")
    out = {"root": str(args.root), "gains": {}, "mechanism": {}, "attention": {}, "best_epochs": {}}
    truth: dict = {}
    for key, seeds in sorted(runs.items()):
        out["best_epochs"][" ".join(x for x in key if x)] = {
            s: json.loads((d / "metrics.json").read_text())["best_epoch"] for s, d in sorted(seeds.items())}
    for arm, key in ARMS.items():
        base_key = BASE[key[0]]
        if key not in runs or base_key not in runs:
            log.info("%s: no runs yet (needs %s and %s)", arm, key, base_key)
            continue
        ds = base_key[0]
        if ds not in truth:
            truth[ds] = user_truth(next(iter(runs[base_key].values())))
        users, ctx, planted = truth[ds]
        out["gains"][arm] = compare(runs[key], runs[base_key], users)
        if key[1] != "standard" and key[0] == "pc_planted":
            out["mechanism"][arm] = {s: mechanism_readout(d, ctx, planted) for s, d in sorted(runs[key].items())}
    base = runs.get(BASE["pc_planted"])
    if base and "pc_planted" in truth:
        out["attention"] = {s: attention_readout(d, truth["pc_planted"][2]) for s, d in sorted(base.items())}
    (args.root / "readout.json").write_text(json.dumps(out, indent=1, default=str) + "\n")
    (args.root / "readout.md").write_text(markdown(out))
    log.info("positive_control: wrote %s and %s", args.root / "readout.json", args.root / "readout.md")


if __name__ == "__main__":
    main()
