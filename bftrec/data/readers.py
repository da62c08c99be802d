"""Readers: one per raw file format, each returning the canonical interaction frame.

Canonical frame (DESIGN.md "Data protocol"): columns ``user`` (str), ``item`` (str) and
``timestamp``, one row per interaction, in **file order** (the later stable sort uses the row order to
break timestamp ties). ``timestamp`` is ``int64`` **Unix seconds** when the source has times; when it
has none, the column is a nullable ``Int64`` column that is entirely ``<NA>`` and the order of the rows
is the order of the events.

Timestamp units (``to_seconds``): files are expected in Unix seconds. Each value is classed by its
magnitude: ``|t| < 1e11`` seconds (up to the year 5138), ``< 1e14`` milliseconds, ``< 1e17``
microseconds, else nanoseconds (each from 1973-03-03 on; earlier sub-second values cannot be told from
seconds). A file entirely in one sub-second unit is converted to seconds (floor division) with an info
log naming the file; events of a user then falling in one second tie and keep the file order, so a
conversion that would reorder a user's events is refused. A file mixing units is refused, naming a line
in each unit.

Header rows (``_refuse_header``): ``tsv`` may have one and ``amazon_csv``'s reviews layout and
``ml_csv`` must; every other format has none, and a header-like first line there is refused, naming its
line, instead of being read as a user or an interaction. A first line is header-like when its first
field names a user column (``user``, ``user_id``, ``userId``, ``uid``, ``reviewerID``, also RecBole's
``user_id:token``) or two of its fields name known columns, or when none of its fields is an integer
while a column of the next 100 lines holds only integers.

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
import logging
import re
import zipfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from bftrec.registry import Registry

log = logging.getLogger(__name__)

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
    if path.is_dir():
        raise DataFormatError(f"{path.resolve()} is a folder, not a data file; point `path` at the file inside it")
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
        raise DataFormatError(f"{path.name}:{lineno}: not UTF-8 text (byte {data[err.start]:#04x}, e.g. Latin-1); "
                              "re-encode the file as UTF-8, e.g. iconv -f latin1 -t utf-8") from None


# (upper bound of |t|, unit, units per second); see the module docstring "Timestamp units"
_UNITS = ((10**11, "seconds", 1), (10**14, "milliseconds", 10**3), (10**17, "microseconds", 10**6),
          (None, "nanoseconds", 10**9))


def to_seconds(path: Path, users: Sequence, ts: np.ndarray, lineno: Callable[[int], int]
               ) -> np.ndarray:
    """``(n,) int64`` timestamps of any one unit -> ``(n,) int64`` Unix seconds.

    The unit of each value follows from its magnitude (module docstring "Timestamp units"); seconds
    are returned as they are, one sub-second unit is floor-divided (info log naming the file).
    ``lineno(k)`` is the 1-based file line of row ``k``. Raises ``DataFormatError`` when the file
    mixes units (naming a line in each) or when the conversion would reorder a user's events.
    """
    unit = np.searchsorted(np.array([b for b, _, _ in _UNITS[:-1]]), np.abs(ts), side="right")
    u0 = int(unit[0]) if len(unit) else 0
    other = np.flatnonzero(unit != u0)
    if len(other):
        k = int(other[0])
        a, b = (0, k) if u0 < unit[k] else (k, 0)
        raise DataFormatError(
            f"{path.name}: timestamps mix units: line {lineno(a)} has {ts[a]} ({_UNITS[unit[a]][1]}) "
            f"and line {lineno(b)} has {ts[b]} ({_UNITS[unit[b]][1]}); expected Unix seconds "
            "throughout: convert every timestamp of the file to Unix seconds")
    if u0 == 0:
        return ts
    _, name, scale = _UNITS[u0]
    sec = np.floor_divide(ts, scale)
    codes = pd.factorize(np.asarray(users, dtype=object))[0]
    rows = np.arange(len(ts))
    true, kept = np.lexsort((rows, ts, codes)), np.lexsort((rows, sec, codes))  # per-user order
    if not np.array_equal(true, kept):
        k = int(np.flatnonzero(true != kept)[0])
        first, second = sorted((lineno(int(true[k])), lineno(int(kept[k]))))
        raise DataFormatError(
            f"{path.name}: lines {first} and {second} (user {users[int(true[k])]!r}) fall in the same "
            f"second once {name} are converted to Unix seconds, and a tie keeps the file order, "
            f"which is not their time order; fix: sort the file by time, or convert it to seconds")
    log.info("%s: timestamps are in %s; converted to Unix seconds (floor division by %d)", path,
             name, scale)
    return sec


def _frame(users: Sequence, items: Sequence, timestamps: Optional[np.ndarray],
           path: Optional[Path] = None, lineno: Optional[Callable[[int], int]] = None
           ) -> pd.DataFrame:
    """The canonical frame; ``timestamps`` (with ``path`` and ``lineno`` of ``to_seconds``) pass
    through ``to_seconds``."""
    n = len(users)
    if timestamps is None:
        ts = pd.array(np.full(n, pd.NA), dtype="Int64")
    else:
        assert path is not None and lineno is not None
        ts = to_seconds(path, users, np.asarray(timestamps, dtype=np.int64), lineno)
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


_USER_COLS = ("user_id", "user", "userid", "reviewerid", "uid")
_ITEM_COLS = ("item_id", "item", "itemid", "movieid", "asin", "iid", "business_id")
_TIME_COLS = ("timestamp", "time", "unixreviewtime", "ts")
_COLUMN_NAMES = frozenset(_USER_COLS + _ITEM_COLS + _TIME_COLS + (
    "rating", "overall", "items", "item_list", "item_id_list", "sequence", "date"))
_HEADER_SAMPLE = 100  # lines after the first that the integer test of _header_reason looks at


def _colname(field: str) -> str:
    return field.split(":")[0].strip().lower()  # RecBole's "user_id:token" too


def _header_reason(fields: Sequence[str], later: Sequence[Sequence[str]]) -> Optional[str]:
    """Why the first record ``fields`` looks like a header row, or ``None`` (module docstring
    "Header rows"); ``later`` are the next records' fields."""
    names = [_colname(f) for f in fields]
    if names and (names[0] in _USER_COLS or sum(n in _COLUMN_NAMES for n in names) >= 2):
        return "its fields name columns"
    if later and not any(_INT.fullmatch(f.strip()) for f in fields):
        for j in range(len(fields)):
            col = [r[j] for r in later if len(r) > j]
            if col and all(_INT.fullmatch(v.strip()) for v in col):
                return f"no field is an integer, while column {j + 1} of the next lines is"
    return None


