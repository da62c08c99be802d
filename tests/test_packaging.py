"""The wheel ships every Hydra config as package data (``bftrec/configs``), so an installed bftrec-train
finds them as ``pkg://bftrec.configs`` without the checkout (issue 9.4)."""
import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_wheel_holds_every_config_and_module(tmp_path):
    # Build from a copy: an in-tree build would write build/ and *.egg-info into the checkout.
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("bftrec", "configs"):
        shutil.copytree(REPO / name, src / name, symlinks=True, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", *isolation, "-w", str(tmp_path), str(src)],
                   check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("bftrec-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())

    yamls = {f"bftrec/configs/{p.relative_to(REPO / 'configs').as_posix()}" for p in (REPO / "configs").rglob("*.yaml")}
    assert len(yamls) > 40 and "bftrec/configs/train.yaml" in yamls
    assert yamls <= names, sorted(yamls - names)
    assert "bftrec/configs/__init__.py" in names  # Hydra's pkg:// source needs it
    modules = {p.relative_to(REPO).as_posix() for p in (REPO / "bftrec").rglob("*.py") if "configs" not in p.parts}
    assert modules <= names, sorted(modules - names)
    assert not any(n.startswith(("tests/", "configs/")) for n in names)  # nothing outside the package
