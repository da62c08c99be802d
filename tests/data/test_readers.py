"""Readers: every format, messy whitespace, gzip/zip, string ids, one-line errors with line numbers."""
from __future__ import annotations

import gzip
import json
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bftrec.data.readers import READERS, DataFormatError, read

ALL = ["amazon_csv", "amazon_json", "csv", "lcrec_json", "ml_csv", "ml_dat", "ml_udata", "s3rec", "sasrec",
       "tsv"]


def write(path: Path, text: str, gz: bool = False) -> Path:
    data = text.encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def rows(df: pd.DataFrame) -> list[tuple]:
    ts = df["timestamp"]
    t = [None] * len(df) if ts.isna().all() else [int(x) for x in ts]
    return list(zip(df["user"].tolist(), df["item"].tolist(), t))


def one_line_error(excinfo, *parts: str) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg, msg
    for p in parts:
        assert p in msg, (p, msg)
    return msg


def test_registry_has_every_format():
    assert READERS.names() == ALL
    with pytest.raises(KeyError, match="known: amazon_csv"):
        read("nope", Path("x"))


@pytest.mark.parametrize("gz", [False, True])
def test_s3rec_messy(tmp_path, gz):
    text = "\n u1 a  b\tc   \n\n\nu2\tb c\t \r\nA-9 x.y@z\n"
    df = read("s3rec", write(tmp_path / "s.txt", text, gz))
    assert rows(df) == [("u1", "a", None), ("u1", "b", None), ("u1", "c", None),
                        ("u2", "b", None), ("u2", "c", None), ("A-9", "x.y@z", None)]
    assert list(df.columns) == ["user", "item", "timestamp"]
    assert str(df["timestamp"].dtype) == "Int64" and df["timestamp"].isna().all()


def test_s3rec_non_ascii_ids(tmp_path):
    df = read("s3rec", write(tmp_path / "s.txt", "ü1 é ß\n\nu2 ß é\n"))
    assert rows(df)[0] == ("ü1", "é", None) and len(df) == 4


@pytest.mark.parametrize("text,line,what", [
    ("1 2 3\n\n2\n3 4\n", 3, "1 fields"),
    ("1 2\n1 3\n", 2, "already had line 1"),  # SASRec lines are not S3-Rec lines
    ('{"1": [1, 2]}\n', 1, "unexpected character"),
    ("1,2,5.0,100\n", 1, "unexpected character"),
])
def test_s3rec_errors(tmp_path, text, line, what):
    with pytest.raises(DataFormatError) as e:
        read("s3rec", write(tmp_path / "bad.txt", text))
    one_line_error(e, f"bad.txt:{line}", what, "expected")


def test_sasrec(tmp_path):
    df = read("sasrec", write(tmp_path / "v.txt", "1 6393\n\n1\t13504  \nu2 i9\n"))
    assert rows(df) == [("1", "6393", None), ("1", "13504", None), ("u2", "i9", None)]
    with pytest.raises(DataFormatError) as e:
        read("sasrec", write(tmp_path / "bad.txt", "1 2\n\n1 2 3\n"))
    one_line_error(e, "bad.txt:3", "3 fields", "'1 2 3'")


@pytest.mark.parametrize("gz", [False, True])
def test_tsv_header_by_name(tmp_path, gz):
    text = "user_id\titem_id\ttimestamp\tposition\n1\t1\t1390694400\t0\n\n1\t2  1390694400\t1 \n"
    df = read("tsv", write(tmp_path / "t.tsv.gz", text, gz))
    assert rows(df) == [("1", "1", 1390694400), ("1", "2", 1390694400)]
    assert df["timestamp"].dtype == np.int64
    # a header with another column order (Amazon instruments derived TSV)
    text = "user_id\titem_id\trating\ttimestamp\nA2IB\t1384719342\t5.0\t1393545600\n"
    assert rows(read("tsv", write(tmp_path / "i.tsv", text))) == [("A2IB", "1384719342", 1393545600)]
    # RecBole atomic header
    text = "user_id:token\titem_id:token\trating:float\ttimestamp:float\n196\t242\t3\t881250949\n"
    assert rows(read("tsv", write(tmp_path / "r.inter", text))) == [("196", "242", 881250949)]


