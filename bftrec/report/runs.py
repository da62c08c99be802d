"""Runs for the reports: finding run directories, grouping them into cells and checking them.

Every report (``bftrec-report tables|figures|variants|ablation|same|valid-test|seconds``) reads runs
through ``load_runs`` and ``select_runs``: a run is its ``metrics.json`` plus ``config.yaml``, ``env.json``
and ``.hydra/overrides.yaml``. Missing cells, duplicate runs and runs whose protocol or config differ
beyond the compared axis stop the report with the list (``check_comparable``); the provenance
header of every table (``header``: protocol, commits, hardware, dates, budgets, the command) is built
here. Numbers never come from logs.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import logging
import math
import os
import subprocess
import sys
from pathlib import Path

import yaml

from bftrec.config import EvalConfig, upgrade_legacy_layer
from bftrec.data.datasets import identity_of_stats, other_data
from bftrec.grid import AXES, VOLATILE, _flat, sweep_axes, training_segments
from bftrec.rundir import override_key

log = logging.getLogger("bftrec.report")
METRICS = ("HR@10", "NDCG@10")
STANDARD = "standard"
CONFIGS = Path(__file__).resolve().parent.parent / "configs"
QUIET = ("dataset=", "model=", "layer=", "seed=", "experiment=", "out_root=", "data_root=", "cache_dir=",
         "hydra", "trainer.num_threads=", "trainer.progress=", "trainer.device=", "log_level=")


# ---------------------------------------------------------------------------------------------
# runs, cells and the checks
# ---------------------------------------------------------------------------------------------
def _overrides(run_dir: Path) -> list[str]:
    """The run's command-line overrides (``.hydra/overrides.yaml``) other than the grid axes and the
    where-and-how-fast settings (``QUIET``)."""
    path = run_dir / ".hydra" / "overrides.yaml"
    found = (yaml.safe_load(path.read_text()) or []) if path.exists() else []
    return [o for o in found if not o.lstrip("+~").startswith(QUIET)]


def run_roots(root) -> list[Path]:
    """``root`` as a list of folders: one folder (str or Path) or an iterable of them (``--runs a b``)."""
    return [Path(root)] if isinstance(root, (str, Path)) else [Path(r) for r in root]


def add_roots(ap) -> None:
    """The run folders of a report that reads them positionally (``seconds``, ``valid-test``), also accepted as
    ``--runs`` as ``tables`` and ``figures`` take them; ``given_roots`` reads them back."""
    ap.add_argument("roots", type=Path, nargs="*", help="folders searched for run folders")
    ap.add_argument("--runs", type=Path, nargs="+", default=[], help="the same, as tables and figures take them")


def given_roots(ap, args) -> list[Path]:
    """The folders ``add_roots`` parsed, positional first; none is argparse's one-line error (exit 2)."""
    roots = [*args.roots, *args.runs]
    if not roots:
        ap.error("give the folders to search for runs (positionally or with --runs)")
    return roots


def _json(path: Path) -> dict:
    """A run's JSON file; a torn or truncated one stops in one line naming it (issue 50)."""
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SystemExit(f"bftrec-report: {path} is not valid JSON ({e}; a torn or truncated write?); rerun that "
                         "cell or move its folder away") from None


def load_runs(root) -> list[dict]:
    """Every run below ``root`` (``root`` itself may be one run; a list of folders: the runs below
    each, a run under two of them counted once; a metrics.json inside another run's folder, such as a
    re-score in ``<run>/eval_*/`` or any ``--out`` there, is no run of its own): its metrics.json plus the
    paths of its folder and ranks.csv.gz, its overrides, and ``_variant``: the overrides that tell it apart
    from other runs of the same cell (a sweep), joined into its tag when it has none.

    Raises:
        SystemExit: a folder that does not exist, or no metrics.json under any of them.
    """
    roots = run_roots(root)
    absent = [str(r) for r in roots if not r.exists()]
    if absent:
        raise SystemExit(f"bftrec-report: no such folder: {', '.join(absent)}; check the run folder paths")
    found: dict = {}
    for r in roots:
        for m in r.rglob("metrics.json"):
            found.setdefault(m.resolve(), m)  # the first spelling of a run reached twice
    runs = []
    run_dirs = {p.parent for p in found}
    for resolved, mpath in sorted(found.items()):  # resolved order: the same however the folders are spelled
        if mpath.parent.name.startswith("eval_"):
            continue  # re-scored copies (bftrec-eval) are not extra seeds
        inside = next((d for d in resolved.parent.parents if d in run_dirs), None)
        if inside is not None:  # a re-score kept in a run's folder under another name (bftrec-eval --out)
            log.info("%s: inside the run %s, so not a run of its own (a re-score); left out", mpath.parent, inside)
            continue
        m = _json(mpath)
        env = mpath.parent / "env.json"
        m["_env"] = _json(env) if env.exists() else {}
        m["_ranks"] = mpath.parent / "ranks.csv.gz"
        m["_dir"] = mpath.parent
        m["_overrides"] = _overrides(mpath.parent)
        m["tag"] = m.get("tag") or ""  # older runs wrote tag: null
        p = m.get("protocol")
        if isinstance(p, dict) and "exclude_scope" not in p:  # older than eval.exclude_scope: it scored as the
            p["exclude_scope"] = EvalConfig.exclude_scope if p.get("exclude_history") else None  # default does
        if "beyond_accuracy" in m and beyond_problem(m["beyond_accuracy"]):
            log.warning("%s: its beyond_accuracy block is left out of the tables (%s)", mpath,
                        beyond_problem(m.pop("beyond_accuracy")))
        if "beyond_accuracy" not in m:
            found_block = rescored_beyond(mpath.parent, m)
            if found_block is not None:
                m["beyond_accuracy"] = found_block
        runs.append(m)
    if not runs:
        raise SystemExit(f"bftrec-report: no metrics.json under {', '.join(map(str, roots))}; run the experiment first")
    _name_variants(runs)
    return runs


