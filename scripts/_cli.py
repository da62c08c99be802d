"""Argument types shared by the benches (``scripts/bench_*.py``): a bad number or device is refused by argparse
in one line (``argument --steps: 0: give an integer >= 1``) before any timing starts, never a traceback after it;
and ``print_table``, the ``main`` of the scripts that print a table a README quotes."""
from __future__ import annotations

import argparse
import sys


def at_least(lo: int):
    """An argparse ``type``: an integer ≥ ``lo``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: give an integer >= {lo}") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"{value}: give an integer >= {lo}")
        return value
    return parse


def int_list(text: str) -> list[int]:
    """An argparse ``type``: comma-separated non-negative integers (``0,1,2``), e.g. seeds."""
    try:
        values = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated integers >= 0, e.g. 0,1,2")
    return values


def device(text: str) -> str:
    """An argparse ``type``: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``, the CUDA ones only where CUDA is there."""
    import torch

    if text == "auto":
        return text
    try:
        dev = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"{text!r}: give auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text}: torch {torch.__version__} sees no CUDA device here; give cpu")
    if dev.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"{text}: this bench runs on cpu or cuda")
    return text


def print_table(parser: argparse.ArgumentParser, render, argv: list[str] | None = None) -> int:
    """The ``main`` of a script that prints a table a README quotes (``cell_table.py``, ``comparison_table.py``):
    parse ``argv``, print ``render(args)``; a one-line ``SystemExit`` message goes to stderr with exit status 2."""
    args = parser.parse_args(argv)
    try:
        sys.stdout.write(render(args) + "\n")
    except SystemExit as e:
        if isinstance(e.code, str):
            sys.stderr.write(e.code + "\n")
            return 2
        raise
    return 0
