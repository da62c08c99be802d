"""Typed dataset configuration (DESIGN.md "Configuration"; merged with ``configs/dataset/*.yaml``).

Every yaml key must be a field here: OmegaConf merges the yaml into these structured configs and
rejects unknown keys. ``check_config`` raises a one-line ``ValueError`` for impossible settings.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class ExpectedStats:
    """Statistics of the raw read (before dedup and k-core), from the dataset's ``SOURCE.md``.

    ``None`` skips the check. A mismatch raises a one-line ``ValueError`` naming the field.
    """

    users: Optional[int] = None  # distinct user ids in the raw file
    items: Optional[int] = None  # distinct item ids in the raw file
    interactions: Optional[int] = None  # rows (events) in the raw file


@dataclass
class SyntheticConfig:
    """The embedded synthetic dataset (``bftrec.data.synthetic``); all lengths are in interactions."""

    n_users: int = 2000  # number of users
    n_items: int = 600  # number of items
    zipf_exponent: float = 1.1  # item popularity ~ rank^-zipf_exponent (power law)
    short_user_share: float = 0.6  # share of users with a short history
    short_min_len: int = 3  # shortest short history (>= 3, leave-one-out needs 3)
    short_max_len: int = 8  # longest short history (inclusive)
    long_mean_len: float = 30.0  # mean length of the long histories (exponential, then clipped)
    max_len_cap: int = 200  # longest possible history
    n_successors: int = 5  # latent successors per item, drawn with popularity bias
    successor_pop_bias: float = 0.5  # successors drawn with weight popularity**bias (0 = uniform)
    p_transition: float = 0.6  # P(next item is a latent successor of the previous item)
    noise: float = 0.1  # P(next item is uniform over all items); the rest is a popularity draw
    start_time: int = 1_600_000_000  # earliest first timestamp, unix seconds
    time_span: int = 31_536_000  # first timestamps are spread over this many seconds (1 year)
    mean_gap: int = 86_400  # mean gap between a user's consecutive interactions, seconds (>= 1)
    seed: int = 0  # generator seed (numpy PCG64)
    # The positive control (results/positive_control): planted unreliability, with ground truth. 0 = off, and
    # then the data are exactly those of the knobs above (the planting draws use a generator of their own).
    unreliable_share: float = 0.0  # share of items that are unreliable: the next item ignores them (in [0, 1])
    unreliable_rare_bias: float = 1.0  # unreliable items drawn with weight popularity**-bias (>= 0; 0 = uniform)
    noisy_user_share: float = 0.0  # share of users whose histories are mixed with random items (in [0, 1])
    noisy_user_rate: float = 0.0  # per position of a noisy user: P(a uniformly random item is inserted), in [0, 1)
    oracle_clean: bool = False  # drop every planted position (unreliable item, inserted item) but each user's
    #                             first and last: the noise-free input histories of the same test targets


@dataclass
class DatasetConfig:
    """One dataset: where its raw file is, how to read it, and how to preprocess it."""

    name: str = "synthetic"  # dataset name; equals the yaml file stem
    format: str = "synthetic"  # reader name (bftrec.data.readers.READERS) or "synthetic"
    path: str = ""  # raw file, relative to the data root
    url: Optional[str] = None  # official download location of exactly the file at `path`
    sha256: Optional[str] = None  # sha256 of the file at `path`; checked on every fresh read
    kcore: int = 0  # 0 = none (data already k-core); else k for users AND items, to a fixed point
    dedup: bool = True  # drop exact duplicate (user, item, timestamp) rows; never without timestamps
    min_user_interactions: int = 3  # users with fewer interactions are dropped (and counted)
    expected: ExpectedStats = field(default_factory=ExpectedStats)  # raw-read statistics to check
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)  # only for format=synthetic
    citation: str = ""  # how to cite the data and its preprocessing
    columns: dict = field(default_factory=lambda: {"user": "user_id", "item": "item_id", "timestamp": "timestamp"})
    #  (format: csv) the header's names of the user, item and timestamp columns (timestamp: null = none)
    delimiter: str = ","  # (format: csv) the field separator, one character
    inject_rate: float = 0.0  # random items inserted into the training histories per interaction, [0, 1)
    inject_seed: Optional[int] = None  # generator seed of the injection (bftrec.data.inject); null = the run's seed

    def __post_init__(self) -> None:
        check_config(self)


def check_config(cfg: DatasetConfig) -> None:
    """Raise a one-line ``ValueError`` for an impossible dataset setting."""
    if cfg.min_user_interactions < 3:
        raise ValueError(
            f"dataset {cfg.name!r}: min_user_interactions={cfg.min_user_interactions} is impossible; "
            "leave-one-out (train/valid/test) needs at least 3 interactions per user"
        )
    if cfg.kcore < 0:
        raise ValueError(f"dataset {cfg.name!r}: kcore={cfg.kcore} must be 0 (none) or a positive k")
    if not 0.0 <= cfg.inject_rate < 1.0:
        raise ValueError(f"dataset {cfg.name!r}: inject_rate={cfg.inject_rate} must be in [0, 1) (expected random "
                         "items injected per training interaction; 0 = off)")
    s = cfg.synthetic
    problems = []
    if s.n_users < 1 or s.n_items < 2:
        problems.append("n_users >= 1 and n_items >= 2")
    if not 0.0 <= s.short_user_share <= 1.0:
        problems.append("0 <= short_user_share <= 1")
    if not 3 <= s.short_min_len <= s.short_max_len <= s.max_len_cap:
        problems.append("3 <= short_min_len <= short_max_len <= max_len_cap")
    if not 1 <= s.n_successors < s.n_items:
        problems.append("1 <= n_successors < n_items")
    if not (0.0 <= s.p_transition and 0.0 <= s.noise and s.p_transition + s.noise <= 1.0):
        problems.append("p_transition, noise >= 0 and p_transition + noise <= 1")
    if min(s.zipf_exponent, s.successor_pop_bias, s.time_span) < 0 or s.mean_gap < 1:
        problems.append("zipf_exponent, successor_pop_bias, time_span >= 0 and mean_gap >= 1")
    if s.long_mean_len <= 0:
        problems.append("long_mean_len > 0")
    for key in ("unreliable_share", "noisy_user_share"):
        if not 0.0 <= getattr(s, key) <= 1.0:
            problems.append(f"0 <= {key} <= 1 (got {getattr(s, key)})")
    if not 0.0 <= s.noisy_user_rate < 1.0:
        problems.append(f"0 <= noisy_user_rate < 1 (got {s.noisy_user_rate})")
    if s.unreliable_rare_bias < 0:
        problems.append(f"unreliable_rare_bias >= 0 (got {s.unreliable_rare_bias})")
    if problems:
        raise ValueError(f"dataset {cfg.name!r}: synthetic settings need {'; '.join(problems)}")