def _scoring_differs(run: dict, re: dict) -> str | None:
    """What makes a re-score score otherwise than the run, or None when it scored as the run did: the same data
    (``other_data``; no ``--allow-other-data`` re-score), protocol, item bins and cold-user threshold, the same
    user counts, and the same overall test metrics (to 1e-6 relative: another device or thread count may move
    the last digits)."""
    a, b = run.get("test") if isinstance(run.get("test"), dict) else {}, re.get("test")
    if not isinstance(b, dict) or not isinstance(b.get("overall"), dict) or not isinstance(
            b.get("by_item_freq"), list) or not isinstance(b.get("cold_users"), dict):
        return "no test block"
    if re.get("other_data") or other_data(identity_of_stats(run.get("data")), identity_of_stats(re.get("data"))):
        return "other data"
    if re.get("protocol") != run.get("protocol"):
        return "another protocol"
    if [(x.get("lo"), x.get("hi"), x.get("n_users")) for x in a.get("by_item_freq", [])] != [
            (x.get("lo"), x.get("hi"), x.get("n_users")) for x in b["by_item_freq"] if isinstance(x, dict)]:
        return "other item bins"
    if a.get("cold_users", {}).get("max_history") != b["cold_users"].get("max_history"):
        return "another cold-user threshold"
    oa, ob = a.get("overall", {}), b["overall"]
    for k, v in oa.items():
        w = ob.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            if w != v:
                return f"test {k} {w} against {v}"
        elif isinstance(v, float) and not (isinstance(w, (int, float)) and abs(v - w) <= 1e-6 * max(1.0, abs(v))):
            return f"test {k} {w} against {v}"
    return None if oa else "no test metrics in the run"


BEYOND_METRICS = ("coverage", "tail_share", "popularity", "gini")  # bftrec/beyond.py, per list length k


def beyond_problem(block) -> str | None:
    """Why a ``beyond_accuracy`` block cannot be tabled (None if it can): it needs an integer ``k`` ≥ 1 and, under
    ``overall``, each of ``BEYOND_METRICS`` at ``@k`` as a finite number."""
    if not isinstance(block, dict) or not block:
        return "no block"
    k = block.get("k")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        return f"k={k!r} is not a list length"
    overall = block.get("overall")
    if not isinstance(overall, dict):
        return "no overall values"
    for name in BEYOND_METRICS:
        v = overall.get(f"{name}@{k}")
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            return f"{name}@{k}={v!r} is not a finite number"
    return None


def rescored_beyond(run_dir: Path, run: dict) -> dict | None:
    """The ``beyond_accuracy`` block of a run written before the metric (issue 48 item 2), from the last (by name)
    re-score in its folder (``<run>/eval_*/metrics.json``, ``bftrec-eval <run> --out <run>/eval_beyond``) that
    scored as the run did (``_scoring_differs``); the block gains ``from``: that folder's name. None if there is
    none. A re-score that scored otherwise, or an unreadable one, is passed over with a log line naming why; a
    second qualifying re-score whose block differs from the one taken is named in a warning."""
    chosen = None
    for path in sorted(run_dir.glob("eval_*/metrics.json"), reverse=True):
        try:
            re = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            log.info("%s: not read for beyond-accuracy (%s)", path, type(e).__name__)
            continue
        if not isinstance(re, dict) or not isinstance(re.get("beyond_accuracy"), dict) or not re["beyond_accuracy"]:
            continue
        why = beyond_problem(re["beyond_accuracy"]) or _scoring_differs(run, re)
        if why is not None:
            log.info("%s: its beyond-accuracy block is not the run's (%s)", path, why)
        elif chosen is None:
            chosen = {**re["beyond_accuracy"], "from": path.parent.name}
        elif {**re["beyond_accuracy"], "from": chosen["from"]} != chosen:
            log.warning("%s: two re-scores give different beyond-accuracy blocks (ties in a top-10 list can break "
                        "otherwise on another device); the tables take %s, last by name, not %s: rename the one to "
                        "use so that it sorts last", run_dir, chosen["from"], path.parent.name)
    return chosen