def test_tsv_no_header_and_no_time_column(tmp_path):
    assert rows(read("tsv", write(tmp_path / "a.tsv", "u1\ti1\t5\n u2 i2 7\n"))) == [
        ("u1", "i1", 5), ("u2", "i2", 7)]
    df = read("tsv", write(tmp_path / "b.tsv", "user\titem\nu1\ti1\n"))
    assert rows(df) == [("u1", "i1", None)]


@pytest.mark.parametrize("text,line,what", [
    ("user_id\titem_id\ttimestamp\n1\t2\t100\n1\t3\tnoon\n", 3, "timestamp is not an integer"),
    ("1\t2\t100\n\n1\t3\n", 3, "2 fields"),
    ("1\t2\t100\n1\t3\t1.5\n", 2, "timestamp is not an integer"),
    ("foo\tbar\tbaz\n1\t2\t3\n", 1, "neither a header"),
    ("user_id\titem_id\ttimestamp\n", None, "only a header"),
])
def test_tsv_errors(tmp_path, text, line, what):
    with pytest.raises(DataFormatError) as e:
        read("tsv", write(tmp_path / "bad.tsv", text))
    one_line_error(e, "bad.tsv" + (f":{line}" if line else ""), what)


def test_ml_udata(tmp_path):
    df = read("ml_udata", write(tmp_path / "u.data", "196\t242\t3\t881250949\n\n186 302\t3\t891717742 \n"))
    assert rows(df) == [("196", "242", 881250949), ("186", "302", 891717742)]
    with pytest.raises(DataFormatError) as e:
        read("ml_udata", write(tmp_path / "bad.data", "196\t242\t3\t881250949\n1\t2\t3\n"))
    one_line_error(e, "bad.data:2", "3 fields")
    with pytest.raises(DataFormatError) as e:
        read("ml_udata", write(tmp_path / "bad2.data", "1\t2\t3\t4\n5\t6\t7\tx8\n"))
    one_line_error(e, "bad2.data:2", "timestamp is not an integer")


@pytest.mark.parametrize("gz", [False, True])
def test_ml_dat(tmp_path, gz):
    text = "1::1193::5::978300760\n\n1 :: 661::3::978302109  \nu2::m9::4::5\n"
    df = read("ml_dat", write(tmp_path / "ratings.dat", text, gz))
    assert rows(df) == [("1", "1193", 978300760), ("1", "661", 978302109), ("u2", "m9", 5)]


@pytest.mark.parametrize("text,line,what", [
    ("1::2::5::9\n1::3::5\n", 2, "3 fields"),
    ("1::2::5::9\n1::::5::9\n", 2, "empty field"),
    ("1::2::5::9\n1::3::5::9::\n", 2, "empty field"),
    ("1::2::5::9\n1::3 4::5::9\n", 2, "whitespace inside a field"),
    ("1::2::5::9\n1::3::5::later\n", 2, "timestamp is not an integer"),
    ("1 2 3 4\n", 1, "whitespace inside a field"),
])
def test_ml_dat_errors(tmp_path, text, line, what):
    with pytest.raises(DataFormatError) as e:
        read("ml_dat", write(tmp_path / "bad.dat", text))
    one_line_error(e, f"bad.dat:{line}", what)


def test_ml_csv(tmp_path):
    text = "userId,movieId,rating,timestamp\n1,296,5.0,1147880044\n\n1, 306,3.5,1147868817\n"
    assert rows(read("ml_csv", write(tmp_path / "ratings.csv", text))) == [
        ("1", "296", 1147880044), ("1", "306", 1147868817)]
    with pytest.raises(DataFormatError) as e:
        read("ml_csv", write(tmp_path / "bad.csv", "user,item,rating,ts\n1,2,3,4\n"))
    one_line_error(e, "bad.csv:1", "wrong header")
    with pytest.raises(DataFormatError) as e:
        read("ml_csv", write(tmp_path / "bad2.csv", text + "2,5,4.0,noon\n"))
    one_line_error(e, "bad2.csv:5", "timestamp is not an integer")


