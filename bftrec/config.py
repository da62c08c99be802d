"""Typed config schemas for the Hydra groups ``trainer`` and ``eval`` and the run root.

Every yaml key is merged into one of these dataclasses with OmegaConf, so a misspelled key fails at
start with the key's name (``validate``). The ``dataset`` group is checked against
``bftrec.data.config.DatasetConfig``; ``model`` against the backbone's own ``Config`` dataclass
(in its model file); ``layer`` against ``bftrec.layers.LAYER_CONFIGS``.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import logging
from collections.abc import Iterable
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

log = logging.getLogger(__name__)

# The Hydra config tree: package data ``bftrec/configs`` (in the checkout a link to the top-level configs/),
# found as ``pkg://bftrec.configs`` in an editable install, a wheel and a PYTHONPATH checkout alike.
CONFIG_PKG = "bftrec.configs"
CONFIG_DIR = str(Path(__file__).resolve().parent / "configs")


class ConfigError(ValueError):
    """A one-line configuration error: names the key or value and the fix."""


@dataclass
class TrainerConfig:
    epochs: int = 200                 # maximum number of epochs
    batch_size: int = 256             # users (sequences) per training step
    optimizer: str = "adam"           # adam | adamw
    lr: float = 1e-3                  # learning rate
    weight_decay: float = 0.0         # decoupled for adamw, L2 for adam
    betas: list = field(default_factory=lambda: [0.9, 0.999])  # Adam/AdamW (β1, β2); torch's default
    grad_clip: float = 0.0            # max global grad norm; 0 = off
    patience: int = 10                # early stopping: evaluations without a better valid NDCG@10
    min_epochs: int = 0               # no early stop before this many epochs; 0 = off, = epochs: a fixed budget
    eval_every: int = 1               # validate every this many epochs
    select_metric: str = "NDCG@10"    # model selection metric on the validation split
    device: str = "auto"              # auto | cpu | cuda | cuda:N
    amp: bool = True                  # bf16 autocast on CUDA (ignored on CPU)
    deterministic: bool = False       # torch.use_deterministic_algorithms + fixed seeds
    num_threads: int = 0              # torch CPU threads; 0 = torch default
    progress: bool = True             # tqdm progress bars
    resume: Optional[str] = None      # run directory to resume from (reads its last.pt)
    max_steps_per_epoch: int = 0      # cap on steps per epoch (0 = full epoch); for smoke runs
    length_bucketing: bool = True     # batches of similar length ("sortish"), left padding trimmed
    # last: each user's last max_len + 1 training items | sliding: all of them | prefixes: one window per
    # target, the loss at its last column only (RecBole's augmentation; next-item backbones)
    train_windows: str = "last"
    train_window_stride: Optional[int] = None  # sliding: window ends S items apart (1..max_len); null = max_len
    divergence_factor: float = 100.0  # stop when a step's loss exceeds this x the first epoch's mean; 0 = off
    tensorboard: bool = False         # TensorBoard curves in <run dir>/tensorboard (the optional extra)
    # fast paths (issue 49), off by default so that a rerun of a committed cell computes what it computed:
    fused_optimizer: bool = False     # torch's fused Adam/AdamW kernel; a device without one fails in one line
    dropout: str = "torch"            # torch (nn.Dropout) | mask (x * (U >= p) / (1 - p): same rate, other draws)
    last_position_only: bool = False  # prefixes: the last block computes the last position alone (all the loss reads)
    compile_precision: bool = False   # BFT layers: the per-token precision chain through torch.compile (fused kernels)


@dataclass
class EvalConfig:
    ks: list = field(default_factory=lambda: [5, 10, 20])  # cut-offs K for HR@K and NDCG@K
    protocol: str = "full"            # full | sampled100 (comparison with old papers only)
    sampled_kind: str = "uniform"     # sampled100 negatives: uniform | popularity
    n_negatives: int = 100            # negatives per user for the sampled protocol
    sample_seed: int = 12345          # dedicated seed of the sampled protocol's generator
    exclude_history: bool = True      # drop the user's history items from the candidates
    exclude_scope: str = "all"        # all | window: the whole history, or only the scored window's last max_len
    #                                   items (the HSTU reference), is excluded
    repeat_target: str = "keep"       # keep | mask: a repeated target stays rankable, or is excluded (S3-Rec, HSTU)
    batch_size: int = 1024            # users per scoring chunk (metrics do not depend on it)
    n_bins: int = 5                   # item-frequency strata Q0 (rarest) .. Q{n-1}
    bin_mode: str = "equal_items"     # equal_items | equal_interactions
    cold_user_max_history: Optional[int] = None  # cold: history <= this; null = smallest length reaching cold_share
    cold_share: float = 0.2           # target share of cold users for the default threshold
    mechanism: bool = True            # BFT layers: aggregate K and initial precision by stratum


@dataclass
class RunConfig:
    """The root of ``configs/train.yaml`` minus its groups."""

    seed: int = 0                     # global seed (model init, batching, dropout)
    tag: str = ""                     # free label written to metrics.json (groups ablation cells in tables)
    data_root: Optional[str] = None   # real datasets; null = $BFTREC_DATA_ROOT
    cache_dir: Optional[str] = None   # processed-array cache; null = $BFTREC_CACHE_DIR or ~/.cache/bftrec
    out_root: str = "results/runs"    # run dirs go to <out_root>/<dataset>/<model>/<layer>/seed<k>_<time>
    log_level: str = "INFO"
    skip_finished: bool = False       # grids: a run dir with metrics.json of the same config is skipped,
    #                                   one with only last.pt is resumed (bftrec.grid)
    tuned_config: str = ""            # set by configs/tuned/<dataset>_<model>.yaml to its own stem
    require_tuned: bool = False       # grids: refuse a cell whose configs/tuned/<dataset>_<model>.yaml is missing
    print_config: bool = False        # log the composed config at start (it is always saved as config.yaml)


_ROOT_GROUPS = ("dataset", "model", "layer", "trainer", "eval")


def merge_schema(schema: type, node: Any, where: str) -> Any:
    """Merge ``node`` into the dataclass ``schema``; return the typed object.

    Raises:
        ConfigError: one line naming the unknown or ill-typed key and the group, e.g.
            ``unknown key 'trainer.epoch'; did you mean trainer.epochs? known keys in trainer: ...`` or
            ``bad value for trainer.lr: Value 'abc' of type 'str' could not be converted to Float``.
    """
    prefix = "" if where == "root" else f"{where}."
    base = OmegaConf.structured(schema)
    try:
        merged = OmegaConf.merge(base, node)
    except ConfigKeyError as e:
        key = getattr(e, "full_key", None) or getattr(e, "key", None) or str(e).splitlines()[0]
        raise unknown_key(f"{prefix}{key}", schema.__dataclass_fields__) from None
    except ValidationError as e:
        key = getattr(e, "full_key", None) or "?"
        raise ConfigError(f"bad value for {prefix}{key}: {str(e).splitlines()[0].rstrip('.')}"
                          f"{_expected(schema, str(key), prefix)}") from None
    return OmegaConf.to_object(merged)


def _expected(schema: type, key: str, prefix: str) -> str:
    """``'; expected <type>, e.g. <prefix><key>=<default>'`` for a field of ``schema`` ('' if unknown)."""
    f = getattr(schema, "__dataclass_fields__", {}).get(key)
    if f is None:
        return ""
    default = f.default_factory() if f.default_factory is not MISSING else f.default
    if default is MISSING:
        return ""
    if isinstance(default, (list, tuple)):
        shown = "[" + ",".join(map(str, default)) + "]"
    else:  # Hydra's spellings: null for None, '' for the empty string, true/false
        shown = {None: "null", "": "''", True: "true", False: "false"}.get(default, default) \
            if isinstance(default, (type(None), str, bool)) else default
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    return f"; expected {kind}, e.g. {prefix}{key}={shown}"


def unknown_key(full_key: str, known: Iterable[str]) -> ConfigError:
    """The one-line error for a key its group lacks: the closest known key (difflib) and all of them."""
    group, _, key = full_key.rpartition(".")
    known = [k for k in known if k != "hydra"]
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {group + '.' if group else ''}{close[0]}? " if close else ""
    return ConfigError(f"unknown key '{full_key}'; {hint}known keys in {group or 'the root'}: {', '.join(known)}")


def check_ks(ks: Any) -> None:
    """``eval.ks`` must be a non-empty list of integers K >= 1 (checked before any data is read)."""
    ks = list(ks) if isinstance(ks, (list, tuple)) else [ks]
    if not ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in ks):
        raise ConfigError(f"eval.ks={ks} is not valid: every cut-off K must be an integer >= 1, e.g. "
                          "eval.ks=[5,10,20]")


def validate_root(cfg: DictConfig) -> RunConfig:
    """Check the root keys (everything except the groups) against ``RunConfig``."""
    rest = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items()
            if k not in _ROOT_GROUPS and k != "hydra"}
    return merge_schema(RunConfig, rest, "root")


def check_choice(value: str, choices: tuple, key: str) -> None:
    """Raise a one-line ConfigError when ``value`` is not one of ``choices``."""
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not valid; choose one of {', '.join(choices)}")


_LOGGED: set = set()


def _log_once(msg: str, *args) -> None:
    """``log.info`` once per process and message (a table over a grid loads the same legacy layer
    once per run and per call)."""
    if (msg, args) not in _LOGGED:
        _LOGGED.add((msg, args))
        log.info(msg, *args)


def upgrade_legacy_layer(d: dict) -> dict:
    """A stored layer config (run dir ``config.yaml``, checkpoint, metrics.json ``layer_config``) in today's form.

    Runs written before ``bft.units`` existed (BFT v1) have a ``bft`` block without ``units``: they
    measured precision in the units of ``h``, so they load as ``bft.units=h`` (their ``tau.scale``,
    e.g. ``embedding``, stays valid). A BFT config stored before ``tau.lr_scale`` existed gets
    ``tau.lr_scale=1`` (what it did). Logs one info line when either applies (once per process and
    layer name). Any other config (``layer=standard``, a v2 run) is returned unchanged (as a copy).
    Every loading path uses it (``load_run_config``: ``bftrec.evaluate`` re-score and gain replay,
    ``bftrec.grid.prepare_cell``, ``bftrec.train`` resume). Pure dict logic, no torch: scripts may import it cheaply.

    Args:
        d: the layer config as a dict or DictConfig (``{"name": ..., "tau": {...}, "bft": {...}}``).
    Returns:
        a new plain dict.
    """
    out = copy.deepcopy(OmegaConf.to_container(d, resolve=True) if OmegaConf.is_config(d) else dict(d))
    bft = out.get("bft")
    if isinstance(bft, dict) and "units" not in bft:
        bft["units"] = "h"
        _log_once("layer %r was stored before bft.units existed (BFT v1): loading it as layer.bft.units=h",
                  out.get("name"))
    tau = out.get("tau")
    if isinstance(bft, dict) and isinstance(tau, dict) and "lr_scale" not in tau:
        tau["lr_scale"] = 1.0  # added later; 1 = what such a run did (τ at the model's learning rate)
        _log_once("layer %r was stored before tau.lr_scale existed: loading it as layer.tau.lr_scale=1.0",
                  out.get("name"))
    return out


def load_run_config(run_dir: Path) -> DictConfig:
    """``<run_dir>/config.yaml`` with its layer in today's form (``upgrade_legacy_layer``).

    Raises:
        FileNotFoundError: no config.yaml there.
    """
    path = Path(run_dir) / "config.yaml"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found; pass a run directory written by bftrec-train")
    cfg = OmegaConf.load(path)
    if "layer" in cfg:
        cfg.layer = OmegaConf.create(upgrade_legacy_layer(cfg.layer))
    return cfg


def schema_defaults(schemas: dict) -> dict:
    """{dotted key: default} of typed config groups, e.g. ``{"trainer": TrainerConfig, ...}``.

    Nested dataclasses (``layer.tau``) are flattened; a field without a default is left out. Used
    to compare a stored run's config with today's (``bftrec.grid.config_diff``).
    """
    out: dict = {}

    def walk(cls, prefix: str) -> None:
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                value = f.default
            elif f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
            else:
                continue
            if dataclasses.is_dataclass(value):
                walk(type(value), f"{prefix}{f.name}.")
            else:
                out[f"{prefix}{f.name}"] = list(value) if isinstance(value, tuple) else value
        return None

    for group, cls in schemas.items():
        walk(cls, f"{group}." if group else "")
    return out

