"""Load a dataset by config: read -> check -> preprocess, with an on-disk cache.

``load_dataset`` follows DESIGN.md "Data protocol": the raw file is found under the data root
(argument, else ``$BFTREC_DATA_ROOT``), hashed (sha256, checked against ``cfg.sha256``), read by the
reader ``cfg.format``, checked against ``cfg.expected`` (raw users/items/interactions, from the
dataset's ``SOURCE.md``) and preprocessed (``bftrec.data.preprocess``). The processed arrays are
cached as ``<cache>/<name>-<key>.npz`` (written atomically), keyed by the sha256 of the raw file and
a hash of every config field that changes the result; the cache directory is the argument, else
``$BFTREC_CACHE_DIR``, else ``~/.cache/bftrec``. The synthetic dataset is generated (well under a
second) and never cached.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import Optional, Union

import numpy as np
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from bftrec.data.config import DatasetConfig, check_config
from bftrec.data.inject import inject_random_items
from bftrec.data.preprocess import SeqData, preprocess
from bftrec.data.readers import READERS
from bftrec.data.synthetic import generate

log = logging.getLogger(__name__)

CACHE_VERSION = 2  # bump when a reader or the preprocessing changes its output (2: issue 9 units, headers)
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs" / "dataset"  # package data (bftrec/configs)
_ROOT_HINT = ("set BFTREC_DATA_ROOT=/path, or pass data_root=/path to bftrec-train / bftrec-eval "
              "(bftrec-data: <subcommand> --data-root /path; see data/README.md)")


# --------------------------------------------------------------------------- configs


def dataset_names(config_dir: Union[str, Path, None] = None) -> list[str]:
    """Names of the dataset configs (``configs/dataset/*.yaml`` stems), sorted."""
    return sorted(p.stem for p in Path(config_dir or CONFIG_DIR).glob("*.yaml"))


def to_dataset_config(cfg: Union[DatasetConfig, DictConfig, dict], where: str = "config"
                      ) -> DatasetConfig:
    """A ``DatasetConfig`` from itself, a DictConfig or a dict (merged into the structured config).

    Raises a one-line ``ValueError`` for an unknown key, a wrongly typed value or an impossible
    setting.
    """
    if isinstance(cfg, DatasetConfig):
        check_config(cfg)
        return cfg
    try:
        merged = OmegaConf.merge(OmegaConf.structured(DatasetConfig), cfg)
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as err:
        lines = str(err).strip().splitlines() or [type(err).__name__]
        key = next((ln.split(":", 1)[1].strip() for ln in lines if ln.strip().startswith("full_key:")),
                   "")
        raise ValueError(f"{where}: {lines[0]}" + (f" (key {key!r})" if key else "")) from None


def dataset_config(name: str, config_dir: Union[str, Path, None] = None) -> DatasetConfig:
    """Load ``<config_dir>/<name>.yaml`` (default ``configs/dataset``) as a ``DatasetConfig``.

    Raises a one-line ``ValueError`` for an unknown name (listing the known ones), an unknown key,
    or a ``name`` field that differs from the file stem.
    """
    path = Path(config_dir or CONFIG_DIR) / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(dataset_names(config_dir)) or "none"
        raise ValueError(f"unknown dataset {name!r}; known: {known}")
    raw = OmegaConf.load(path)
    cfg = to_dataset_config(raw, where=str(path))
    if cfg.name != name:
        raise ValueError(f"{path}: name {cfg.name!r} must equal the file stem {name!r}")
    return cfg


# --------------------------------------------------------------------------- files


def resolve_data_root(root: Union[str, Path, None] = None, name: str = "") -> Path:
    """The data root: ``root``, else ``$BFTREC_DATA_ROOT``; else a one-line ``ValueError``."""
    root = root or os.environ.get("BFTREC_DATA_ROOT")
    if not root:
        raise ValueError(f"dataset {name!r} needs its raw file: {_ROOT_HINT}")
    return Path(root).expanduser()


def resolve_cache_dir(cache_dir: Union[str, Path, None] = None) -> Path:
    """``cache_dir``, else ``$BFTREC_CACHE_DIR``, else ``~/.cache/bftrec``."""
    return Path(cache_dir or os.environ.get("BFTREC_CACHE_DIR") or "~/.cache/bftrec").expanduser()


def sha256_file(path: Union[str, Path]) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_checksum(path: Union[str, Path], sha256: Optional[str]) -> str:
    """Hash ``path`` and compare with ``sha256`` (skipped when ``None``); return the digest.

    Raises ``FileNotFoundError`` for a missing file and a one-line ``ValueError`` on mismatch.
    """
    path = Path(path)
    if path.is_dir():  # issue 50: a folder is no data file, whatever the data root
        raise ValueError(f"dataset path {path.resolve()} is a folder, not a data file; set `path` in the dataset "
                         "yaml to the file inside it (relative to the data root)")
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path.resolve()} ({_ROOT_HINT})")
    digest = sha256_file(path)
    if sha256 and digest != sha256.lower():
        raise ValueError(f"checksum mismatch for {path}: sha256 {digest}, expected {sha256} "
                         "(a different file: re-download it, or fix `sha256` in the dataset yaml)")
    return digest


def download(cfg: DatasetConfig, data_root: Union[str, Path, None] = None) -> Path:
    """Download ``cfg.url`` to ``<data root>/<cfg.path>`` and verify its sha256.

    An existing file with the right checksum is kept. Raises a one-line ``ValueError`` when the
    dataset has no direct url (see its yaml comment), ``OSError`` when the download fails.
    """
    if cfg.format == "synthetic":
        raise ValueError(f"dataset {cfg.name!r} is synthetic: nothing to download")
    dest = resolve_data_root(data_root, cfg.name) / cfg.path
    if dest.is_file():
        verify_checksum(dest, cfg.sha256)
        log.info("%s: %s is already there, checksum ok", cfg.name, dest)
        return dest
    if not cfg.url:
        raise ValueError(f"dataset {cfg.name!r} has no direct download url; see the comment in "
                         f"configs/dataset/{cfg.name}.yaml and data/README.md for how to make {dest}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name, suffix=".part")
    os.close(fd)
    try:
        log.info("%s: downloading %s", cfg.name, cfg.url)
        try:
            urllib.request.urlretrieve(cfg.url, tmp)
        except Exception as err:  # noqa: BLE001 - any network failure becomes one line
            raise OSError(f"download of {cfg.url} failed: {' '.join(str(err).split())}") from None
        verify_checksum(tmp, cfg.sha256)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest


# --------------------------------------------------------------------------- cache


def cache_key(cfg: DatasetConfig, raw_sha256: str) -> str:
    """Hex sha256 of the raw file hash and every config field that changes the processed data."""
    fields = {"version": CACHE_VERSION, "raw_sha256": raw_sha256, "name": cfg.name,
              "format": cfg.format, "kcore": cfg.kcore, "dedup": cfg.dedup,
              "min_user_interactions": cfg.min_user_interactions}
    if cfg.format == "synthetic":
        fields["synthetic"] = asdict(cfg.synthetic)
    if cfg.format == "csv":  # which columns are read changes the data
        fields.update(columns=dict(cfg.columns), delimiter=cfg.delimiter)
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def _cache_file(cfg: DatasetConfig, key: str, cache_dir: Path) -> Path:
    return cache_dir / f"{cfg.name}-{key[:24]}.npz"


def save_cache(data: SeqData, path: Path) -> None:
    """Write ``data`` to ``path`` atomically (temporary file in the same folder, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {
        "items": data.items, "offsets": data.offsets,
        "user_ids": data.user_ids.astype(str), "item_ids": data.item_ids.astype(str),
        "meta": np.array(json.dumps({"name": data.name, "n_items": data.n_items,
                                     "stats": data.stats})),
    }
    if data.timestamps is not None:
        arrays["timestamps"] = data.timestamps
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; the cache may be shared
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    path.with_suffix(".json").write_text(json.dumps(data.stats, indent=1) + "\n")


def load_cache(path: Path) -> Optional[SeqData]:
    """Read a cache file written by ``save_cache``; ``None`` when missing or unreadable."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            return SeqData(
                name=meta["name"], n_items=int(meta["n_items"]),
                user_ids=z["user_ids"].astype(object), item_ids=z["item_ids"].astype(object),
                items=z["items"], timestamps=z["timestamps"] if "timestamps" in z.files else None,
                offsets=z["offsets"], stats=meta["stats"],
            )
    except Exception as err:  # noqa: BLE001 - a broken cache file is recomputed
        log.warning("ignoring unreadable cache file %s (%s)", path, err)
        return None


# --------------------------------------------------------------------------- loading


def _check_expected(cfg: DatasetConfig, stats: dict, path: Union[Path, str]) -> None:
    for fld in ("users", "items", "interactions"):
        want = getattr(cfg.expected, fld)
        found = stats[f"raw_{fld}"]
        if want is not None and want != found:
            raise ValueError(f"dataset {cfg.name!r}: expected {want} {fld} in the raw data, found "
                             f"{found} (file {path})")


def load_dataset(cfg: Union[DatasetConfig, DictConfig, dict], data_root: Optional[str] = None,
                 cache_dir: Optional[str] = None, use_cache: bool = True) -> SeqData:
    """Read, check, preprocess and cache one dataset (see the module docstring).

    Raises ``FileNotFoundError`` (missing raw file), ``DataFormatError`` (malformed file; a
    ``ValueError``) and one-line ``ValueError`` for a missing data root, a checksum mismatch,
    statistics that differ from ``cfg.expected``, or an impossible config.
    """
    cfg = to_dataset_config(cfg, where=f"dataset config {getattr(cfg, 'name', '?')!r}")
    data = _load_clean(cfg, data_root, cache_dir, use_cache)
    seed = 0 if cfg.inject_seed is None else cfg.inject_seed  # bftrec.experiment.build passes the run's seed
    data = inject_random_items(data, cfg.inject_rate, seed)  # identity at rate 0 (the default)
    data.stats["fingerprint"] = data_fingerprint(data)
    return data


def data_fingerprint(data: SeqData) -> str:
    """Hex sha256 of the processed sequences a model sees (items, offsets, timestamps, N): two runs whose
    fingerprints differ trained or scored on different data, whatever their files were called."""
    h = hashlib.sha256(f"{data.n_items}".encode())
    for arr in (data.items, data.offsets, data.timestamps):
        if arr is not None:
            h.update(np.ascontiguousarray(arr, dtype=np.int64).tobytes())
    return h.hexdigest()


def data_identity(data: SeqData) -> dict:
    """What a run records of its data (checkpoints, metrics.json): the processed data's ``fingerprint`` and,
    for a file, its ``sha256``."""
    return {**identity_of_stats(data.stats), "fingerprint": data.stats.get("fingerprint") or data_fingerprint(data)}


def identity_of_stats(stats: dict | None) -> dict:
    """The data identity recorded in a data-statistics block (``metrics.json``'s ``data``): ``fingerprint`` and
    the raw file's ``sha256``, None where a run older than the record lacks them."""
    stats = stats or {}
    return {"fingerprint": stats.get("fingerprint"), "sha256": (stats.get("source") or {}).get("sha256")}


_SHA_MEMO: dict = {}


def raw_sha256(cfg: DatasetConfig, data_root: Optional[str]) -> Optional[str]:
    """The sha256 of a dataset's raw file as it is now (None for generated data or a missing file), memoised
    per (path, size, mtime) within the process: cheap enough to check every skipped grid cell."""
    if cfg.format == "synthetic":
        return None
    try:
        path = resolve_data_root(data_root, cfg.name) / cfg.path
        st = path.stat()
    except (ValueError, OSError):
        return None
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _SHA_MEMO:
        _SHA_MEMO[key] = sha256_file(path)
    return _SHA_MEMO[key]


def other_data(recorded: dict | None, current: dict) -> str | None:
    """One line saying how ``current`` (``data_identity``) differs from a run's ``recorded`` identity; None when
    they agree or nothing was recorded (a run older than the record)."""
    if not recorded:
        return None
    for key in ("sha256", "fingerprint"):
        a, b = recorded.get(key), current.get(key)
        if a and b and a != b:
            return f"data {key} {b[:12]} here, {a[:12]} in the run"
    return None


def _load_clean(cfg: DatasetConfig, data_root: Optional[str], cache_dir: Optional[str], use_cache: bool) -> SeqData:
    """``load_dataset`` before the optional injection (``bftrec.data.inject``): read, preprocess, cache."""
    if cfg.format == "synthetic":
        data = preprocess(generate(cfg.synthetic), cfg)
        _check_expected(cfg, data.stats, "<synthetic>")
        return data
    reader = READERS.get(cfg.format)
    path = resolve_data_root(data_root, cfg.name) / cfg.path
    digest = verify_checksum(path, cfg.sha256)
    key = cache_key(cfg, digest)
    cfile = _cache_file(cfg, key, resolve_cache_dir(cache_dir))
    if use_cache:
        data = load_cache(cfile)
        if data is not None:
            _check_expected(cfg, data.stats, path)
            log.info("%s: loaded from cache %s", cfg.name, cfile)
            return data
    frame = reader(path, columns=dict(cfg.columns), delimiter=cfg.delimiter) if cfg.format == "csv" else reader(path)
    stats = {"raw_users": frame["user"].nunique(), "raw_items": frame["item"].nunique(),
             "raw_interactions": len(frame)}
    _check_expected(cfg, stats, path)
    data = preprocess(frame, cfg)
    data.stats["source"] = {"path": cfg.path, "sha256": digest, "format": cfg.format}
    if use_cache:
        save_cache(data, cfile)
        log.info("%s: cached at %s", cfg.name, cfile)
    return data
