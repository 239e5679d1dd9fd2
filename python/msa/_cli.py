"""The `msa` console script: replaces this process with the C++ command-line tool that the wheel
installs as msa/bin/msa, passing the arguments through (exit codes and output are the tool's)."""

from __future__ import annotations

import os
import sys

from ._paths import _ROOT


def main() -> None:
    exe = os.path.join(_ROOT, "bin", "msa")
    try:
        os.execv(exe, ["msa", *sys.argv[1:]])
    except OSError as e:
        sys.exit(f"msa: cannot run the command-line tool {exe}: {e.strerror}")