def _refuse_header(path: Path, lineno: int, line: str, fields: Sequence[str],
                   later: Sequence[Sequence[str]], layout: str, fix: str = "") -> None:
    """Raise ``DataFormatError`` when the first record (on ``lineno``) looks like a header row in
    a ``layout`` that has none."""
    reason = _header_reason(fields, later)
    if reason:
        raise DataFormatError(f"{path.name}:{lineno}: a header row ({reason}): {_snippet(line)}; "
                              f"{layout} files have none: delete line {lineno}{fix}")


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

    def fields(self, k: int) -> list[str]:
        """The fields of the ``k``-th non-empty line (0-based)."""
        return list(self.array[int(self.starts[k]) : int(self.starts[k] + self.counts[k])])

    def refuse_header(self, path: Path, text: str, layout: str, fix: str = "") -> None:
        """``_refuse_header`` for the first non-empty line."""
        later = [self.fields(k) for k in range(1, min(len(self.counts), _HEADER_SAMPLE + 1))]
        lineno = int(self.linenos[0])
        _refuse_header(path, lineno, _line(text, lineno), self.fields(0), later, layout, fix)

    def lineno(self, skip: int = 0) -> Callable[[int], int]:
        """Row ``k`` of ``table(n, skip)`` -> its 1-based file line."""
        return lambda k: int(self.linenos[skip + k])

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
    error (the file would be in another format, e.g. SASRec's ``user item`` lines). No header row:
    a header-like first line is an error (module docstring "Header rows").
    """
    path, expected = Path(path), "'user item [item …]' per line, one line per user (s3rec)"
    text = _text(path)
    _check_id_chars(path, text, expected)
    tok = _Tokens(path, text)
    tok.refuse_header(path, text, "s3rec")
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
    """SASRec interaction file (ICDM 2018): ``user item`` per line, chronological within a user.

    No header row: a header-like first line is an error (module docstring "Header rows").
    """
    path, expected = Path(path), "'user item' per line (sasrec)"
    text = _text(path)
    _check_id_chars(path, text, expected)
    tok = _Tokens(path, text)
    tok.refuse_header(path, text, "sasrec")
    tok.check_counts(path, text, 2, 2, expected)
    t = tok.table(2)
    return _frame(t[:, 0], t[:, 1], None)


def _pick(header: list[str], names: Iterable[str]) -> Optional[int]:
    clean = [_colname(h) for h in header]
    return next((clean.index(n) for n in names if n in clean), None)


def _check_spaced_ids(path: Path, text: str) -> None:
    """A tab-separated file whose line has as many tabs as the first line but more whitespace-separated fields
    holds a space inside a field (an id such as 'user two'): one line naming it, instead of the column error
    it would cause (fields split on any whitespace). Mixed separators (``1<TAB>2  1390694400``) have fewer
    tabs than the first line and pass."""
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    k0 = first.count("\t")
    if not k0:
        return
    for m in re.finditer(r"^[^\n]*\S +\S[^\n]*$", text, re.M):
        line = m.group(0)
        if line.count("\t") == k0 and len(line.split()) > k0 + 1:
            field = next(f.strip() for f in line.split("\t") if " " in f.strip())
            lineno = text[: m.start()].count("\n") + 1
            raise DataFormatError(f"{path.name}:{lineno}: the tab-separated field {field!r} holds a space; ids "
                                  "cannot contain spaces here (fields split on whitespace): replace them, e.g. "
                                  "with '_'")


@READERS.register("tsv")
def read_tsv(path: Path) -> pd.DataFrame:
    """Tab (or whitespace) separated ``user item timestamp``, optional header, extra columns ignored.

    The first line is a header row when its third field is not an integer (or it has fewer than three
    fields); if it then does not look like a header (module docstring "Header rows"), it is a data row
    whose timestamp is not an integer, an error. With a header, columns are picked by name:
    ``user_id``/``user``, ``item_id``/``item``, ``timestamp`` (RecBole ``name:type`` headers work
    too); a header without a time column gives a frame without timestamps. Without a header the
    first three columns are user, item, timestamp. Every row must have as many fields as the first.
    """
    path = Path(path)
    expected = "'user<TAB>item<TAB>timestamp[<TAB>…]' per line with an optional header row (tsv)"
    text = _text(path)
    _check_id_chars(path, text, expected)
    _check_spaced_ids(path, text)
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
        lineno = int(tok.linenos[0])
        later = [tok.fields(k) for k in range(1, min(len(tok.counts), _HEADER_SAMPLE + 1))]
        if n >= 3 and _header_reason(first, later) is None:
            raise _fail(path, lineno, "timestamp is not an integer", _line(text, lineno), expected)
        u, i, t = _pick(first, _USER_COLS), _pick(first, _ITEM_COLS), _pick(first, _TIME_COLS)
        if u is None or i is None:
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
    return _frame(table[:, cols[0]], table[:, cols[1]], ts, path, tok.lineno(skip))


@READERS.register("ml_udata")
def read_ml_udata(path: Path) -> pd.DataFrame:
    """MovieLens 100K ``u.data``: tab-separated ``user item rating timestamp``, no header row (a
    header-like first line is an error; reader ``tsv`` takes a header)."""
    path, expected = Path(path), "'user<TAB>item<TAB>rating<TAB>timestamp' per line (ml_udata)"
    text = _text(path)
    _check_id_chars(path, text, expected)
    tok = _Tokens(path, text)
    tok.refuse_header(path, text, "ml_udata", ", or use reader tsv (which takes a header)")
    tok.check_counts(path, text, 4, 4, expected)
    t = tok.table(4)
    return _frame(t[:, 0], t[:, 1], _timestamps(path, text, t[:, 3], tok.linenos, expected), path,
                  tok.lineno())


_EMPTY_FIELD = re.compile(r"^::|:::|::\r?$", flags=re.M)


@READERS.register("ml_dat")
def read_ml_dat(path: Path) -> pd.DataFrame:
    """MovieLens 1M/10M ``ratings.dat``: ``user::item::rating::timestamp`` per line.

    Fields are separated by ``::``; whitespace around a line or a field is ignored. No header row
    (a header-like first line is an error).
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
    tok.refuse_header(path, text, "ml_dat")
    tok.check_counts(path, text, 4, 4, expected)
    t = tok.table(4)
    return _frame(t[:, 0], t[:, 1], _timestamps(path, text, t[:, 3], tok.linenos, expected), path,
                  tok.lineno())


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


def _csv_head(data: bytes) -> tuple[list[tuple[int, list[str]]], str]:
    """The first ``_HEADER_SAMPLE + 1`` non-blank CSV records of ``data`` (RFC-4180 quoting) as
    ``(1-based line where the record starts, fields)``, and the decoded text they come from."""
    prefix = data[: 1 << 20]
    text = prefix.decode("utf-8-sig", errors="replace")
    reader = csv.reader(io.StringIO(text))
    out: list[tuple[int, list[str]]] = []
    start = 1
    try:
        for row in reader:
            if any(f.strip() for f in row):
                out.append((start, row))
                if len(out) > _HEADER_SAMPLE + 1:
                    break
            start = reader.line_num + 1
    except csv.Error:
        pass  # the full parse (pandas) reports it with its line
    if len(prefix) < len(data) and len(out) <= _HEADER_SAMPLE + 1:
        out = out[:-1]  # the last record may be cut by the prefix
    return out[: _HEADER_SAMPLE + 1], text


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
    return _frame(u.to_numpy(), i.to_numpy(), ts, path, lambda k: _csv_lineno(data, k, header))


@READERS.register("amazon_csv")
def read_amazon_csv(path: Path) -> pd.DataFrame:
    """Amazon review CSV, plain, gzip or in a zip, in either of two layouts.

    - the 2014 ratings-only file ``user,item,rating,timestamp`` without a header (a header-like
      first record is an error, module docstring "Header rows");
    - a reviews CSV with a header holding ``reviewerID``, ``asin`` and ``unixReviewTime`` (e.g. the
      Kaggle ``Musical_instruments_reviews.csv``; RFC-4180 quoting, text may hold newlines).
    """
    path = Path(path)
    expected = ("'user,item,rating,timestamp' rows, or a header with reviewerID, asin, unixReviewTime "
                "(amazon_csv)")
    data = open_bytes(path)
    records, text = _csv_head(data)
    lineno, fields = records[0] if records else (1, [])
    head = _line(text, lineno)
    if {"reviewerID", "asin"} <= {f.strip() for f in fields}:
        df = _read_csv(path, data, True, None, expected)
        missing = [c for c in ("reviewerID", "asin", "unixReviewTime") if c not in df.columns]
        if missing:
            raise _fail(path, lineno, f"header lacks {missing}", head, expected)
        return _csv_frame(path, data, df, True, ("reviewerID", "asin", "unixReviewTime"), expected)
    if head.lstrip().startswith(("{", "[")) or len(fields) != 4:
        raise _fail(path, lineno, "not a 4-column CSV", head, expected)
    _refuse_header(path, lineno, head, fields, [r for _, r in records[1:]],
                   "headerless 'user,item,rating,timestamp' (amazon_csv ratings)",
                   ", or name the columns reviewerID, asin, unixReviewTime")
    df = _read_csv(path, data, False, ["user", "item", "rating", "timestamp"], expected)
    return _csv_frame(path, data, df, False, ("user", "item", "timestamp"), expected)


@READERS.register("ml_csv")
def read_ml_csv(path: Path) -> pd.DataFrame:
    """MovieLens 20M/25M/32M ``ratings.csv``: header ``userId,movieId,rating,timestamp``."""
    path, expected = Path(path), "header 'userId,movieId,rating,timestamp' then CSV rows (ml_csv)"
    data = open_bytes(path)
    records, text = _csv_head(data)
    lineno, fields = records[0] if records else (1, [])
    if [f.strip() for f in fields][:4] != ["userId", "movieId", "rating", "timestamp"]:
        later = [r for _, r in records[1:]]
        what = "wrong header" if _header_reason(fields, later) else "no header row"
        raise _fail(path, lineno, what, _line(text, lineno), expected)
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
    users, items, times, linenos = [], [], [], []
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
        linenos.append(lineno)
    if not users:
        raise DataFormatError(f"{path.name}: no interactions (the file is empty)")
    return _frame(users, items, np.asarray(times, dtype=np.int64), path, linenos.__getitem__)


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


@READERS.register("csv")
def read_named_csv(path: Path, columns: Optional[dict] = None, delimiter: str = ",") -> pd.DataFrame:
    """A delimited file with a header row, its columns named by the dataset config (``format: csv``):
    ``columns: {user: <name>, item: <name>, timestamp: <name or null>}``, ``delimiter`` (one character).
    Other columns are ignored; RFC-4180 quoting (a quoted field may span lines). A null timestamp column
    gives data without timestamps.

    Raises:
        DataFormatError (one line, naming the file and the line): a named column missing from the header
        (listing the header's names), a header that reads as one field holding another delimiter (naming it),
        an unterminated quote, a missing field, a timestamp that is not an integer.
    """
    path = Path(path)
    cols = {"user": "user_id", "item": "item_id", "timestamp": "timestamp", **(columns or {})}
    want = [cols["user"], cols["item"]] + ([cols["timestamp"]] if cols.get("timestamp") else [])
    expected = f"a header naming {', '.join(want)}, then {delimiter!r}-separated rows (format: csv)"
    if len(delimiter) != 1:
        raise DataFormatError(f"{path.name}: dataset.delimiter={delimiter!r} must be one character, e.g. ','")
    data = open_bytes(path)
    text = data[: 1 << 20].decode("utf-8-sig", errors="replace")
    first = next((i + 1 for i, ln in enumerate(text.splitlines()) if ln.strip()), 1)
    head = _line(text, first)
    fields = [f.strip().strip('"') for f in next(csv.reader([head], delimiter=delimiter), [])]
    missing = [c for c in want if c not in fields]
    if missing:
        other = next((d for d in (",", ";", "\t", "|") if d != delimiter and d in head), None)
        if len(fields) == 1 and other:
            raise DataFormatError(f"{path.name}:{first}: the header reads as one field {head[:60]!r}: it is "
                                  f"{other!r}-separated; set dataset.delimiter={other!r}")
        raise DataFormatError(f"{path.name}:{first}: the header lacks {', '.join(map(repr, missing))} (it has "
                              f"{', '.join(fields[:12])}); set dataset.columns to the names the file uses")
    try:
        df = pd.read_csv(io.BytesIO(data), sep=delimiter, dtype=str, usecols=want, keep_default_na=False,
                         na_values=[""], encoding="utf-8-sig", engine="c", skipinitialspace=True)
    except pd.errors.ParserError as err:
        msg = " ".join(str(err).split())
        m = re.search(r"(?:line|row) (\d+)", msg)
        where = f":{m.group(1)}" if m else ""
        fix = "close the quote" if "EOF inside string" in msg else f"expected {expected}"
        raise DataFormatError(f"{path.name}{where}: {msg}; {fix}") from None
    if cols.get("timestamp"):
        return _csv_frame(path, data, df, True, (cols["user"], cols["item"], cols["timestamp"]), expected)
    if len(df) == 0:
        raise DataFormatError(f"{path.name}: no interactions (the file is empty)")
    u, i = df[cols["user"]].str.strip(), df[cols["item"]].str.strip()
    bad = (u.isna() | i.isna()).to_numpy()
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        lineno = _csv_lineno(data, k, True)
        raise _fail(path, lineno, "missing field", _line(text, lineno), expected)
    return _frame(u.to_numpy(), i.to_numpy(), None)
