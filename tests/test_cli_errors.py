"""Config mistakes through the real console entry (``python -m bftrec.train``): one line on stderr, exit 2,
naming the key or the valid names (issue 9.5).

Every case is an independent process; they are started together once per module to keep the suite fast.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from bftrec.config import CONFIG_DIR

CASES = {  # name: overrides of `bftrec-train debug=smoke`
    "typo": ["trainer.epoch=3"],
    "typo_appended": ["+trainer.epoch=3"],
    "dataset": ["dataset=sportz"],
    "layer": ["layer=bfft"],
    "lr": ["trainer.lr=abc"],
    "ks": ["eval.ks=[0]"],
    "bft_key_on_standard": ["layer.bft.q_init_ratio=0.2"],
    "bft_key_on_resume": ["trainer.resume=runs/a", "layer.bft.q_init_ratio=0.2"],  # composes layer=standard
    "resume_typo": ["trainer.resume=runs/a", "dataset.min_user_interactions=3", "dataset.kcor=5"],
    "layer_typo": ["layer.nmae=x"],  # a typo on layer=standard keeps the did-you-mean hint
    "copied_dataset": ["dataset=mysynth"],  # a copy of synthetic.yaml that kept name: synthetic
    "renamed_dataset": ["dataset.name=synth_big"],
    "model_variant": ["model=sasrec_small", "trainer.epochs=1"],  # a copy of sasrec.yaml keeps name: sasrec
    "seed_negative": ["seed=-1"],  # issue 50: numpy's message, after the run directory existed
    "seed_string": ["seed='07'"],  # issue 50: a seed07_ folder for a run that used 7
}
FLAGS = {k: ["--config-dir", "userconf"] for k in ("copied_dataset", "model_variant")}  # flags go first
CELL = ["dataset=synthetic", "model=sasrec", "layer=standard", "seed=0"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Run every case and one grid whose only cell holds a run of another config; returns name -> process."""
    tmp = tmp_path_factory.mktemp("cli")
    for group, src, dst in (("dataset", "synthetic", "mysynth"), ("model", "sasrec", "sasrec_small")):
        (tmp / "userconf" / group).mkdir(parents=True)
        (tmp / "userconf" / group / f"{dst}.yaml").write_text((Path(CONFIG_DIR) / group / f"{src}.yaml").read_text())
    grid = ["-m", "experiment=paper/cpu", "debug=smoke", *CELL, "hydra.launcher.n_jobs=1", "trainer.lr=0.01"]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):  # the cell as another config left it
        other = compose("train", overrides=["experiment=paper/cpu", "debug=smoke", *CELL, f"out_root={tmp}"])
    cell = tmp / "runs" / "synthetic" / "sasrec" / "standard" / "seed0"
    cell.mkdir(parents=True)
    OmegaConf.save(other, cell / "config.yaml", resolve=True)
    (cell / "metrics.json").write_text("{}")
    procs = {name: subprocess.Popen([sys.executable, "-m", "bftrec.train", *args], cwd=tmp, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for name, args in {**{k: [*FLAGS.get(k, []), "debug=smoke", f"out_root={tmp / k}", *v]
                                   for k, v in CASES.items()},
                                "grid": [*grid, f"out_root={tmp}"]}.items()}
    out = {}
    for name, p in procs.items():
        stdout, stderr = p.communicate(timeout=300)
        out[name] = subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)
    out["tmp"] = tmp
    return out