def _name_variants(runs: list[dict]) -> None:
    """Override keys with several values among the runs of one cell are sweep keys: an untagged run
    gets ``key=value,...`` of those keys as its tag (``_variant``)."""
    values: dict = {}
    for r in runs:
        cell = (r["dataset"], r["model"], r["tag"], r["layer"], r["seed"])
        for o in r["_overrides"]:
            k, _, v = o.lstrip("+~").partition("=")
            values.setdefault((cell, k), set()).add(v)
    swept = {k for (_, k), vs in values.items() if len(vs) > 1}
    for r in runs:
        r["_variant"] = [o for o in r["_overrides"] if o.lstrip("+~").partition("=")[0] in swept]
        if r["_variant"] and not r["tag"]:
            r["tag"] = ",".join(o.lstrip("+~") for o in r["_variant"])


def grid_cells(paths) -> set:
    """(dataset, model, tag "", layer, seed) of every cell the grid configs sweep (``hydra.sweeper.params``);
    ``paths``: one config or several (their union: a grid and its extra cells, e.g. ``paper/main_units``)."""
    out: set = set()
    for path in [paths] if isinstance(paths, (str, Path)) else paths:
        try:
            axes = sweep_axes(path)
        except SystemExit as e:
            raise SystemExit(f"bftrec-report: {e}") from None
        out |= {(d, m, "", layer, int(s)) for d, m, layer, s in itertools.product(*(axes[k] for k in AXES))}
    return out


def grid_drift(runs: list[dict], grid) -> dict[str, str]:
    """Where finished cells no longer match their grid: for each run of a cell of ``grid`` (a grid config or a
    list of them), the keys at which its saved config differs from what that grid composes for the cell today
    (``default_config`` with the grid's experiment: a tuned config changed since the cell ran), leaving out the
    run's own command-line overrides (a TRIAL is flagged apart), the seed, ``trainer.amp`` (as for trials) and
    the volatile keys of ``bftrec.grid``. A grid rerun refuses such cells ("holds a run of another config").

    Returns:
        {key: its line, ``"grid config since changed at <key> for 12 runs (beauty: sasrec bft, standard seeds 0,
        1, 2; ...): ..."``}, sorted by key; {} when every cell matches, or for a grid outside ``configs/experiment``.
    """
    by_key: dict = {}
    for path in [grid] if isinstance(grid, (str, Path)) else grid:
        try:
            experiment = Path(path).resolve().relative_to((CONFIGS / "experiment").resolve())
        except ValueError:
            continue
        experiment = experiment.with_suffix("").as_posix()  # configs/experiment/paper/main.yaml: paper/main
        cells_ = grid_cells(path)
        for r in runs:
            if (r["dataset"], r["model"], r["tag"], r["layer"], r["seed"]) not in cells_:
                continue
            now = default_config(r["dataset"], r["model"], r["layer"], experiment)
            if not now:
                continue
            cfg = run_config(r)
            own = {override_key(o) for o in r["_overrides"]}
            for k in sorted((set(cfg) | set(now)) - VOLATILE - own - {"seed", "trainer.amp"}):
                if (cfg[k] if k in cfg else absent_value(r, k)) != now.get(k, "<absent>"):
                    by_key.setdefault(k, set()).add((r["dataset"], r["model"], r["tag"], r["layer"], r["seed"]))
    return {k: f"grid config since changed at {k} for {len(c)} runs ({'; '.join(describe_missing(sorted(c)))}): "
               "they ran with the earlier value; a grid rerun refuses them until they are moved away and rerun"
            for k, c in sorted(by_key.items())}


def missing_cells(runs: list[dict], expected: set | None = None) -> list[tuple]:
    """Cells (dataset, model, tag, layer, seed) expected but absent, sorted.

    Raises:
        SystemExit: two runs of the same cell (seeds would be double counted); names both folders.
    """
    found: dict = {}
    for r in runs:
        found.setdefault((r["dataset"], r["model"], r["tag"], r["layer"], r["seed"]), []).append(r["_dir"])
    dups = [f"{cell_name(*k[:4])} seed {k[4]}: {', '.join(map(str, v))}" for k, v in found.items() if len(v) > 1]
    if dups:
        raise SystemExit(f"bftrec-report: {len(dups)} cell(s) with more than one run; keep one each: {'; '.join(dups)}")
    if expected is None:
        seeds = {k[4] for k in found}
        twins = any(k[3] == STANDARD for k in found)  # no standard run at all: nothing to compare with
        groups = {k[:4] for k in found} | {(d, m, "", STANDARD) for d, m, t, layer, _ in found
                                           if twins and layer != STANDARD and not t}
        expected = {g + (s,) for g in groups for s in seeds}
    return sorted(expected - set(found))


