#!/usr/bin/env python3
"""Runs the Python snippets of the documentation and reports which pass.

Every fenced block tagged ```python in README.md and docs/*.md is a snippet meant to run as it
stands; illustrative fragments use ```text or ```py-fragment and are not run. Each snippet runs
in a fresh interpreter (a fresh namespace, nothing shared between snippets) with the GPU hidden
(CUDA_VISIBLE_DEVICES empty), so it exercises the CPU backend. A snippet that imports a package
which is not installed (torch, ml_dtypes, cupy) is skipped with the reason.

    python3 docs/check_snippets.py                 # every snippet
    python3 docs/check_snippets.py -k decode       # snippets whose text contains "decode"
    python3 docs/check_snippets.py --list          # where the snippets are, without running them
    python3 docs/check_snippets.py --gpu           # leave the GPU visible

Prints one line per snippet and "N passed, M failed, S skipped" last; exits 1 if any failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import List, NamedTuple, Optional

ROOT = Path(__file__).resolve().parent.parent
# Optional packages a snippet may import; a snippet that needs a missing one is skipped.
OPTIONAL = ("torch", "ml_dtypes", "cupy")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^`\s]*)")


class Snippet(NamedTuple):
    path: Path
    line: int  # 1-based line of the opening fence
    code: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def extract(path: Path) -> List[Snippet]:
    """The ```python blocks of a Markdown file, in order."""
    snippets: List[Snippet] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, tag = m.group(1), m.group(2), m.group(3).lower()
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            # Strip the fence's own indentation (blocks inside list items).
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        i += 1  # the closing fence
        if tag == "python":
            snippets.append(Snippet(path, start, "\n".join(body) + "\n"))
    return snippets


def missing_package(code: str) -> Optional[str]:
    """The first optional package the snippet imports that is not installed, if any."""
    for name in OPTIONAL:
        pattern = rf"^\s*(import\s+[\w., ]*\b{name}\b|from\s+{name}\b)"
        if re.search(pattern, code, re.MULTILINE) and importlib.util.find_spec(name) is None:
            return name
    return None


def run(snippet: Snippet, timeout: float, gpu: bool) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if not gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return subprocess.run([sys.executable, "-c", snippet.code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path,
                    help="Markdown files (default: README.md and docs/*.md)")
    ap.add_argument("-k", dest="keyword", help="only snippets whose text contains this string")
    ap.add_argument("--list", action="store_true", help="list the snippets, do not run them")
    ap.add_argument("--gpu", action="store_true", help="leave CUDA devices visible")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per snippet (300)")
    args = ap.parse_args()

    files = [f.resolve() for f in args.files] or [ROOT / "README.md",
                                                   *sorted((ROOT / "docs").glob("*.md"))]
    snippets = [s for f in files for s in extract(f)]
    if args.keyword:
        snippets = [s for s in snippets if args.keyword in s.code]
    if args.list:
        for s in snippets:
            print(f"{s.where}  ({s.code.count(chr(10))} lines)")
        return 0

    passed = failed = skipped = 0
    for s in snippets:
        need = missing_package(s.code)
        if need is not None:
            print(f"SKIP {s.where}: needs {need}, which is not installed")
            skipped += 1
            continue
        t0 = time.monotonic()
        try:
            proc = run(s, args.timeout, args.gpu)
        except subprocess.TimeoutExpired:
            print(f"FAIL {s.where}: still running after {args.timeout:.0f} s")
            failed += 1
            continue
        dt = time.monotonic() - t0
        if proc.returncode == 0:
            print(f"PASS {s.where} ({dt:.1f} s)")
            passed += 1
        else:
            print(f"FAIL {s.where} ({dt:.1f} s), exit code {proc.returncode}:")
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-12:]
            print("\n".join("    " + line for line in tail))
            failed += 1
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
