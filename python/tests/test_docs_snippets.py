# The documentation's Python snippets (README.md, docs/*.md: every ```python block) run as they
# stand on the CPU backend, each in a fresh interpreter (docs/check_snippets.py does the work).
import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_snippets", ROOT / "docs" / "check_snippets.py")
snippets = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(snippets)
FOUND = [s for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
         for s in snippets.extract(p)]


@pytest.mark.parametrize("snippet", FOUND, ids=[f"{s.path.name}:{s.line}" for s in FOUND])
def test_snippet_runs(snippet):
    missing = snippets.missing_package(snippet.code)
    if missing:
        pytest.skip(f"needs {missing}")
    run = snippets.run(snippet, timeout=300, gpu=False)
    assert run.returncode == 0, run.stdout + run.stderr


def test_docs_have_snippets():
    assert len(FOUND) >= 4, [f"{s.path.name}:{s.line}" for s in FOUND]
