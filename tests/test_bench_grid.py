"""scripts/bench_grid.py: the finished-grid summary reads the ledger and history files correctly."""
import json

import pytest

from tests.scripts import load_script


def _bench():
    return load_script("bench_grid")


def test_finished_grid_cost_from_ledger(tmp_path):
    rows = [("d/m/standard/seed0", "ran", "2026-01-01T00:00:00", 60.0, 3),
            ("d/m/bft/seed0", "resumed", "2026-01-01T00:00:30", 90.0, 5),
            ("d/m/bft/seed1", "skipped", "2026-01-01T00:05:00", 0.1, 0)]
    lines = []
    for cell, status, start, wall, epochs in rows:
        lines.append(json.dumps({"cell": cell, "status": status, "started": start, "wall_s": wall,
                                 "device": "cpu x2", "host": "h"}))
        if epochs:
            (tmp_path / cell).mkdir(parents=True)
            hist = "epoch,train_seconds,eval_seconds\n" + "".join(f"{e},1.0,0.1\n" for e in range(epochs))
            (tmp_path / cell / "history.csv").write_text(hist)
    (tmp_path / "ledger.jsonl").write_text("\n".join(lines) + "\n")
    out = _bench().finished(tmp_path)
    cpu = out["cpu x2"]
    assert cpu["cells_run"] == 2 and cpu["epochs"] == 8 and cpu["sum_run_s"] == 150.0
    assert cpu["wall_s"] == 120.0  # first start 00:00:00, last end 00:00:30 + 90 s
    assert out["_statuses"] == {"ran": 1, "resumed": 1, "skipped": 1}


def test_grid_by_name_or_path_and_unknown_grid_lists_the_grids():
    bench = _bench()
    name, axes = bench.grid_axes("configs/experiment/paper/cpu.yaml")
    assert name == "cpu" and axes["seed"] == ["0", "1", "2"] and bench.grid_axes("main")[0] == "main"
    with pytest.raises(SystemExit, match="no grid .nosuch.; choose one of .*cpu, main, main_units"):
        bench.grid_axes("nosuch")