REVIEWS = (
    "reviewerID,asin,reviewerName,helpful,reviewText,overall,summary,unixReviewTime,reviewTime\n"
    'A2IB,1384719342,"cassandra ""Yeah""","[0, 0]","line one\nline two, with comma",5.0,good,'
    '1393545600,"02 28, 2014"\n'
    'A14V,B00004Y2UT,Jake,"[13, 14]",fine,5.0,ok,1363392000,"03 16, 2013"\n'
)


def test_amazon_csv_reviews_in_zip(tmp_path):
    path = tmp_path / "reviews.csv.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("Musical_instruments_reviews.csv", REVIEWS)
    assert rows(read("amazon_csv", path)) == [("A2IB", "1384719342", 1393545600),
                                              ("A14V", "B00004Y2UT", 1363392000)]


@pytest.mark.parametrize("gz", [False, True])
def test_amazon_csv_ratings(tmp_path, gz):
    text = "A1,0000031852,5.0,1382745600\n\nA2 ,B00X,3.0,1400000000\n"
    assert rows(read("amazon_csv", write(tmp_path / "ratings.csv", text, gz))) == [
        ("A1", "0000031852", 1382745600), ("A2", "B00X", 1400000000)]


def test_amazon_csv_errors(tmp_path):
    # the review on lines 2-3 is fine; the next record (line 4) lacks its timestamp
    bad = REVIEWS.replace("1363392000", "")
    with pytest.raises(DataFormatError) as e:
        read("amazon_csv", write(tmp_path / "bad.csv", bad))
    one_line_error(e, "bad.csv:4", "missing field")
    with pytest.raises(DataFormatError) as e:
        read("amazon_csv", write(tmp_path / "bad2.csv", "A1,B1,5.0,1382745600\nA2,B2,5.0,12:00\n"))
    one_line_error(e, "bad2.csv:2", "timestamp is not an integer")
    with pytest.raises(DataFormatError) as e:
        read("amazon_csv", write(tmp_path / "bad3.csv", "A1,B1,5.0,1382745600\nA2,B2,5.0,1,2\n"))
    one_line_error(e, "bad3.csv:2")


@pytest.mark.parametrize("gz", [False, True])
def test_amazon_json(tmp_path, gz):
    recs = [{"reviewerID": "A2", "asin": "0000013714", "overall": 5.0, "unixReviewTime": 1203984000},
            {"reviewerID": "A3", "asin": "B1", "unixReviewTime": "1203984001", "reviewText": "a\nb"}]
    text = "\n".join(json.dumps(r) for r in recs[:1]) + "\n\n" + json.dumps(recs[1]) + "  \n"
    assert rows(read("amazon_json", write(tmp_path / "r.json.gz", text, gz))) == [
        ("A2", "0000013714", 1203984000), ("A3", "B1", 1203984001)]
    with pytest.raises(DataFormatError) as e:
        read("amazon_json", write(tmp_path / "bad.json", text + '{"reviewerID": "A4", "asin": "B"}\n'))
    one_line_error(e, "bad.json:4", "not a review record")
    with pytest.raises(DataFormatError) as e:
        read("amazon_json", write(tmp_path / "bad2.json", text + json.dumps(
            {"reviewerID": "A", "asin": "B", "unixReviewTime": 1.5}) + "\n"))
    one_line_error(e, "bad2.json:4", "timestamp is not an integer")


def test_lcrec_json(tmp_path):
    text = json.dumps({"0": [0, 1, 2], "1": [2, "x"]}, indent=4)
    assert rows(read("lcrec_json", write(tmp_path / "I.inter.json", text))) == [
        ("0", "0", None), ("0", "1", None), ("0", "2", None), ("1", "2", None), ("1", "x", None)]
    with pytest.raises(DataFormatError) as e:
        read("lcrec_json", write(tmp_path / "bad.json", '{\n "0": [1, 2],\n "1": [3,, 4]\n}'))
    one_line_error(e, "bad.json:3", "invalid JSON")
    with pytest.raises(DataFormatError) as e:
        read("lcrec_json", write(tmp_path / "bad2.json", '{\n "0": [1, 2],\n "1": 3\n}'))
    one_line_error(e, "bad2.json:3", "user '1' has no item list")


