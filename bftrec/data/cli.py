"""``bftrec-data``: list, inspect, prepare (cache) and download datasets.

    bftrec-data list [--data-root D]
    bftrec-data stats <name> [--data-root D] [--cache-dir C]
    bftrec-data prepare <name> [--data-root D] [--cache-dir C]
    bftrec-data download <name> [--data-root D]

``--config-dir DIR`` (before the command, as ``bftrec-train --config-dir``) adds a folder of your own configs:
``DIR/dataset/<name>.yaml`` is found first, then the built-in ``configs/dataset/<name>.yaml``.

Errors print one line on stderr and exit with status 2 (no traceback).
"""
from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from tabulate import tabulate

from bftrec.data.datasets import dataset_config, dataset_names, download, load_dataset, resolve_data_root
from bftrec.data.preprocess import report_table


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bftrec-data", description=__doc__.split("\n")[0])
    p.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    p.add_argument("--config-dir", default=None,
                   help="a folder of your own configs, as bftrec-train's: DIR/dataset/<name>.yaml comes first")
    sub = p.add_subparsers(dest="cmd", required=True)
    lp = sub.add_parser("list", help="list the dataset configs and whether each raw file is present")
    lp.add_argument("--data-root", default=None, help="data root (default: $BFTREC_DATA_ROOT)")
    for name, text in (("stats", "print statistics and the preprocessing report"),
                       ("prepare", "read and preprocess into the cache"),
                       ("download", "download the raw file (where a url is known)")):
        sp = sub.add_parser(name, help=text)
        sp.add_argument("name", help="dataset name (configs/dataset/<name>.yaml)")
        sp.add_argument("--data-root", default=None, help="data root (default: $BFTREC_DATA_ROOT)")
        if name != "download":
            sp.add_argument("--cache-dir", default=None,
                            help="cache folder (default: $BFTREC_CACHE_DIR or ~/.cache/bftrec)")
    return p


def _user_dir(config_dir: Optional[str]) -> Optional[Path]:
    """``<config_dir>/dataset`` (None without --config-dir); a missing folder is a one-line error."""
    if config_dir is None:
        return None
    if not Path(config_dir).is_dir():
        raise ValueError(f"--config-dir {config_dir}: no such folder; give the folder that holds dataset/<name>.yaml")
    return Path(config_dir) / "dataset"


def _names(config_dir: Optional[str]) -> list[str]:
    user = _user_dir(config_dir)
    return sorted(set(dataset_names()) | (set(dataset_names(user)) if user and user.is_dir() else set()))


def _config(name: str, config_dir: Optional[str]):
    """The dataset config ``name``: from ``--config-dir`` first, then the built-in ones."""
    user = _user_dir(config_dir)
    if user is not None and (user / f"{name}.yaml").is_file():
        return dataset_config(name, user)
    if name not in dataset_names() and user is not None:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(_names(config_dir))}")
    return dataset_config(name)


def _list(data_root: Optional[str], config_dir: Optional[str] = None) -> None:
    """One row per dataset config: format, k-core, raw file and whether it is under the data root."""
    try:
        root: Optional[Path] = resolve_data_root(data_root)
    except ValueError:  # no data root set: presence unknown, say how to set it
        root = None
    rows = []
    for name in _names(config_dir):
        cfg = _config(name, config_dir)
        if not cfg.path:
            present = "built in"
        elif root is None:
            present = "? (no data root)"
        else:
            present = "yes" if (root / cfg.path).is_file() else \
                (f"no (bftrec-data download {name})" if cfg.url else "no")
        rows.append((name, cfg.format, cfg.kcore, cfg.path or "-", present))
    print(f"data root: {root if root is not None else 'not set (set BFTREC_DATA_ROOT or pass --data-root)'}")
    print(tabulate(rows, headers=("name", "format", "kcore", "raw file", "present"), tablefmt="simple"))


def _stats(name: str, data_root: Optional[str], cache_dir: Optional[str], config_dir: Optional[str] = None) -> None:
    data = load_dataset(_config(name, config_dir), data_root, cache_dir)
    s = data.stats
    print(f"{name}: preprocessing report")
    print(report_table({k: v for k, v in s.items() if k != "source"}))
    if s.get("source"):
        print(f"source: {s['source'].get('path')} (sha256 {s['source'].get('sha256')})")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``bftrec-data`` console script; returns the exit status."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.cmd == "list":
            _list(args.data_root, args.config_dir)
        elif args.cmd == "stats":
            _stats(args.name, args.data_root, args.cache_dir, args.config_dir)
        elif args.cmd == "prepare":
            data = load_dataset(_config(args.name, args.config_dir), args.data_root, args.cache_dir)
            where = "generated, not cached" if data.stats.get("source") is None else "cached"
            print(f"{args.name}: {data.n_users:,} users, {data.n_items:,} items, "
                  f"{len(data.items):,} interactions ({where})")
        elif args.cmd == "download":
            print(download(_config(args.name, args.config_dir), args.data_root))
    except (ValueError, KeyError, OSError) as err:
        msg = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
        print(f"bftrec-data: error: {' '.join(str(msg).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