def describe_missing(missing: list[tuple]) -> list[str]:
    """Missing cells as compact lines, one per dataset: ``office: sasrec bft seeds 1, 2 and standard
    seed 2; hstu standard, bft seeds 0, 1, 2`` (backbones missing the same are listed together)."""
    per_cell: dict = {}
    for d, m, t, layer, s in missing:
        per_cell.setdefault((d, m, t), {}).setdefault(layer, []).append(str(s))
    per_ds: dict = {}
    for (d, m, t), layers in per_cell.items():
        by_seeds: dict = {}
        for layer, seeds in layers.items():
            by_seeds.setdefault(", ".join(seeds), []).append(layer)
        what = " and ".join(f"{', '.join(ls)} seed{'s' if ',' in s else ''} {s}" for s, ls in by_seeds.items())
        per_ds.setdefault(d, {}).setdefault(what, []).append(m + (f" [{t}]" if t else ""))
    return [f"{d}: " + "; ".join(f"{', '.join(models)} {what}" for what, models in items.items())
            for d, items in per_ds.items()]


def cell_name(dataset: str, model: str, tag: str, layer: str) -> str:
    return "/".join(x for x in (dataset, model, tag, layer) if x)


def normalise_config(cfg: dict) -> dict:
    """Legacy rules: rewrite a run's saved config (nested, as in its ``config.yaml``) into today's
    terms before it is compared with other runs. Keys it lacks are then filled from
    ``default_config``. Rule: a bft layer config without ``bft.units`` is v1, ``units=h``
    (``bftrec.config.upgrade_legacy_layer``, the rule every loading path uses)."""
    if isinstance(cfg.get("layer"), dict):
        cfg = {**cfg, "layer": upgrade_legacy_layer(cfg["layer"])}
    return cfg