@pytest.mark.parametrize("fmt", ALL)
def test_wrong_format_is_an_error(tmp_path, fmt):
    # a MovieLens ratings.dat is not in any other format; ml_dat gets an S3-Rec file instead
    text = "1 2 3 4 5\n" if fmt == "ml_dat" else "1::1193::5::978300760\n1::661::3::978302109\n"
    with pytest.raises(DataFormatError) as e:
        read(fmt, write(tmp_path / "wrong.txt", text))
    one_line_error(e, "wrong.txt")


@pytest.mark.parametrize("fmt", ALL)
def test_empty_and_missing(tmp_path, fmt):
    with pytest.raises(DataFormatError) as e:
        read(fmt, write(tmp_path / "empty.txt", "\n\n  \n"))
    one_line_error(e, "empty.txt")
    with pytest.raises(FileNotFoundError) as e:
        read(fmt, tmp_path / "nope" / "x.txt")
    one_line_error(e, str((tmp_path / "nope" / "x.txt").resolve()), "BFTREC_DATA_ROOT", "data_root")


def test_long_offending_text_is_truncated(tmp_path):
    with pytest.raises(DataFormatError) as e:
        read("sasrec", write(tmp_path / "bad.txt", "1 2\n" + " ".join(["9"] * 500) + "\n"))
    assert len(str(e.value)) < 300


def test_headerless_tsv_with_four_columns_is_ambiguous(tmp_path):
    """u.data-like rows (user item rating time) must not be read with the rating as the time."""
    f = tmp_path / "x.tsv"
    f.write_text("u1\ti1\t5\t100\nu1\ti2\t4\t200\n")
    with pytest.raises(DataFormatError, match="which one is the timestamp"):
        read("tsv", f)


def test_lcrec_json_duplicate_user_is_an_error(tmp_path):
    f = tmp_path / "x.json"
    f.write_text('{"u1": [1, 2, 3], "u2": [4, 5, 6], "u1": [7, 8, 9]}')
    with pytest.raises(DataFormatError, match="appears twice"):
        read("lcrec_json", f)


# --------------------------------------------------------------------------- header rows (issue 9.8)


@pytest.mark.parametrize("fmt,text,line", [
    ("s3rec", "user_id item_id_list\n1 2 3 4\n2 3 4 5\n", 1),
    ("s3rec", "\n\nuid items\n1 2 3 4\n2 3 4 5\n", 3),  # named by the line it is on
    ("s3rec", "reviewer products\n1 2 3 4\n2 3 4 5\n", 1),  # unknown names: ids below are integers
    ("sasrec", "user_id item_id\n1 2\n1 3\n", 1),
    ("sasrec", "UserID:token ItemID:token\nu1 i1\n", 1),
    ("ml_udata", "user_id\titem_id\trating\ttimestamp\n196\t242\t3\t881250949\n", 1),
    ("ml_dat", "UserID::MovieID::Rating::Timestamp\n1::1193::5::978300760\n", 1),
    ("amazon_csv", "user,item,rating,timestamp\nA1,B1,5.0,1382745600\n", 1),
    ("amazon_csv", '"reviewer","product","stars","time"\nA1,B1,5.0,1382745600\n', 1),
])
def test_header_row_is_refused(tmp_path, fmt, text, line):
    """A header in a format without one is refused, naming its line, instead of read as data."""
    with pytest.raises(DataFormatError) as e:
        read(fmt, write(tmp_path / "h.txt", text))
    one_line_error(e, f"h.txt:{line}:", "header row", f"delete line {line}")


@pytest.mark.parametrize("fmt,text", [
    ("s3rec", "u1 a b c\nu2 b c\n"),  # string ids everywhere: line 1 is data
    ("s3rec", "7 user_id x\n8 x y\n"),  # a column name as an item id, not first: data
    ("sasrec", "a b\nc d\n"),
    ("amazon_csv", "A1,0000031852,5.0,1382745600\nA2,B00X,3.0,1400000000\n"),
])
def test_first_line_of_data_is_not_a_header(tmp_path, fmt, text):
    df = read(fmt, write(tmp_path / "d.txt", text))
    assert len(df) == sum(len(ln.replace(",", " ").split()) - 1 if fmt == "s3rec" else 1
                          for ln in text.splitlines())


