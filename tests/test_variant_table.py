"""bftrec-report variants (bftrec.report.variants): tagged variants against a baseline tag, chosen by validation
NDCG@10."""
import json

import pytest

from bftrec.experiment import run
from bftrec.report import variants
from tests.test_train_e2e import smoke_cfg


@pytest.fixture(scope="module")
def tagged(tmp_path_factory):
    root = tmp_path_factory.mktemp("variants")
    for tag, lr in (("lossA", 0.001), ("lossB", 0.01)):
        for seed in (0, 1):
            run(smoke_cfg(root, f"tag={tag}", f"trainer.lr={lr}", f"seed={seed}"), root / "runs" / tag / f"seed{seed}")
    return root


def test_rows_baseline_first_best_marked_and_p(tagged):
    mvt = variants
    mvt.main(["--runs", str(tagged / "runs"), "--baseline", "lossA", "--out", str(tagged / "t")])
    df = __import__("pandas").read_csv(tagged / "t" / "variants.csv", keep_default_na=False)
    assert list(df["tag"]) == ["lossA", "lossB"] and list(df["seeds"]) == ["0,1", "0,1"]
    valid = {t: [json.loads((tagged / "runs" / t / f"seed{s}" / "metrics.json").read_text())["valid"]["NDCG@10"]
                 for s in (0, 1)] for t in ("lossA", "lossB")}
    best = max(valid, key=lambda t: sum(valid[t]))
    chosen = df.set_index("tag")["chosen"]
    assert chosen[best].startswith("best valid NDCG@10") and chosen[({"lossA", "lossB"} - {best}).pop()] == ""
    rel = sum(valid["lossB"]) / sum(valid["lossA"]) - 1
    assert df.set_index("tag").loc["lossB", "valid vs baseline"] == f"{rel:+.1%}"
    assert df.set_index("tag").loc["lossA", "p NDCG@10"] == ""  # no test of the baseline against itself


def test_duplicate_seed_refused_and_group_without_baseline_kept(tagged, tmp_path):
    import shutil

    mvt = variants
    root = tmp_path / "runs"
    shutil.copytree(tagged / "runs", root)
    shutil.copytree(root / "lossB" / "seed0", root / "lossB" / "seed0_again")
    with pytest.raises(SystemExit, match="two runs of .*lossB seed 0"):
        mvt.main(["--runs", str(root), "--baseline", "lossA", "--out", str(tmp_path / "t")])
    shutil.rmtree(root / "lossB" / "seed0_again")
    other = root / "other" / "seed0"  # another dataset whose baseline has not run yet
    shutil.copytree(root / "lossB" / "seed0", other)
    m = json.loads((other / "metrics.json").read_text())
    m["dataset"] = "elsewhere"
    (other / "metrics.json").write_text(json.dumps(m))
    mvt.main(["--runs", str(root), "--baseline", "lossA", "--out", str(tmp_path / "t")])
    df = __import__("pandas").read_csv(tmp_path / "t" / "variants.csv", keep_default_na=False)
    row = df[df["dataset"] == "elsewhere"].iloc[0]
    assert row["valid vs baseline"] == "–" and row["p NDCG@10"] == ""


def test_unknown_baseline_is_refused_naming_the_tags(tagged):
    mvt = variants
    with pytest.raises(SystemExit, match="no runs tagged 'lossC' .*lossA, lossB"):
        mvt.main(["--runs", str(tagged / "runs"), "--baseline", "lossC", "--out", str(tagged / "t2")])
