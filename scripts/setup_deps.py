#!/usr/bin/env python3
"""Installs msa's pinned header-only dependencies into .deps/ (ignored by git).

Called by `make` (target `deps`); safe to re-run: a stamp file skips work already done.
- CUTLASS/CuTe 4.2 headers from the `nvidia-cutlass==4.2.0.0` wheel (cutlass_library/source/include).
- DLPack 1.3 header (dlpack/dlpack.h) from the `apache-tvm-ffi==0.1.15.post2` wheel, which
  ships the upstream header; only that one header is extracted.
"""
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEPS = ROOT / ".deps"

# (pip requirement, prefix inside the wheel, destination under .deps/include)
PINS = [
    ("nvidia-cutlass==4.2.0.0", "cutlass_library/source/include/", "include"),
    ("apache-tvm-ffi==0.1.15.post2", "tvm_ffi/include/dlpack/", "include/dlpack"),
]


def fetch(req: str, prefix: str, dest: pathlib.Path, tmp: pathlib.Path) -> None:
    stamp = DEPS / (req.replace("==", "-") + ".stamp")
    if stamp.exists():
        return
    wheel_dir = tmp / req.split("==")[0]
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
           "--only-binary=:all:", "-d", str(wheel_dir), req]
    print("msa setup:", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=True)
    wheels = list(wheel_dir.glob("*.whl"))
    if len(wheels) != 1:
        sys.exit(f"msa setup: expected one wheel for {req}, found {wheels}")
    n = 0
    with zipfile.ZipFile(wheels[0]) as zf:
        for name in zf.namelist():
            if not name.startswith(prefix) or name.endswith("/"):
                continue
            out = dest / name[len(prefix):]
            out.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(name) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst)
            n += 1
    if n == 0:
        sys.exit(f"msa setup: {req} has no files under {prefix}")
    stamp.write_text(f"{n} files\n")
    print(f"msa setup: {req}: {n} files -> {dest.relative_to(ROOT)}", flush=True)


def main() -> None:
    DEPS.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for req, prefix, dest in PINS:
            fetch(req, prefix, DEPS / dest, pathlib.Path(tmp))


if __name__ == "__main__":
    main()
