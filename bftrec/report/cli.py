"""``bftrec-report``: tables, figures and comparisons from run directories, one console script.

    bftrec-report tables   --runs results/paper_main/runs --grid configs/experiment/paper/main.yaml \
        --out results/paper_main/tables
    bftrec-report figures  --runs results/paper_main/runs --out results/paper_main/figures
    bftrec-report variants --runs results/windows/runs --baseline windows=last --out results/windows/tables
    bftrec-report ablation --runs results/tau_ablation_count/runs --out results/tau_ablation_count/tables
    bftrec-report same     results/paper_cpu/runs/office/sasrec results/office_sasrec/runs
    bftrec-report valid-test results/paper_main/runs/ml-1m/hstu/standard --out valid_vs_test.md
    bftrec-report seconds  results/paper_main/runs/ml-1m/bert4rec/bft --from-epoch 76
    bftrec-report sweep    --comparisons results/snr/tables/comparisons.csv --key dataset.inject_rate \
        --out results/snr/sweep

Every subcommand reads only what runs wrote (``metrics.json``, ``ranks.csv.gz``, ``history.csv``, the configs);
``bftrec-report <subcommand> -h`` lists its options. The layout of the modules: ``docs/DESIGN.md``.
"""
from __future__ import annotations

import importlib
import logging
import sys

SUBCOMMANDS = {
    "tables": ("bftrec.report.tables", "overall, strata, mechanism, beyond-accuracy, summary and meta-analysis tables"),
    "figures": ("bftrec.report.figures", "gain by stratum with seed-unit intervals, K by stratum, training curves"),
    "variants": ("bftrec.report.variants", "tagged variants of one setting against a baseline tag"),
    "ablation": ("bftrec.report.ablation", "the τ ablation tables"),
    "same": ("bftrec.report.same", "do two folders of runs give the same test metrics, within a tolerance?"),
    "valid-test": ("bftrec.report.valid_test", "validation against test, run by run"),
    "seconds": ("bftrec.report.seconds", "training and validation seconds of finished runs"),
    "sweep": ("bftrec.report.sweep", "the gain against a swept setting (a tables folder's comparisons.csv)"),
}


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    return ("usage: bftrec-report <subcommand> [options]   (bftrec-report <subcommand> -h for its options)\n\n"
            + "\n".join(f"  {name:<{width}}  {text}" for name, (_, text) in SUBCOMMANDS.items()))


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand on ``argv`` (default ``sys.argv[1:]``); returns its exit status.

    Raises:
        SystemExit: argparse's own errors of a subcommand (status 2). A subcommand's one-line refusal (no runs, a
            missing cell, ...) is printed and returns 2, as an unknown subcommand does.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    sub, rest = argv[0], argv[1:]
    if sub not in SUBCOMMANDS:
        print(f"bftrec-report: unknown subcommand {sub!r}; pick one of {', '.join(SUBCOMMANDS)}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    module = importlib.import_module(SUBCOMMANDS[sub][0])
    try:
        return module.main(rest) or 0
    except SystemExit as e:  # a report's one-line refusal: exit 2, as bftrec-train and bftrec-tune
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    raise SystemExit(main())
