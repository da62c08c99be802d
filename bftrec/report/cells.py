"""Table-cell text shared by the report tables (``tables``, ``beyond``, ``variants``, ``ablation``, ``sweep``).

- ``fmt``: mean ± std over seeds (``(1 seed)`` for one, ``–`` for none);
- ``pct``: a relative gain as a signed percentage (+0.041 -> ``+4.1%``);
- ``pval``: a p value to 3 significant digits; ``–`` where there is none.
"""
from __future__ import annotations

import numpy as np
import pandas as pd


def fmt(values: list[float], digits: int = 4) -> str:
    """Mean ± std over seeds; one seed: the value alone, marked ``(1 seed)``; none: ``–`` (None values left out)."""
    v = [x for x in values if x is not None]
    if not v:
        return "–"
    return f"{np.mean(v):.{digits}f} ± {np.std(v, ddof=1):.{digits}f}" if len(v) > 1 else f"{v[0]:.{digits}f} (1 seed)"


def pct(x) -> str:
    return "–" if x is None or pd.isna(x) else ("+inf%" if np.isinf(x) else f"{100 * x:+.1f}%")


def pval(x) -> str:
    return "–" if x is None or pd.isna(x) else f"{x:.3g}"
