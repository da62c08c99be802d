"""Readers: one per raw file format, each returning the canonical interaction frame.

Canonical frame (DESIGN.md "Data protocol"): columns ``user`` (str), ``item`` (str) and
``timestamp``, one row per interaction, in **file order** (the later stable sort uses the row order to
break timestamp ties). ``timestamp`` is ``int64`` unix seconds when the source has times; when it has
none, the column is a nullable ``Int64`` column that is entirely ``<NA>`` and the order of the rows is
the order of the events.

Every reader tolerates empty lines, trailing whitespace, tabs versus spaces (except inside CSV/JSON
values) and string ids, and reads gzip files (detected by magic bytes) and zip archives holding one
file. A malformed line, or a file that is clearly in another format, raises ``DataFormatError`` with
one line: file name, line number, the offending text (truncated) and the expected format. A missing
file raises ``FileNotFoundError``.

Formats (``READERS`` names): ``s3rec`` (S3-Rec, Zhou et al. CIKM 2020: ``user item item …`` per
line), ``sasrec`` (Kang & McAuley ICDM 2018: ``user item`` per line), ``tsv``, ``amazon_csv``,
``amazon_json`` (McAuley 2014/2018 review json lines), ``lcrec_json`` (LC-Rec ICDE 2024
``{user: [items…]}``), ``ml_dat``, ``ml_udata``, ``ml_csv`` (MovieLens, Harper & Konstan TiiS 2015).
"""
from __future__ import annotations

import csv
import gzip
import io
import json
import re
import zipfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from bftrec.registry import Registry

Reader = Callable[[Path], pd.DataFrame]
READERS: Registry[Reader] = Registry("reader")

# characters allowed in an id of the whitespace-separated formats; anything else ({ " , [ …) means
# the file is in another format
_BAD_ID_CHAR = re.compile(r"[^\w\s.\-:@+/]")
_INT = re.compile(r"-?\d+")


class DataFormatError(ValueError):
    """A raw data file does not match its declared format (message is one line)."""


def _snippet(text: str, limit: int = 80) -> str:
    text = text.strip()
    return repr(text if len(text) <= limit else text[:limit] + "…")


def _fail(path: Path, lineno: Optional[int], what: str, text: str, expected: str) -> DataFormatError:
    where = f"{path.name}:{lineno}" if lineno is not None else path.name
    return DataFormatError(f"{where}: {what}: {_snippet(text)}; expected {expected}")