@pytest.mark.parametrize("name, expected", [
    ("typo", "unknown key 'trainer.epoch'; did you mean trainer.epochs? known keys in trainer: epochs, batch_size"),
    ("typo_appended", "unknown key 'trainer.epoch'; did you mean trainer.epochs?"),
    ("dataset", "dataset=sportz: no such config; choose one of beauty, games, "),
    ("layer", "layer=bfft: no such config; choose one of bft, bft_h, standard"),
    ("lr", "bad value for trainer.lr: Value 'abc' of type 'str' could not be converted to Float; "
           "expected float, e.g. trainer.lr=0.001"),
    ("ks", "eval.ks=[0] is not valid: every cut-off K must be an integer >= 1"),
    ("bft_key_on_standard", "unknown key 'layer.bft': layer=standard has no BFT settings; select layer=bft"),
    ("bft_key_on_resume", "trainer.resume=runs/a keeps the run's dataset, model, layer and seed settings; "
                          "drop the override 'layer.bft.q_init_ratio=0.2'"),
    ("resume_typo", "trainer.resume=runs/a keeps the run's dataset, model, layer and seed settings; "
                    "drop the override 'dataset.kcor=5'"),
    ("layer_typo", "unknown key 'layer.nmae'; did you mean layer.name?"),
    ("copied_dataset", "dataset=mysynth: its file says name: synthetic; set name: mysynth in dataset/mysynth.yaml"),
    ("renamed_dataset", "dataset.name=synth_big renames dataset=synthetic; drop it, or add dataset/synth_big.yaml"),
    ("seed_negative", "seed=-1 is not a plain integer in [0, 4294967295]; e.g. seed=0"),
    ("seed_string", "seed='07' is not a plain integer in [0, 4294967295]; write seed=7"),
])
def test_config_mistake_is_one_line(results, name, expected):
    r = results[name]
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.startswith(f"bftrec-train: error: {expected}") and r.stderr.count("\n") == 1, r.stderr
    assert "To append" not in r.stderr and "trainer.select_metric" not in r.stderr  # no wrong hint or key


@pytest.mark.parametrize("name", ["seed_negative", "seed_string"])
def test_a_bad_seed_is_refused_before_anything_is_written(results, name):
    assert not (results["tmp"] / name).exists()


def test_refused_dataset_copy_leaves_failed_not_a_bare_folder(results):
    runs = list((results["tmp"] / "copied_dataset").glob("*/*/*/*/"))
    assert len(runs) == 1 and (runs[0] / "FAILED").exists() and not (runs[0] / "metrics.json").exists(), runs


def test_a_renamed_model_copy_still_runs(results):
    """Model and layer names are registry keys: a variant file keeps the built-in name, and that is fine."""
    r = results["model_variant"]
    assert r.returncode == 0, r.stderr[-2000:]


def test_refused_grid_cell_is_its_line_alone(results):
    """The other config's cell is refused in one logged line, the ledger records it, no traceback follows."""
    r = results["grid"]
    assert r.returncode == 2, r.stderr[-2000:]
    output = r.stdout + r.stderr
    assert "Traceback" not in output and "CellFailed" not in output, output
    refusals = [ln for ln in output.splitlines() if "holds a run of another config" in ln]
    assert len(refusals) == 1 and "differs at trainer.lr" in refusals[0], output
    ledger = [json.loads(x) for x in (results["tmp"] / "runs" / "ledger.jsonl").read_text().splitlines()]
    assert [(x["cell"], x["status"]) for x in ledger] == [("synthetic/sasrec/standard/seed0", "failed")]
    assert "differs at trainer.lr" in ledger[0]["error"]


@pytest.mark.parametrize("override, hint", [
    ("betas=0.9", "; expected list, e.g. trainer.betas=[0.9,0.999]"),
    ("epochs=1.5", "; expected int, e.g. trainer.epochs=200"),
    ("train_window_stride=abc", "; expected Optional[int], e.g. trainer.train_window_stride=null"),  # Hydra's None
    ("progress=maybe", "; expected bool, e.g. trainer.progress=true"),
])
def test_a_bad_value_names_the_expected_type_and_an_example(override, hint):
    """The one-line error for an ill-typed value ends with the field's type and its default as the fix."""
    from bftrec.config import ConfigError, TrainerConfig, merge_schema

    with pytest.raises(ConfigError) as e:
        merge_schema(TrainerConfig, OmegaConf.from_dotlist([override]), "trainer")
    msg = str(e.value)
    assert msg.startswith(f"bad value for trainer.{override.split('=')[0]}: ") and msg.endswith(hint), msg
    assert "\n" not in msg and ".;" not in msg, msg
