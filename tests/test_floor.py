"""bftrec.report.floor: every model's standard layer side by side by stratum, against hand-computed means."""
import pandas as pd

from bftrec.report.floor import floor_models, floor_note, floor_table


def _run(hr, ndcg=None, q_hi=4, params=100, seed=0):
    """A run dict as ``runs.load_runs`` gives it: overall, two item-frequency bins, cold and warm users."""
    ndcg = hr / 2 if ndcg is None else ndcg
    def block(scale, **kw):
        return {"HR@10": hr * scale, "NDCG@10": ndcg * scale, "n_users": 10, **kw}
    return {"seed": seed, "n_parameters": params, "test": {
        "overall": block(1.0),
        "by_item_freq": [block(0.5, bin="Q0", lo=0, hi=q_hi), block(2.0, bin="Q1", lo=q_hi + 1, hi=99)],
        "cold_users": block(1.5, max_history=4), "warm_users": block(0.25)}}


def test_each_model_is_its_standard_seed_mean_counted_models_first():
    groups = {
        ("toys", "sasrec", "", "standard"): [_run(0.10, seed=0), _run(0.20, seed=1)],  # mean 0.15
        ("toys", "sasrec", "", "bft"): [_run(0.90)],  # not the floor: another layer
        ("toys", "markov", "", "standard"): [_run(0.12, params=0)],
        ("toys", "gru4rec", "", "standard"): [_run(0.16, q_hi=5)],  # its own bins: named
    }
    assert floor_models(groups) == ["markov", "gru4rec", "sasrec"]
    df = floor_table(groups)
    assert list(df["stratum"]) == ["overall", "Q0", "Q1", "cold", "warm"]
    assert [c for c in df.columns if c.startswith("HR@10 ")] == ["HR@10 markov", "HR@10 gru4rec", "HR@10 sasrec"]
    overall = df.iloc[0]
    assert (overall["HR@10 markov"], overall["HR@10 sasrec"], overall["NDCG@10 sasrec"]) == (
        "0.1200", "0.1500", "0.0750")
    assert overall["best HR@10"] == "gru4rec"  # 0.16
    q0 = df[df["stratum"] == "Q0"].iloc[0]
    assert q0["range"] == "0-4" and q0["HR@10 gru4rec"] == "0.0800 (bin 0-5)"
    cold = df[df["stratum"] == "cold"].iloc[0]
    assert cold["HR@10 sasrec"] == "0.2250" and cold["best HR@10"] == "gru4rec"
    assert "seeds: markov 1, gru4rec 1, sasrec 2" in floor_note(groups)


def test_a_model_missing_on_a_dataset_and_a_stratum_without_hits():
    groups = {("a", "pop", "", "standard"): [_run(0.0, params=0)], ("a", "sasrec", "", "standard"): [_run(0.0)],
              ("b", "sasrec", "", "standard"): [_run(0.3)]}
    df = floor_table(groups).set_index(["dataset", "stratum"])
    assert df.loc[("a", "overall"), "best HR@10"] == "–"  # no model has a hit: no best
    assert df.loc[("b", "overall"), "HR@10 pop"] == "–" and df.loc[("b", "overall"), "best HR@10"] == "sasrec"


def test_one_model_gives_no_table():
    assert floor_table({("a", "sasrec", "", "standard"): [_run(0.1)], ("a", "sasrec", "", "bft"): [_run(0.2)]}).empty
    assert isinstance(floor_table({}), pd.DataFrame)


def test_best_is_by_hr_as_printed_and_names_ties():
    groups = {("d", "pop", "", "standard"): [_run(0.2, ndcg=0.01, params=0)],
              ("d", "sasrec", "", "standard"): [_run(v, ndcg=0.3, seed=s)
                                                for s, v in enumerate((0.1, 0.2, 0.30000001))]}
    overall = floor_table(groups).iloc[0]
    assert overall["HR@10 sasrec"] == "0.2000"  # the mean over all three seeds
    assert overall["best HR@10"] == "pop, sasrec"  # equal as printed, although NDCG@10 favours sasrec


def test_strata_are_the_union_and_other_users_are_named_and_not_ranked():
    extra = _run(0.5)  # one more bin, and Q0 on other users
    extra["test"]["by_item_freq"].append({"bin": "Q2", "lo": 100, "hi": 200, "n_users": 3, "HR@10": 0.9,
                                          "NDCG@10": 0.4})
    extra["test"]["by_item_freq"][0]["n_users"] = 999
    groups = {("d", "markov", "", "standard"): [_run(0.1, params=0)], ("d", "gru4rec", "", "standard"): [extra]}
    df = floor_table(groups).set_index("stratum")
    assert list(df.index) == ["overall", "Q0", "Q1", "Q2", "cold", "warm"]
    assert df.loc["Q2", "HR@10 markov"] == "–" and df.loc["Q2", "best HR@10"] == "gru4rec"
    assert df.loc["Q0", "HR@10 gru4rec"] == "0.2500 (999 users)"
    assert df.loc["Q0", "best HR@10"] == "markov"  # 0.25 on other users is not ranked against 0.05


def test_a_tagged_row_takes_the_untagged_counted_floor_and_the_note_gives_seed_ranges():
    groups = {("d", "markov", "", "standard"): [_run(0.1, params=0)],
              ("d", "sasrec", "long", "standard"): [_run(0.2, seed=0), _run(0.2, seed=1)],
              ("e", "sasrec", "", "standard"): [_run(0.2)]}
    df = floor_table(groups).set_index(["dataset", "tag", "stratum"])
    assert df.loc[("d", "long", "overall"), "HR@10 markov"] == "0.1000"
    assert df.loc[("d", "long", "overall"), "HR@10 sasrec"] == "0.2000"
    assert "seeds: markov 1, sasrec 1–2" in floor_note(groups)


def test_no_counted_model_no_floor_and_the_row_takes_the_users_most_models_share():
    assert floor_table({("d", "sasrec", "", "standard"): [_run(0.1)],
                        ("d", "hstu", "", "standard"): [_run(0.2)]}).empty  # Transformers alone: no floor
    odd = _run(0.05, params=0, q_hi=9)  # the counted model binned otherwise: the two trained ones set the row
    df = floor_table({("d", "markov", "", "standard"): [odd], ("d", "sasrec", "", "standard"): [_run(0.1)],
                      ("d", "hstu", "", "standard"): [_run(0.2)]}).set_index("stratum")
    assert df.loc["Q0", "range"] == "0-4" and df.loc["Q0", "HR@10 markov"] == "0.0250 (bin 0-9)"
    assert df.loc["Q0", "best HR@10"] == "hstu"