def open_bytes(path: Path) -> bytes:
    """The decompressed content of ``path``: plain, gzip (magic ``1f 8b``) or zip with one file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"data file not found: {path.resolve()} (set the data root with BFTREC_DATA_ROOT=/path "
            "or data_root=/path; see data/README.md)"
        )
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        return gzip.decompress(raw)
    if raw[:4] == b"PK\x03\x04":
        with zipfile.ZipFile(io.BytesIO(raw)) as zf:
            members = [m for m in zf.namelist() if not m.endswith("/") and "__MACOSX" not in m]
            if len(members) != 1:
                raise DataFormatError(
                    f"{path.name}: zip archive holds {len(members)} files {members[:5]}; expected one"
                )
            return zf.read(members[0])
    return raw


def _text(path: Path) -> str:
    data = open_bytes(path)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        lineno = data[: err.start].count(b"\n") + 1
        raise DataFormatError(f"{path.name}:{lineno}: not UTF-8 text; expected a text file") from None


def _frame(users: Sequence, items: Sequence, timestamps: Optional[np.ndarray]) -> pd.DataFrame:
    n = len(users)
    if timestamps is None:
        ts = pd.array(np.full(n, pd.NA), dtype="Int64")
    else:
        ts = np.asarray(timestamps, dtype=np.int64)
    return pd.DataFrame(
        {
            "user": pd.array(users, dtype=str),
            "item": pd.array(items, dtype=str),
            "timestamp": ts,
        }
    )


def _line(text: str, lineno: Optional[int]) -> str:
    """The text of 1-based line ``lineno`` (for error messages)."""
    if lineno is None:
        return ""
    lines = text.split("\n", lineno)
    return lines[lineno - 1] if len(lines) >= lineno else ""


def _check_id_chars(path: Path, text: str, expected: str) -> None:
    """Raise at the first character that no id of a whitespace format may contain."""
    if text.isascii():
        bad = _BAD_BYTE[np.frombuffer(text.encode("ascii"), dtype=np.uint8)]
        pos = int(np.argmax(bad)) if bad.any() else None
    else:
        m = _BAD_ID_CHAR.search(text)
        pos = m.start() if m else None
    if pos is not None:
        lineno = text.count("\n", 0, pos) + 1
        raise _fail(path, lineno, f"unexpected character {text[pos]!r}", _line(text, lineno), expected)


_WS = np.zeros(256, dtype=bool)
_WS[[9, 10, 11, 12, 13, 32]] = True
_BAD_BYTE = np.array([bool(_BAD_ID_CHAR.match(chr(c))) for c in range(256)])


class _Tokens:
    """Whitespace tokens of a text, with the 1-based line number and the field count of every
    non-empty line (vectorised for ASCII text, line by line otherwise)."""

    def __init__(self, path: Path, text: str) -> None:
        if text.isascii():
            tokens = text.split()
            b = np.frombuffer(text.encode("ascii"), dtype=np.uint8)
            ws = _WS[b]
            start = ~ws
            start[1:] &= ws[:-1]
            newlines = np.flatnonzero(b == 10)
            line0 = np.searchsorted(newlines, np.flatnonzero(start))  # 0-based line of each token
            counts = np.bincount(line0, minlength=len(newlines) + 1)
            self.linenos = np.flatnonzero(counts) + 1
            self.counts = counts[self.linenos - 1]
        else:
            rows = [(i, ln.split()) for i, ln in enumerate(text.split("\n"), 1)]
            rows = [(i, f) for i, f in rows if f]
            tokens = [t for _, f in rows for t in f]
            self.linenos = np.asarray([i for i, _ in rows], dtype=np.int64)
            self.counts = np.asarray([len(f) for _, f in rows], dtype=np.int64)
        if not tokens:
            raise DataFormatError(f"{path.name}: no interactions (the file is empty)")
        self.array = np.asarray(tokens, dtype=object)
        self.starts = np.concatenate(([0], np.cumsum(self.counts)[:-1]))

    def check_counts(self, path: Path, text: str, lo: int, hi: Optional[int], expected: str,
                     skip: int = 0) -> None:
        """Raise for the first line (after ``skip`` lines) whose field count is outside [lo, hi]."""
        c = self.counts[skip:]
        bad = (c < lo) if hi is None else ((c < lo) | (c > hi))
        if bad.any():
            k = int(np.flatnonzero(bad)[0]) + skip
            lineno = int(self.linenos[k])
            raise _fail(path, lineno, f"{self.counts[k]} fields", _line(text, lineno), expected)

    def table(self, n: int, skip: int = 0) -> np.ndarray:
        """``(lines - skip, n)`` object array; call ``check_counts(n, n)`` first."""
        return self.array[int(self.starts[skip]) if skip else 0:].reshape(-1, n)


def _timestamps(path: Path, text: str, values: np.ndarray, linenos: np.ndarray, expected: str
                ) -> np.ndarray:
    """Integer strings to ``int64`` (vectorised); raise on the first non-integer with its line."""
    try:
        return values.astype(str).astype(np.int64)
    except (ValueError, OverflowError):
        for k, v in enumerate(values):
            if not _INT.fullmatch(str(v)) or not -(2**63) <= int(v) < 2**63:
                lineno = int(linenos[k])
                raise _fail(path, lineno, "timestamp is not an integer", _line(text, lineno),
                            expected) from None
        raise


# --------------------------------------------------------------------------- whitespace formats


@READERS.register("s3rec")
def read_s3rec(path: Path) -> pd.DataFrame:
    """S3-Rec sequence file (CIKM 2020): one line per user, ``user item item …``.

    No timestamps: the order in the line is the order of the events. A user id on two lines is an
    error (the file would be in another format, e.g. SASRec's ``user item`` lines).
    """
    path, expected = Path(path), "'user item [item …]' per line, one line per user (s3rec)"
    text = _text(path)
    _check_id_chars(path, text, expected)
    tok = _Tokens(path, text)
    tok.check_counts(path, text, 2, None, expected)
    users = tok.array[tok.starts]
    dup = pd.Series(users).duplicated(keep="first").to_numpy()
    if dup.any():
        k = int(np.flatnonzero(dup)[0])
        first = int(tok.linenos[np.flatnonzero(users == users[k])[0]])
        lineno = int(tok.linenos[k])
        raise _fail(path, lineno, f"user {users[k]!r} already had line {first}", _line(text, lineno),
                    expected)
    is_item = np.ones(len(tok.array), dtype=bool)
    is_item[tok.starts] = False
    return _frame(np.repeat(users, tok.counts - 1), tok.array[is_item], None)


@READERS.register("sasrec")
def read_sasrec(path: Path) -> pd.DataFrame:
    """SASRec interaction file (ICDM 2018): ``user item`` per line, chronological within a user."""
    path, expected = Path(path), "'user item' per line (sasrec)"
    text = _text(path)
    _check_id_chars(path, text, expected)
    tok = _Tokens(path, text)
    tok.check_counts(path, text, 2, 2, expected)
    t = tok.table(2)
    return _frame(t[:, 0], t[:, 1], None)


_USER_COLS = ("user_id", "user", "userid", "reviewerid", "uid")
_ITEM_COLS = ("item_id", "item", "itemid", "movieid", "asin", "iid", "business_id")
_TIME_COLS = ("timestamp", "time", "unixreviewtime", "ts")


def _pick(header: list[str], names: Iterable[str]) -> Optional[int]:
    clean = [h.split(":")[0].strip().lower() for h in header]  # RecBole's "user_id:token" too
    return next((clean.index(n) for n in names if n in clean), None)


@READERS.register("tsv")
def read_tsv(path: Path) -> pd.DataFrame:
    """Tab (or whitespace) separated ``user item timestamp``, optional header, extra columns ignored.

    A header row is recognised by a non-integer third field. With a header, columns are picked by
    name: ``user_id``/``user``, ``item_id``/``item``, ``timestamp`` (RecBole ``name:type`` headers
    work too); a header without a time column gives a frame without timestamps. Without a header the
    first three columns are user, item, timestamp. Every row must have as many fields as the first.
    """
    path = Path(path)
    expected = "'user<TAB>item<TAB>timestamp[<TAB>…]' per line with an optional header row (tsv)"
    text = _text(path)
    _check_id_chars(path, text, expected)
    tok = _Tokens(path, text)
    n = int(tok.counts[0])
    first = list(tok.array[:n])
    cols: tuple[int, int, Optional[int]] = (0, 1, 2)
    skip = 0
    if n > 3 and _INT.fullmatch(first[2]) is not None:
        # without a header, a 4th column makes the time column ambiguous (u.data is user item rating time)
        raise _fail(path, int(tok.linenos[0]), f"{n} columns and no header row: which one is the timestamp?",
                    _line(text, int(tok.linenos[0])),
                    "a header naming user_id, item_id and timestamp, or exactly 3 columns (or reader ml_udata)")
    if n < 3 or _INT.fullmatch(first[2]) is None:
        u, i, t = _pick(first, _USER_COLS), _pick(first, _ITEM_COLS), _pick(first, _TIME_COLS)
        if u is None or i is None:
            lineno = int(tok.linenos[0])
            raise _fail(path, lineno, "neither a header with user and item columns nor 3+ fields",
                        _line(text, lineno), expected)
        cols, skip = (u, i, t), 1
        if len(tok.counts) == 1:
            raise DataFormatError(f"{path.name}: no interactions (only a header)")
    tok.check_counts(path, text, n, n, expected, skip=skip)
    table = tok.table(n, skip)
    ts = None
    if cols[2] is not None:
        ts = _timestamps(path, text, table[:, cols[2]], tok.linenos[skip:], expected)
    return _frame(table[:, cols[0]], table[:, cols[1]], ts)


@READERS.register("ml_udata")
def read_ml_udata(path: Path) -> pd.DataFrame:
    """MovieLens 100K ``u.data``: tab-separated ``user item rating timestamp``, no header."""
    path, expected = Path(path), "'user<TAB>item<TAB>rating<TAB>timestamp' per line (ml_udata)"
    text = _text(path)
    _check_id_chars(path, text, expected)
    tok = _Tokens(path, text)
    tok.check_counts(path, text, 4, 4, expected)
    t = tok.table(4)
    return _frame(t[:, 0], t[:, 1], _timestamps(path, text, t[:, 3], tok.linenos, expected))


_EMPTY_FIELD = re.compile(r"^::|:::|::\r?$", flags=re.M)


@READERS.register("ml_dat")
def read_ml_dat(path: Path) -> pd.DataFrame:
    """MovieLens 1M/10M ``ratings.dat``: ``user::item::rating::timestamp`` per line.

    Fields are separated by ``::``; whitespace around a line or a field is ignored.
    """
    path, expected = Path(path), "'user::item::rating::timestamp' per line (ml_dat)"
    text = _text(path)
    _check_id_chars(path, text, expected)
    if " " in text or "\t" in text:  # tolerate whitespace around fields; none may remain inside
        text = "\n".join("::".join(f.strip() for f in ln.split("::")) for ln in text.split("\n"))
        m = re.search(r"[ \t]", text)
        if m:
            lineno = text.count("\n", 0, m.start()) + 1
            raise _fail(path, lineno, "whitespace inside a field", _line(text, lineno), expected)
    m = _EMPTY_FIELD.search(text) if (":::" in text or "\n::" in text or "::\n" in text
                                      or "::\r" in text or text.startswith("::")
                                      or text.rstrip().endswith("::")) else None
    if m:
        lineno = text.count("\n", 0, m.start()) + 1
        raise _fail(path, lineno, "empty field", _line(text, lineno), expected)
    tok = _Tokens(path, text.replace("::", "\t"))
    tok.check_counts(path, text, 4, 4, expected)
    t = tok.table(4)
    return _frame(t[:, 0], t[:, 1], _timestamps(path, text, t[:, 3], tok.linenos, expected))


# --------------------------------------------------------------------------- CSV formats (pandas)


def _csv_lineno(data: bytes, record: int, header: bool) -> int:
    """Physical line number where CSV data record ``record`` (0-based, blank lines skipped) starts."""
    reader = csv.reader(io.StringIO(data.decode("utf-8-sig", errors="replace")))
    seen, start = -1 if not header else -2, 1
    for row in reader:
        if row:
            seen += 1
            if seen == record:
                return start
        start = reader.line_num + 1
    return start


def _read_csv(path: Path, data: bytes, header: bool, names: Optional[list[str]], expected: str
              ) -> pd.DataFrame:
    try:
        return pd.read_csv(io.BytesIO(data), header=0 if header else None, names=names, dtype=str,
                           skipinitialspace=True, keep_default_na=False, na_values=[""],
                           encoding="utf-8-sig", engine="c")
    except pd.errors.ParserError as err:
        msg = " ".join(str(err).split())
        m = re.search(r"line (\d+)", msg)
        lineno = int(m.group(1)) if m else None
        raise DataFormatError(
            f"{path.name}:{lineno if lineno is not None else '?'}: {msg}; expected {expected}"
        ) from None


def _csv_frame(path: Path, data: bytes, df: pd.DataFrame, header: bool, cols: tuple[str, str, str],
               expected: str) -> pd.DataFrame:
    if len(df) == 0:
        raise DataFormatError(f"{path.name}: no interactions (the file is empty)")
    u, i, t = (df[c].str.strip() for c in cols)
    bad = (u.isna() | i.isna() | t.isna()).to_numpy()
    what, ts = "missing field", None
    if not bad.any():
        what = "timestamp is not an integer"
        try:  # fast path: numpy parses the integer strings
            ts = t.to_numpy(dtype=str).astype(np.int64)
        except (ValueError, OverflowError):
            bad = ~t.str.fullmatch(r"-?\d+").to_numpy(dtype=bool)
    if ts is None:
        k = int(np.flatnonzero(bad)[0]) if bad.any() else 0
        lines = data.decode("utf-8-sig", errors="replace").splitlines()
        lineno = _csv_lineno(data, k, header)
        raise _fail(path, lineno, what, lines[lineno - 1] if lineno <= len(lines) else "", expected)
    return _frame(u.to_numpy(), i.to_numpy(), ts)


@READERS.register("amazon_csv")
def read_amazon_csv(path: Path) -> pd.DataFrame:
    """Amazon review CSV, plain, gzip or in a zip, in either of two layouts.

    - the 2014 ratings-only file ``user,item,rating,timestamp`` without a header;
    - a reviews CSV with a header holding ``reviewerID``, ``asin`` and ``unixReviewTime`` (e.g. the
      Kaggle ``Musical_instruments_reviews.csv``; RFC-4180 quoting, text may hold newlines).
    """
    path = Path(path)
    expected = ("'user,item,rating,timestamp' rows, or a header with reviewerID, asin, unixReviewTime "
                "(amazon_csv)")
    data = open_bytes(path)
    first = data.lstrip()[:4096].decode("utf-8-sig", errors="replace").splitlines()
    head = first[0] if first else ""
    if "reviewerID" in head and "asin" in head:
        df = _read_csv(path, data, True, None, expected)
        missing = [c for c in ("reviewerID", "asin", "unixReviewTime") if c not in df.columns]
        if missing:
            raise _fail(path, 1, f"header lacks {missing}", head, expected)
        return _csv_frame(path, data, df, True, ("reviewerID", "asin", "unixReviewTime"), expected)
    if head.lstrip().startswith(("{", "[")) or head.count(",") != 3:
        raise _fail(path, 1, "not a 4-column CSV", head, expected)
    df = _read_csv(path, data, False, ["user", "item", "rating", "timestamp"], expected)
    return _csv_frame(path, data, df, False, ("user", "item", "timestamp"), expected)


@READERS.register("ml_csv")
def read_ml_csv(path: Path) -> pd.DataFrame:
    """MovieLens 20M/25M/32M ``ratings.csv``: header ``userId,movieId,rating,timestamp``."""
    path, expected = Path(path), "header 'userId,movieId,rating,timestamp' then CSV rows (ml_csv)"
    data = open_bytes(path)
    lines = data.lstrip()[:4096].decode("utf-8-sig", errors="replace").splitlines()
    head = lines[0] if lines else ""
    if [h.strip() for h in head.split(",")][:4] != ["userId", "movieId", "rating", "timestamp"]:
        raise _fail(path, 1, "wrong header", head, expected)
    df = _read_csv(path, data, True, None, expected)
    return _csv_frame(path, data, df, True, ("userId", "movieId", "timestamp"), expected)


# --------------------------------------------------------------------------- JSON formats


@READERS.register("amazon_json")
def read_amazon_json(path: Path) -> pd.DataFrame:
    """Amazon review json lines (McAuley 2014 and 2018): ``reviewerID``, ``asin``, ``unixReviewTime``.

    One JSON object per line, plain or gzip; other keys are ignored.
    """
    path = Path(path)
    expected = "one JSON object per line with reviewerID, asin, unixReviewTime (amazon_json)"
    users, items, times = [], [], []
    for lineno, line in enumerate(_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            u, i, t = rec["reviewerID"], rec["asin"], rec["unixReviewTime"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise _fail(path, lineno, "not a review record", line, expected) from None
        if isinstance(t, bool) or not (isinstance(t, int) or (isinstance(t, str) and _INT.fullmatch(t))):
            raise _fail(path, lineno, "timestamp is not an integer", line, expected)
        if not isinstance(u, (str, int)) or not isinstance(i, (str, int)) or isinstance(u, bool):
            raise _fail(path, lineno, "ids must be strings", line, expected)
        users.append(str(u))
        items.append(str(i))
        times.append(int(t))
    if not users:
        raise DataFormatError(f"{path.name}: no interactions (the file is empty)")
    return _frame(users, items, np.asarray(times, dtype=np.int64))


@READERS.register("lcrec_json")
def read_lcrec_json(path: Path) -> pd.DataFrame:
    """LC-Rec ``*.inter.json`` (ICDE 2024): one JSON object ``{"user": [item, item, …], …}``.

    Lists are chronological; no timestamps. Users keep the object's key order.
    """
    path, expected = Path(path), "a JSON object {user: [item, …]} (lcrec_json)"
    text = _text(path)
    def no_duplicate_users(pairs: list) -> dict:
        seen: dict = {}
        for key, value in pairs:
            if key in seen and isinstance(value, list):
                raise _fail(path, None, f"user {key!r} appears twice", key, expected)
            seen[key] = value
        return seen

    try:
        obj = json.loads(text, object_pairs_hook=no_duplicate_users)
    except json.JSONDecodeError as err:
        line = text.splitlines()[err.lineno - 1] if text.strip() else text
        raise _fail(path, err.lineno, f"invalid JSON ({err.msg})", line, expected) from None
    if not isinstance(obj, dict) or not obj:
        raise _fail(path, 1, "not a non-empty JSON object", text[:80], expected)

    def where(key: str) -> int:
        return text.count("\n", 0, max(text.find(json.dumps(key)), 0)) + 1

    users, items = [], []
    for key, seq in obj.items():
        if not isinstance(seq, list) or not seq:
            raise _fail(path, where(key), f"user {key!r} has no item list", str(seq), expected)
        for it in seq:
            if isinstance(it, bool) or not isinstance(it, (int, str)):
                raise _fail(path, where(key), f"user {key!r} has a non-id item", str(it), expected)
        users.extend([key] * len(seq))
        items.extend(map(str, seq))
    return _frame(users, items, None)


def read(fmt: str, path: Path) -> pd.DataFrame:
    """Read ``path`` with the reader registered as ``fmt`` (unknown name: ``KeyError`` listing all)."""
    return READERS.get(fmt)(Path(path))
