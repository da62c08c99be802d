"""README.md cites committed files by path: each one must exist (a moved table leaves no dead reference)."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_repository_path_the_readme_cites_exists():
    text = (ROOT / "README.md").read_text()
    spans = set(re.findall(r"`([^`\s<>]+)`", text))  # a bare path in backticks, not a command or a pattern
    cited = [p for p in spans if re.match(r"(results|configs|scripts|bftrec|docs|tests|data)/", p)
             and not p.startswith("results/runs/")]  # results/runs/ is run output, never committed
    assert cited, "the README cites no repository path: the pattern above is stale"
    missing = sorted(p for p in cited if not (ROOT / p.rstrip("/")).exists())
    assert not missing, f"README.md cites paths that do not exist: {missing}"
