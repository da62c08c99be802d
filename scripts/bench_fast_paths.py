"""CPU time of a training step under each opt-in fast path of the trainer (issue 49 items 1-3). Never a test.

SASRec on Amazon Sports at its tuned config (``configs/tuned/sports_sasrec.yaml``: CE, ``prefixes``), CPU, one
thread; ``--model bert4rec|hstu`` takes that backbone's tuned Sports config instead (its own loss and training
windows). The same ``--steps`` batches of epoch 1 (the trainer's windows in its batch order, left padding trimmed)
run under each setting, in ``--rounds`` interleaved rounds so that a drift of the machine
load hits every setting alike:

- ``reference``: the defaults (full forward, ``nn.Dropout``, Adam's foreach kernel);
- ``last_position_only``, ``dropout=mask``, ``fused_optimizer``: one path each;
- ``all``: the three together;
- ``bft``: ``layer=bft`` at the same config (BFT's cost in the tuned setting: its ratio to ``reference``);
- ``bft_compiled``: ``layer=bft`` with ``trainer.compile_precision=true`` (the precision formulas through
  ``torch.compile``; compiled in the untimed first batch).

``--settings`` picks a subset (``reference`` is always run). ``--profile N`` then runs ``N`` more steps of each
setting under ``torch.profiler`` and writes its operator table (self CPU time, top 25) per setting to
``<out>.profile.txt``, with the milliseconds per step: where a setting's extra time goes.

Each setting has its own model and optimizer, built from the same seed. Time is the process CPU time of zero_grad,
loss, backward and the optimizer step (``time.process_time``: one thread, so another job on the machine moves it
little); the JSON gives per setting the median over rounds of the CPU seconds per step and its ratio to
``reference`` measured in the same round. Peak memory is not compared here (one process holds all five).

Usage (needs ``$BFTREC_DATA_ROOT`` holding Amazon Sports)::

    BFTREC_DATA_ROOT=/work/shared/data .venv/bin/python scripts/bench_fast_paths.py --steps 20 --rounds 3

Writes ``results/bench/fast_paths_cpu.json`` (or ``--out``).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bftrec.experiment import code_stamp, cpu_name  # noqa: E402
from bftrec.trainer import (  # noqa: E402
    _optimizer,
    check_fast_paths,
    epoch_batches,
    step_batch,
    train_window_set,
    use_mask_dropout,
)

SETTINGS = {
    "reference": [],
    "last_position_only": ["trainer.last_position_only=true"],
    "dropout_mask": ["trainer.dropout=mask"],
    "fused_optimizer": ["trainer.fused_optimizer=true"],
    "all": ["trainer.last_position_only=true", "trainer.dropout=mask", "trainer.fused_optimizer=true"],
    "bft": ["layer=bft"],
    "bft_compiled": ["layer=bft", "trainer.compile_precision=true"],
}
BASE = ["dataset=sports", "trainer.device=cpu", "trainer.num_threads=1"]
MODELS = ("sasrec", "bert4rec", "hstu")


def build(extra: list[str], model_name: str = "sasrec"):
    """(model, optimizer, trainer config, data) of one setting, seeded as the trainer seeds a run."""
    from hydra import compose, initialize_config_dir

    from bftrec.config import CONFIG_DIR
    from bftrec.experiment import build as build_model
    from bftrec.experiment import typed_groups
    from bftrec.trainer import seed_everything

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        g = typed_groups(compose("train", overrides=BASE + [f"model={model_name}"] + extra))
    seed_everything(g["root"].seed, False)
    data, _, model = build_model(g, torch.device("cpu"))
    tc = g["trainer"]
    check_fast_paths(tc, model, torch.device("cpu"))
    if tc.dropout == "mask":
        use_mask_dropout(model)
    if tc.compile_precision:
        model.stack.compile_precision = True
    return model.train(), _optimizer(model, tc), tc, data, g["model"].max_len


def step(model, opt, t, batch: dict) -> torch.Tensor:
    """One training step of a setting (zero_grad, loss, backward, optimizer step); returns the loss."""
    loss = model.training_loss({**batch, "last_position_only": t.last_position_only})
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


def profile(runs: dict, batches: list[dict], path: Path, command: str) -> None:
    """Each setting's operator table over ``batches`` (self CPU time, top 25), into ``path``."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    parts = [f"# {command}\n# torch.profiler over {len(batches)} steps per setting (zero_grad, loss, backward, step)\n"]
    for name, (model, opt, t, _, _) in runs.items():
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            for b in batches:
                step(model, opt, t, b)
        events = prof.key_averages()
        per_step = sum(e.self_cpu_time_total for e in events) / 1e3 / len(batches)
        parts.append(f"\n## {name}: {per_step:.1f} ms self CPU per step\n"
                     + events.table(sort_by="self_cpu_time_total", row_limit=25))
    path.write_text("\n".join(parts))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20, help="timed steps per setting and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated subset of " + ",".join(SETTINGS))
    ap.add_argument("--profile", type=int, default=0, help="profile this many more steps per setting (0: none)")
    ap.add_argument("--model", default="sasrec", choices=MODELS, help="the backbone, at its tuned Sports config")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench" / "fast_paths_cpu.json"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    names = ["reference"] + [n for n in args.settings.split(",") if n and n != "reference"]
    unknown = sorted(set(names) - set(SETTINGS))
    if unknown:
        raise SystemExit(f"bench_fast_paths: --settings {','.join(unknown)}: unknown; choose from {','.join(SETTINGS)}")
    runs = {name: build(SETTINGS[name], args.model) for name in names}  # a path the model cannot take: one line
    _, _, tc, data, max_len = runs["reference"]
    tw = train_window_set(data, max_len, torch.device("cpu"), tc.train_windows, tc.train_window_stride)
    order = epoch_batches(tw.lengths(), tc.batch_size, torch.Generator().manual_seed(0), 0, 1, tc.length_bucketing)
    batches = [step_batch(tw, i, tc) for i in order[: args.steps + 1]]  # as the trainer cuts them (``step``
    # sets each setting's last_position_only)
    per_round: dict = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, (model, opt, t, _, _) in runs.items():
            cpu = 0.0
            for k, b in enumerate(batches):
                c0 = time.process_time()
                step(model, opt, t, b).item()
                if k:  # the first batch of a round warms up
                    cpu += time.process_time() - c0
            per_round[name].append(cpu / args.steps)
    ratio = {n: [a / b for a, b in zip(v, per_round["reference"])] for n, v in per_round.items()}
    loss = getattr(getattr(runs["reference"][0], "cfg", None), "loss", "?")
    out = {"command": "python scripts/bench_fast_paths.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "setting": f"sports {args.model} at its tuned config (loss {loss}, windows {tc.train_windows}), CPU, "
                      "1 thread, process CPU time per step",
           "torch": torch.__version__, "steps": args.steps, "rounds": args.rounds,
           **code_stamp(), "cpu": cpu_name(),
           "cpu_s_per_step": {n: statistics.median(v) for n, v in per_round.items()},
           "ratio_to_reference": {n: statistics.median(v) for n, v in ratio.items()},
           "per_round_cpu_s_per_step": per_round,
           "mean_targets_per_step": float(np.mean([b["seq"].shape[0] for b in batches[1:]]))}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    if args.profile:
        profile(runs, batches[1:args.profile + 1], Path(args.out).with_suffix(".profile.txt"), out["command"])
    print(json.dumps(out["ratio_to_reference"], indent=2))


if __name__ == "__main__":
    main()
