"""HSTU at initialisation: how large the attention output ``m`` is against LN2's eps.

Builds HSTU (tuned config of ``--dataset``, seed 0), runs the first training batch in eval mode and
prints JSON per block: the mean over real tokens of Var_D(m) (the per-token variance LN2 divides
by), LN2's eps, and the std of LN2(m). Usage (needs BFTREC_DATA_ROOT)::

    python results/diag/hstu_init_stats.py --dataset ml-100k
"""
from __future__ import annotations

import argparse
import json

import torch
from hydra import compose, initialize_config_dir

from bftrec.config import CONFIG_DIR
from bftrec.experiment import build, typed_groups
from bftrec.trainer import train_window_set


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="ml-100k")
    ap.add_argument("--batch", type=int, default=128)
    args = ap.parse_args()
    torch.manual_seed(0)
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("train", overrides=[f"dataset={args.dataset}", "model=hstu"])
    g = typed_groups(cfg)
    data, _, model = build(g, torch.device("cpu"))
    batch = train_window_set(data, g["model"].max_len, torch.device("cpu")).first(args.batch)
    stats, hooks = [], []
    for block in model.stack.blocks:
        def hook(mod, inp, out, block=block):
            m = out[0]  # (B, T, D) attention output
            real = m.abs().sum(-1) > 0
            var = m.var(-1, unbiased=False)[real]
            stats.append({"var_m_mean": float(var.mean()), "var_m_median": float(var.median()),
                          "ln2_eps": block.ln2.eps, "ln2_out_std": float(block.ln2(m)[real].std())})
        hooks.append(block.attn.register_forward_hook(hook))
    model.eval()
    with torch.no_grad():
        inputs = batch["seq"][:, 1:]
        model.encode(inputs, batch["time"][:, 1:] if "time" in batch and g["model"].time_bias else None)
    print(json.dumps({"dataset": args.dataset, "blocks": stats}, indent=2))


if __name__ == "__main__":
    main()