def test_amazon_csv_quoted_row_on_line_1_is_data(tmp_path):
    """A valid RFC-4180 row with a quoted comma is data on line 1 as on any other line."""
    row = '"A1, jr",B1,5.0,1382745600\n'
    other = "A2,B2,3.0,1400000000\n"
    for text in (row + other, other * 4 + row):
        df = read("amazon_csv", write(tmp_path / "q.csv", text))
        assert ("A1, jr", "B1", 1382745600) in rows(df) and len(df) == text.count("\n")


def test_amazon_csv_reviews_header_by_field_name(tmp_path):
    """The reviews header is recognised by its parsed field names, quoted or not."""
    quoted = '"reviewerID","asin","unixReviewTime"\nA1,B1,1393545600\n'
    assert rows(read("amazon_csv", write(tmp_path / "r.csv", quoted))) == [("A1", "B1", 1393545600)]


def test_ml_csv_quoted_header_and_missing_header(tmp_path):
    text = '"userId","movieId","rating","timestamp"\n1,296,5.0,1147880044\n'
    assert rows(read("ml_csv", write(tmp_path / "ratings.csv", text))) == [("1", "296", 1147880044)]
    with pytest.raises(DataFormatError) as e:
        read("ml_csv", write(tmp_path / "bad.csv", "1,296,5.0,1147880044\n1,306,3.5,1147868817\n"))
    one_line_error(e, "bad.csv:1", "no header row")


def test_tsv_data_row_with_bad_time_is_not_taken_for_a_header(tmp_path):
    with pytest.raises(DataFormatError) as e:
        read("tsv", write(tmp_path / "bad.tsv", "1\t2\t100.5\n1\t3\t200\n"))
    one_line_error(e, "bad.tsv:1", "timestamp is not an integer")


# --------------------------------------------------------------------------- timestamp units (9.9)

SEC = [1390694400, 1390780800, 1390867200]


def timed(fmt: str, ts: list[int]) -> str:
    """A file of format ``fmt`` with user ``u1``, items ``i0, i1, …`` at times ``ts``."""
    if fmt == "amazon_json":
        return "".join(json.dumps({"reviewerID": "u1", "asin": f"i{k}", "unixReviewTime": t}) + "\n"
                       for k, t in enumerate(ts))
    line = {"tsv": "u1\ti{k}\t{t}", "ml_udata": "u1\ti{k}\t5\t{t}", "ml_dat": "u1::i{k}::5::{t}",
            "amazon_csv": "u1,i{k},5.0,{t}", "ml_csv": "u1,i{k},5.0,{t}"}[fmt]
    head = "userId,movieId,rating,timestamp\n" if fmt == "ml_csv" else ""
    return head + "".join(line.format(k=k, t=t) + "\n" for k, t in enumerate(ts))


TIMED = ["amazon_csv", "amazon_json", "ml_csv", "ml_dat", "ml_udata", "tsv"]


@pytest.mark.parametrize("fmt", TIMED)
@pytest.mark.parametrize("scale,unit", [(1000, "milliseconds"), (10**6, "microseconds"),
                                        (10**9, "nanoseconds")])
