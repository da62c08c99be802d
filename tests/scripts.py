"""Load a script that is not a package module as a module: the benches and grid tools of scripts/, and the
one-off scripts that sit beside their study in results/<study>/ (docs/DESIGN.md, layout)."""
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"


def load_script(name: str, folder: str = "scripts"):
    """``<folder>/<name>.py`` (relative to the repository) as a fresh module."""
    spec = importlib.util.spec_from_file_location(name, REPO / folder / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
