"""An opt-in ``torch.compile`` path for the per-token precision chain (``trainer.compile_precision``).

The precision formulas of the filtering cycle (the REML shrinkage and ``λ^obs`` of §1, the Kalman gain
and precision of §2, ``λ''`` of §3, the sandwich pieces of §4) are chains of small element-wise ops over
(n, D) rows: eagerly, each op reads and writes its rows once and autograd keeps most intermediates.
Compiled (Inductor), each function becomes one fused kernel forward and one backward that recomputes
what it needs from the inputs. The formulas are the same Python code either way; results agree to
float32 rounding (tested in tests/test_fast_paths.py), never bit for bit.

Functions marked ``@compilable`` run eagerly unless a ``compiling(True)`` block is active (``BFTStack``
opens one around its blocks when ``trainer.compile_precision=true`` set ``stack.compile_precision``;
``bftrec-eval`` follows the run's setting). Each is compiled on first use with ``dynamic=True`` (the
number of rows changes every batch); Dynamo still builds another graph when the grad mode changes
(training against calibration and scoring), when input strides differ, or for a dimension of size 0 or 1,
so a run holds a few graphs per function. Past Dynamo's recompile limit (8) a new specialisation runs
eagerly: slower, never different. A call made while another compiled function is traced runs inline.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator

import torch

_ON: contextvars.ContextVar[bool] = contextvars.ContextVar("bftrec_compile_precision", default=False)
BACKEND = "inductor"  # torch.compile's backend; the tests also trace with "aot_eager" (no C++ build)


def compilable(fn: Callable) -> Callable:
    """Mark a precision function for the compiled path; ``fn.eager`` is the undecorated function."""
    compiled: dict = {}  # backend -> the compiled function

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if torch.compiler.is_compiling() or not _ON.get():
            return fn(*args, **kwargs)
        if BACKEND not in compiled:
            compiled[BACKEND] = torch.compile(fn, dynamic=True, backend=BACKEND)
        return compiled[BACKEND](*args, **kwargs)

    wrapper.eager = fn
    return wrapper


@contextlib.contextmanager
def compiling(on: bool = True) -> Iterator[None]:
    """Within the block, ``@compilable`` precision functions run compiled (``on``) or eagerly."""
    token = _ON.set(bool(on))
    try:
        yield
    finally:
        _ON.reset(token)
