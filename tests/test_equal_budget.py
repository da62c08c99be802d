"""The equal-budget comparison's rerun configs (configs/experiment/equal_budget/) hold exactly the values of the
committed studies' best.yaml (results/equal_budget/office_sasrec/study/): a hand copy that drifted would compare
other configs than the ones the tuning chose."""
from pathlib import Path

import pytest
import yaml

from bftrec.grid import _flat
from bftrec.report.runs import default_config

STUDY = Path(__file__).resolve().parent.parent / "results" / "equal_budget" / "office_sasrec" / "study"


@pytest.mark.parametrize("layer", ["standard", "bft"])
def test_rerun_config_is_the_studys_best(layer):
    best = yaml.safe_load((STUDY / f"office_sasrec_{layer}" / "best.yaml").read_text())
    best.pop("tuned_config")
    chosen = _flat(best)
    assert chosen and set(chosen) >= {"trainer.lr", "model.dropout"}
    composed = default_config("office", "sasrec", layer, f"equal_budget/office_sasrec_{layer}")
    assert composed["layer.name"] == layer
    assert {k: composed[k] for k in chosen} == chosen