@functools.cache
def default_config(dataset: str, model: str, layer: str, experiment: str = "") -> dict:
    """Today's flat config of a cell: Hydra composition of ``configs/train.yaml`` with
    ``dataset=, model=, layer=`` (tuned config included; with ``experiment``, that experiment config first, as a
    grid composes its cells), each group completed with its dataclass defaults. {} when the repo cannot compose
    it (a name no longer in ``configs/``)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf

    from bftrec.config import ConfigError
    from bftrec.experiment import typed_groups

    try:
        with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
            cfg = compose("train", overrides=[f"experiment={experiment}"] * bool(experiment)
                          + [f"dataset={dataset}", f"model={model}", f"layer={layer}"])
        typed = typed_groups(cfg)
    except (HydraException, ConfigError, ValueError):
        return {}
    out = OmegaConf.to_container(cfg, resolve=True)
    out.update({k: dataclasses.asdict(v) for k, v in typed.items()
                if k in out and dataclasses.is_dataclass(v)})
    return _flat(out)


@functools.cache
def schema_config(model: str, layer: str) -> dict:
    """{dotted key: schema default} of a cell's typed groups (``bftrec.config.schema_defaults``): what
    a key meant in a run written before the key existed, the rule of ``bftrec.grid.config_diff``
    (a new key's default is the behaviour from before it). {} for a name no longer registered."""
    from bftrec.experiment import run_schema_defaults
    from bftrec.layers import LAYER_CONFIGS
    from bftrec.models import MODELS  # bftrec.train registers every layer

    if model not in MODELS or layer not in LAYER_CONFIGS:
        return {}
    return run_schema_defaults(MODELS.get(model).Config, LAYER_CONFIGS[layer])


def absent_value(run: dict, key: str):
    """The value of ``key`` for a run whose saved config lacks it: the schema default (the key is newer
    than the run), else today's composed default of the cell (``default_config``)."""
    schema = schema_config(run["model"], run["layer"])
    if key in schema:
        return schema[key]
    return default_config(run["dataset"], run["model"], run["layer"]).get(key, "<absent>")


def run_config(run: dict) -> dict:
    """The run's flat config after ``normalise_config`` ({} without config.yaml), with ``trainer.amp`` as it
    took effect: bf16 autocast runs only on CUDA (``bftrec.trainer.fit``: ``cfg.amp and device.type ==
    "cuda"``), so a run none of whose processes trained on CUDA ran in float32 whatever ``trainer.amp``
    said (the main grid's CPU cells say true, its GPU cells ran with false: the same computation)."""
    path = run["_dir"] / "config.yaml"
    cfg = (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}
    flat = _flat(normalise_config(cfg))
    if "trainer.amp" in flat and not any(d.startswith("cuda") for d in run_devices(run)):
        flat["trainer.amp"] = False
    return flat


def run_devices(run: dict) -> set[str]:
    """Device types a run trained on: every process logs ``..., device <type>`` in ``train.log`` (a run
    resumed elsewhere has several); without a log, ``env.json``'s device; {"?"} when neither says."""
    found = {dev for _, dev in training_segments(run["_dir"] / "train.log")}
    return found or {str(run.get("_env", {}).get("device") or "?")}


def config_differences(a: dict, b: dict, ignore: tuple = ()) -> list[str]:
    """Dotted keys whose values differ between two runs' configs (volatile keys and keys starting
    with ``ignore`` excluded); a key absent from one config takes ``absent_value`` (its schema
    default: a run that predates a key ran with the key's default, whatever a tuned config says today)."""
    ca, cb = run_config(a), run_config(b)
    out = []
    for k in sorted(k for k in (set(ca) | set(cb)) - VOLATILE if not k.startswith(ignore)):
        va, vb = (c[k] if k in c else absent_value(r, k) for c, r in ((ca, a), (cb, b)))
        if va != vb:
            out.append(k)
    return out


def check_comparable(groups: dict, own_values: tuple = ()) -> None:
    """Refuse to compare runs whose protocol or config differ beyond the seed and tag (and layer.*
    between a layer and its standard baseline; and the keys of ``own_values``, ``--own-values``, where each layer
    was tuned on its own: the equal-budget comparison); one line naming both folders and the keys.

    Compared are the seeds of a cell and each non-standard cell with its standard baseline (``baseline``),
    first seed against every seed and each seed against the baseline's same seed. Data: the same file and
    processed data everywhere, except that runs whose training histories were injected with noise by different
    injection seeds (``dataset.inject_seed: null``: each training seed its own noise, ``bftrec.data.inject``)
    differ in the processed data by design: for them only the raw file is compared; a layer and its baseline
    at one seed share the injection seed, so their processed data are compared in full.
    """
    for key, rs in groups.items():
        base = baseline(groups, key) if key[3] != STANDARD else None
        layer_allowed = ("seed", "tag", "tuned_config", "layer.", *own_values)
        pairs = [(rs[0], r, ("seed", "tag")) for r in rs[1:]]
        pairs += [(rs[0], r, layer_allowed) for r in base or []]
        pairs += [(r, b, layer_allowed) for r in rs[1:] for b in base or [] if b.get("seed") == r.get("seed")]
        for ref, r, allowed in pairs:
            pa, pb = ({k: v for k, v in x["protocol"].items() if k != "repeat_target_share"} for x in (ref, r))
            diff = [k for k in sorted(set(pa) | set(pb)) if pa.get(k) != pb.get(k)]
            diff += config_differences(ref, r, ignore=allowed)
            ia, ib = identity_of_stats(ref.get("data")), identity_of_stats(r.get("data"))
            inj_a, inj_b = ((x.get("data") or {}).get("injection") or {} for x in (ref, r))
            if inj_a.get("seed") != inj_b.get("seed"):  # noise injected per seed: the raw file must still agree
                ia, ib = {**ia, "fingerprint": None}, {**ib, "fingerprint": None}
            data = other_data(ia, ib)
            if data:  # issue 50: the same config on two different files is two experiments
                raise SystemExit(f"bftrec-report: {ref['_dir']} and {r['_dir']} are compared in one table "
                                 "but trained on "
                                 f"different data ({data.replace(' in the run', ' in the other')}); rerun one of them "
                                 "on the other's data or keep them in separate folders")
            if diff:
                raise SystemExit(f"bftrec-report: {ref['_dir']} and {r['_dir']} are compared in one table but differ "
                                 f"at {', '.join(diff[:6])}; rerun one of them or keep them in separate folders")


def select_runs(root, grid, allow_partial: bool, prog: str = "bftrec-report", own_values: tuple = ()) -> tuple:
    """Runs of ``root`` (a folder or a list of them, as ``load_runs``) ready for tables or figures:
    (runs, missing cells, ignored run folders). ``own_values``: config keys at which a layer may differ from its
    baseline (``check_comparable``).

    With ``grid`` (a config path or a list of them), runs outside it are left out (and returned as
    ignored). Raises SystemExit on missing cells unless ``allow_partial``, on duplicate runs and on
    runs that are not comparable.
    """
    runs = load_runs(root)
    where = ", ".join(map(str, run_roots(root)))
    ignored = []
    cells_ = grid_cells(grid) if grid is not None else None
    if cells_ is not None:
        ignored = [str(r["_dir"]) for r in runs
                   if (r["dataset"], r["model"], r["tag"], r["layer"], r["seed"]) not in cells_]
        runs = [r for r in runs if str(r["_dir"]) not in ignored]
        if not runs:
            names = [grid] if isinstance(grid, (str, Path)) else grid
            raise SystemExit(f"{prog}: no run under {where} belongs to the grid {', '.join(map(str, names))}")
    missing = missing_cells(runs, cells_)
    if missing and not allow_partial:
        raise SystemExit(f"{prog}: {len(missing)} cells missing under {where}: {'; '.join(describe_missing(missing))}. "
                         "Finish them (a grid rerun skips finished cells) or pass --allow-partial")
    check_comparable(cells(runs), own_values)
    return runs, missing, ignored


def own_values_note(runs: list[dict], keys: tuple) -> str:
    """``each layer at its own values of ...: standard trainer.lr=0.0024, ...; bft ...`` for the header of a
    comparison whose layers were tuned on their own (``--own-values``); the values of each layer's first run.

    Raises:
        SystemExit: a key no run's config holds (a typo would otherwise allow nothing and say nothing)."""
    configs = sorted(((r, run_config(r)) for r in runs), key=lambda rc: (rc[0]["layer"], rc[0]["seed"]))
    unknown = [k for k in keys if not any(k in cfg for _, cfg in configs)]
    if unknown:
        raise SystemExit(f"bftrec-report: --own-values {', '.join(unknown)}: no run's config.yaml has this key; "
                         "give dotted keys of config.yaml, e.g. trainer.lr,model.dropout")
    per_layer: dict = {}
    for r, cfg in configs:
        per_layer.setdefault(r["layer"], ", ".join(f"{k}={cfg.get(k, absent_value(r, k))}" for k in keys))
    return (f"each layer at its own values of {', '.join(keys)} (--own-values: tuned per layer, equal budgets; "
            "seeds within a cell share them): " + "; ".join(f"{layer} {v}" for layer, v in per_layer.items()))


def cells(runs: list[dict]) -> dict:
    out: dict = {}
    for r in runs:
        out.setdefault((r["dataset"], r["model"], r["tag"], r["layer"]), []).append(r)
    return out


def baseline(groups: dict, key: tuple) -> list[dict] | None:
    ds, model, tag, _ = key
    return groups.get((ds, model, tag, STANDARD)) or groups.get((ds, model, "", STANDARD))


def layers_of(groups: dict) -> list[str]:
    """Non-standard layer names present, sorted (they are data: any layer != standard is compared)."""
    return sorted({k[3] for k in groups} - {STANDARD})


def extra_overrides(runs: list[dict]) -> list[str]:
    """Command-line overrides of the runs other than the grid axes, where-and-how-fast settings and
    the sweep keys that name cells (``_variant``), with how many runs used each: a trial
    ``trainer.epochs=2`` shows."""
    return _counted_overrides(runs, lambda r, o: True)


def _counted_overrides(runs: list[dict], keep) -> list[str]:
    """``"<override> (<n> runs)"`` for each command-line override ``o`` of a run ``r`` that is not one of its
    sweep keys (``_variant``) and passes ``keep(r, o)``, sorted."""
    count: dict = {}
    for r in runs:
        for o in r["_overrides"]:
            if o not in r.get("_variant", ()) and keep(r, o):
                count[o] = count.get(o, 0) + 1
    return [f"{o} ({n} runs)" for o, n in sorted(count.items())]


def agrees_with_grid(run: dict, override: str) -> bool:
    """Whether ``key=value`` sets what today's composed config of the run's cell already holds
    (``default_config``: tuned config included): such an override changed nothing against the grid, as
    ``trainer.train_windows=prefixes`` on a rerun started before its tuned config was switched to that value.
    A run started with ``experiment=<name>`` is compared with that experiment's composition of the cell. The
    value is read as Hydra reads it (``1e-3`` is the float 0.001). A deletion (``~key``), a key the cell does
    not compose or a value Hydra cannot parse never agrees."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    if override.startswith("~"):
        return False
    key = override.lstrip("+").partition("=")[0]
    experiment = next((o.partition("=")[2] for o in run["_overrides"] if o.startswith("experiment=")), "")
    now = default_config(run["dataset"], run["model"], run["layer"], experiment)
    if key not in now:
        return False
    try:
        value = OverridesParser.create().parse_overrides([override.lstrip("+")])[0].value()
    except HydraException:
        return False
    return value == now[key]


def trial_overrides(runs: list[dict]) -> list[str]:
    """The ``extra_overrides`` that make runs trials (``is_trial_override``), with how many runs used each,
    leaving out an override that agrees with today's grid config of its cell (``agrees_with_grid``); the
    table header still lists every override (``extra_overrides``)."""
    return _counted_overrides(runs, lambda r, o: is_trial_override(o) and not agrees_with_grid(r, o))


def is_trial_override(o: str) -> bool:
    """Whether a command-line override makes a run a trial: any key=value but ``trainer.amp`` (compared as it
    took effect) and a config-group choice that defines a cell variant with its own tag (``+tau_variant=mlp``,
    ``sasrec_convention=recbole``); ``debug=...`` always is a trial."""
    key = o.split(" (")[0].lstrip("+~").partition("=")[0]
    if key == "trainer.amp":
        return False
    return "." in key or key == "debug"


def run_note(runs: list[dict], missing: list[tuple]) -> str:
    """``PARTIAL: n of m cells missing; TRIAL: overrides ...`` for titles; empty for a complete plain run set.
    ``trainer.amp`` is no trial: what it took effect as is compared like any config key (``run_config``,
    ``check_comparable``), so the main grid's GPU cells, run with ``trainer.amp=false`` to stay in float32 like
    its CPU cells, are not flagged (the table header still lists the override)."""
    notes = [f"PARTIAL: {len(missing)} of {len(runs) + len(missing)} cells missing"] if missing else []
    extra = trial_overrides(runs)
    if extra:
        notes.append(f"TRIAL: {'; '.join(extra)}")
    return "; ".join(notes)


def strata_of(run: dict) -> list[tuple[str, object, str]]:
    """(name, where, range) per stratum: ``overall``, item-frequency bins Q0.., cold, warm users."""
    t = run["test"]
    out = [("overall", "overall", "")]
    out += [(b["bin"], i, f"{b['lo']}-{b['hi']}") for i, b in enumerate(t["by_item_freq"])]
    return out + [("cold", "cold_users", f"hist<={t['cold_users']['max_history']}"), ("warm", "warm_users", "")]


def stratum_value(run: dict, where, key: str):
    """``key`` (a metric, ``n_users``) of the stratum ``where`` (from ``strata_of``) in the run's test block."""
    t = run["test"]
    return (t["by_item_freq"][where] if isinstance(where, int) else t[where])[key]


def is_counted(run: dict) -> bool:
    """A statistical model's run (pop, markov: ``trainable = False``): counted, no parameters, no training."""
    return run.get("n_parameters") == 0


def budgets(runs: list[dict]) -> list[str]:
    """Training budget per (dataset, backbone) as the runs' configs give it: L, epoch cap, the floor
    before early stopping where ``trainer.min_epochs`` > 0, patience, loss; ``d/m: L 50, ≤ 200 epochs,
    patience 10, ce`` or ``d/m: L 200, ≤ 101 epochs, ≥ 101 before stopping, patience 10, sampled_softmax``
    (several values where the runs differ)."""
    per: dict = {}
    for r in runs:
        if is_counted(r):  # pop, markov: nothing is trained, so there is no budget
            per.setdefault(f"{r['dataset']}/{r['model']}", set()).add("counted, not trained")
            continue
        c = run_config(r)
        floor = c.get("trainer.min_epochs") or 0
        item = (f"L {c.get('model.max_len', '?')}, ≤ {c.get('trainer.epochs', '?')} epochs, "
                + (f"≥ {floor} before stopping, " if floor else "")
                + f"patience {c.get('trainer.patience', '?')}, {c.get('model.loss', '?')}")
        per.setdefault(f"{r['dataset']}/{r['model']}", set()).add(item)
    return [f"{k}: {' | '.join(sorted(v))}" for k, v in sorted(per.items())]


def commit_label(run: dict) -> str:
    """A run's commit as the headers show it: 10 hex digits, ``+dirty`` when tracked files differed."""
    return (run["_env"].get("git_sha") or "?")[:10] + ("+dirty" if run["_env"].get("git_dirty") else "")


def runs_by_commit(runs: list[dict]) -> dict:
    """The runs of each commit as compact cell lines (``describe_missing``'s form), when a table mixes
    commits: ``{"5de5180c23": ["sports: sasrec bft, standard seed 0"], ...}``."""
    per: dict = {}
    for r in runs:
        per.setdefault(commit_label(r), []).append((r["dataset"], r["model"], r["tag"], r["layer"], r["seed"]))
    return {sha: describe_missing(sorted(cells)) for sha, cells in sorted(per.items())}


PREREGISTRATION = "preregistration.md"


def _git_dates(path: Path) -> list[str]:
    """ISO commit dates (UTC, newest first) of the commits that touched ``path``; [] outside git."""
    try:
        out = subprocess.run(["git", "log", "--format=%cd", "--date=iso-strict-local", "--", path.name],
                             cwd=path.parent, capture_output=True, text=True, timeout=20,
                             env={**os.environ, "TZ": "UTC"})
    except (OSError, subprocess.SubprocessError):
        return []
    return out.stdout.split() if out.returncode == 0 else []


def _git_dirty(path: Path) -> bool:
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--", path.name], cwd=path.parent,
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and bool(out.stdout.strip())


def preregistration_notes(roots, runs: list[dict]) -> list[str]:
    """A ``preregistration.md`` in a folder above any ``--runs`` folder (up to 8 levels, so that a layer's own
    folder, ``<study>/replication/runs/<dataset>/<model>/<layer>``, still finds its study's) must not change
    after the first run that followed its first commit: one line per such file that did (a later commit,
    or uncommitted edits), naming the commits' dates. Runs' start times (env.json) are UTC."""
    found = []
    for root in run_roots(roots):
        for parent in list(Path(root).resolve().parents)[:8]:
            f = parent / PREREGISTRATION
            if f.exists() and f not in found:
                found.append(f)
    notes = []
    for f in found:
        dates = sorted(d[:19] for d in _git_dates(f))  # oldest first, YYYY-MM-DDTHH:MM:SS
        if not dates:
            continue
        after = sorted(r["_env"].get("started", "")[:19] for r in runs if r["_env"].get("started", "")[:19] > dates[0])
        if not after:
            continue
        late = [d for d in dates[1:] if d > after[0]]
        if late or _git_dirty(f):
            shown = f.relative_to(Path.cwd()) if f.is_relative_to(Path.cwd()) else f  # no machine path in a table
            notes.append(f"**pre-registration changed after the first registered run** ({shown}; first run {after[0]}; "
                         f"later commits: {', '.join(late) or 'none'}{'; uncommitted edits' if _git_dirty(f) else ''})")
    return notes


def command_line(sub: str, argv: list[str] | None) -> str:
    """The command a report records in its header, as a user types it: ``bftrec-report tables --runs ...``
    (``argv``: the subcommand's arguments; None: this process's own, ``sys.argv[1:]``)."""
    return " ".join(["bftrec-report", sub, *(sys.argv[1:] if argv is None else argv)])


def header(runs: list[dict], missing: list[tuple] = (), ignored: list[str] = (), notes: list[str] = (),
           command: str = "bftrec-report") -> str:
    """The provenance bullets of a table (protocol per dataset, commits, hardware, run dates, ``command``, the
    budgets, overrides beyond the axes, missing and left-out cells, ``notes``), one markdown string."""
    shas = sorted({commit_label(r) for r in runs})
    hw = sorted({f"{r['_env'].get('device', '?')} ({r['_env'].get('device_name', '')}, "
                 f"{r['_env'].get('threads', '?')} threads)" for r in runs})
    dates = sorted(r["_env"].get("started", "?")[:10] for r in runs)
    protocols: dict = {}
    for r in runs:
        p = r["protocol"]
        scope = " (scored window only)" if p["exclude_scope"] == "window" else ""
        text = (f"{p['split']}; candidates: {p['candidates']}; history excluded: {p['exclude_history']}{scope} "
                f"(repeat target: {p['repeat_target']}); ties: {p['ties']}; selection: {p['epoch_selection']}")
        protocols.setdefault(text, set()).add(r["dataset"])
    lines = [f"- protocol: {t}" + (f" [{', '.join(sorted(d))}]" if len(protocols) > 1 else "")
             for t, d in protocols.items()]
    lines += [f"- commit(s): {', '.join(shas)}; hardware: {'; '.join(hw)}; run dates: {dates[0]} .. {dates[-1]}"
              + ("".join(f"\n  - at {sha}: {'; '.join(cells)}" for sha, cells in runs_by_commit(runs).items())
                 if len(shas) > 1 else ""),
              f"- runs: {len(runs)}; generated by `{command}` "
              "(numbers from metrics.json and ranks.csv.gz only)",
              f"- budget per pair (from the runs' configs): {'; '.join(budgets(runs))}"]
    extra = extra_overrides(runs)
    if extra:
        lines.append(f"- overrides beyond dataset, model, layer, seed: {'; '.join(extra)}")
    if missing:
        lines.append(f"- **PARTIAL: {len(missing)} of {len(runs) + len(missing)} cells missing**; means use the "
                     "seeds present, gains and p-values the seeds both layers of a comparison have. Missing:")
        lines += [f"  - {line}" for line in describe_missing(missing)]
    if ignored:
        lines.append(f"- left out: {len(ignored)} runs outside the grid ({'; '.join(ignored)})")
    lines += [f"- {n}" for n in notes]
    return "\n".join(lines)