def test_sub_second_timestamps_become_seconds(tmp_path, caplog, fmt, scale, unit):
    ts = [t * scale + 999 for t in SEC] if scale > 1000 else [t * scale + 123 for t in SEC]
    with caplog.at_level("INFO", logger="bftrec.data.readers"):
        df = read(fmt, write(tmp_path / "ms.txt", timed(fmt, ts)))
    assert df["timestamp"].dtype == np.int64 and df["timestamp"].tolist() == SEC
    assert any("ms.txt" in r.getMessage() and unit in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("fmt", TIMED)
def test_seconds_are_kept(tmp_path, caplog, fmt):
    ts = [5, 978300760, 10**11 - 1]  # small values and the top of the seconds range are seconds
    with caplog.at_level("INFO", logger="bftrec.data.readers"):
        assert read(fmt, write(tmp_path / "s.txt", timed(fmt, ts)))["timestamp"].tolist() == ts
    assert not any("seconds" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("fmt", TIMED)
def test_mixed_units_are_refused(tmp_path, fmt):
    text = timed(fmt, [SEC[0], SEC[1] * 1000, SEC[2]])
    with pytest.raises(DataFormatError) as e:
        read(fmt, write(tmp_path / "mix.txt", text))
    first = 2 if fmt == "ml_csv" else 1  # the header is line 1
    one_line_error(e, "mix.txt", f"line {first} ", "(seconds)", f"line {first + 1} ",
                   "(milliseconds)", "Unix seconds")


def test_ms_to_seconds_that_would_reorder_events_is_refused(tmp_path):
    # true order i1 (1.2 s), i0 (1.7 s); in seconds both are 1, and the tie would keep file order
    text = f"u1\ti0\t{SEC[0] * 1000 + 700}\nu1\ti1\t{SEC[0] * 1000 + 200}\nu2\ti0\t{SEC[1] * 1000}\n"
    with pytest.raises(DataFormatError) as e:
        read("tsv", write(tmp_path / "ms.tsv", text))
    one_line_error(e, "ms.tsv", "lines 1 and 2", "same second", "sort")


# --- format: csv, a header with named columns (issue 47) ----------------------------------------------------

def _csv_cfg(tmp_path, text: str, **kw):
    from bftrec.data.config import DatasetConfig

    (tmp_path / "mine.csv").write_text(text)
    return DatasetConfig(name="mine", format="csv", path="mine.csv", kcore=0, **kw)


def test_csv_with_a_header_maps_named_columns(tmp_path):
    from bftrec.data.datasets import load_dataset

    rows = "".join(f"u{u},extra,i{(u + t) % 7},{1000 + t}\n" for u in range(5) for t in range(4))
    cfg = _csv_cfg(tmp_path, "who,note,what,when\n" + rows,
                   columns={"user": "who", "item": "what", "timestamp": "when"})
    data = load_dataset(cfg, data_root=str(tmp_path), cache_dir=str(tmp_path / "cache"))
    assert data.n_users == 5 and len(data.items) == 20 and data.timestamps is not None
    nots = _csv_cfg(tmp_path, "who;what\n" + "".join(f"u{u};i{t}\n" for u in range(3) for t in range(3)),
                    columns={"user": "who", "item": "what", "timestamp": None}, delimiter=";")
    assert load_dataset(nots, data_root=str(tmp_path), use_cache=False).timestamps is None


@pytest.mark.parametrize("text, kw, message", [
    ("user_id,item,timestamp\nu,i,1\n", {},
     r"mine.csv:1: the header lacks 'item_id' \(it has user_id, item, timestamp\)"),
    ("user_id;item_id;timestamp\nu;i;1\n", {},
     r"mine.csv:1: the header reads as one field .* set dataset.delimiter=';'"),
    ('user_id,item_id,timestamp\nu,"i,1\nv,j,2\n', {}, r"mine.csv.*close the quote"),
])
def test_a_malformed_csv_fails_in_one_line_naming_file_line_and_fix(tmp_path, text, kw, message):
    from bftrec.data.datasets import load_dataset

    with pytest.raises(ValueError, match=message) as e:
        load_dataset(_csv_cfg(tmp_path, text, **kw), data_root=str(tmp_path), use_cache=False)
    assert "\n" not in str(e.value)


def test_messages_say_what_is_wrong(tmp_path):
    """issue 50 item 5: a space inside a tab-separated id, a Latin-1 file, a folder given as the data file."""
    from bftrec.data.datasets import verify_checksum

    (tmp_path / "space.tsv").write_text("u1\ti1\t100\nuser two\ti2\t200\n")
    with pytest.raises(ValueError, match=r"space.tsv:2: the tab-separated field 'user two' holds a space") as e:
        read("tsv", tmp_path / "space.tsv")
    assert "timestamp is not an integer" not in str(e.value)
    (tmp_path / "latin.tsv").write_bytes("u1\ti1\t100\nu\xe9\ti2\t200\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin.tsv:2: not UTF-8 text .*re-encode the file as UTF-8"):
        read("tsv", tmp_path / "latin.tsv")
    (tmp_path / "folder").mkdir()
    with pytest.raises(ValueError, match="is a folder, not a data file"):
        verify_checksum(tmp_path / "folder", None)
    with pytest.raises(ValueError, match="is a folder, not a data file"):
        read("tsv", tmp_path / "folder")
