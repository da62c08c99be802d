# Two commands do all the set-up on a fresh machine (README):
#   make run    set up .venv and train SASRec on the embedded synthetic dataset
#   make test   set up .venv and run the test suite
# On a machine without a GPU, `pip install torch==<pin>` takes the small CPU build where one is
# available locally; with a GPU and internet the same pin installs the CUDA build from PyPI.
PY ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
ifneq ($(wildcard ../shared/data),)
export BFTREC_DATA_ROOT ?= $(abspath ../shared/data)
endif

.PHONY: setup run test lint bench paper clean
GRID ?= cpu
$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)" || $(BIN)/pip install -q "torch>=2.1"
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

setup: $(BIN)/.installed

run: setup
	$(BIN)/bftrec-train $(ARGS)

test: setup
	@$(BIN)/pytest -q $(ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests (exit 5): a broken suite, never a pass" >&2; fi; exit $$rc

# Reproduce the paper: the grid configs/experiment/paper/$(GRID).yaml (cpu: 108 runs on 2 cores;
# main: the 108-run paper grid, for a GPU, with its unit ablation and the floor), then its tables and figures
# under $(OUT)/.
# Rerunning skips finished cells and resumes killed ones; ARGS picks a slice (ARGS="dataset=office"),
# whose tables are then marked PARTIAL (--allow-partial; the figures log it) until the grid is done.
# Trial runs with other settings (ARGS="trainer.epochs=2") belong in another folder: OUT=/tmp/trial.
# GRID=main also runs its unit ablation, configs/experiment/paper/main_units.yaml (layer=bft_h on Sports), and
# the floor, configs/experiment/paper/baselines.yaml (pop, markov) and baselines_gru4rec.yaml (GRU4Rec), into the
# same folder, when no ARGS slice is given; GRID=main_units runs the ablation alone. The tables of either take all four grids' cells
# (those of GRID=main_units are PARTIAL until the main grid is done).
OUT_main_units := results/paper_main
EXTRA_GRIDS_main := main_units baselines baselines_gru4rec
TABLE_GRIDS_main := main main_units baselines baselines_gru4rec
TABLE_GRIDS_main_units := main main_units baselines baselines_gru4rec
OUT ?= $(or $(OUT_$(GRID)),results/paper_$(GRID))
PAPER_CHECK = $(foreach g,$(or $(TABLE_GRIDS_$(GRID)),$(GRID)),--grid configs/experiment/paper/$(g).yaml) \
	$(if $(or $(ARGS),$(filter main_units,$(GRID))),--allow-partial)
paper: setup
	$(BIN)/bftrec-train -m experiment=paper/$(GRID) out_root=$(OUT) $(ARGS)
	$(if $(ARGS),,$(foreach g,$(EXTRA_GRIDS_$(GRID)),$(BIN)/bftrec-train -m experiment=paper/$(g) out_root=$(OUT);))
	$(BIN)/bftrec-report tables --runs $(OUT)/runs $(PAPER_CHECK) --out $(OUT)/tables
	$(BIN)/bftrec-report figures --runs $(OUT)/runs $(PAPER_CHECK) --out $(OUT)/figures

lint: setup
	$(BIN)/ruff check bftrec tests scripts results

clean:
	rm -rf $(VENV) .pytest_cache
