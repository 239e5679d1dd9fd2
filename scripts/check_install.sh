#!/usr/bin/env bash
# Packaging checks (CI and `make check-install`): the ways msa is installed and consumed, CPU-only,
# on a pristine copy of this checkout (its tracked and untracked, not ignored, files: no build
# state), each in fresh folders and virtual environments under one temporary folder:
#   sdist      python -m build --sdist
#   pip-src    pip install . (build isolation); import msa and check an op on numpy arrays; the
#              msa console script; examples/cpp against the pip package (msa.cmake_dir())
#   pip-sdist  pip install of that sdist; import msa
#   cmake      cmake build + cmake --install; examples/cpp via CMAKE_PREFIX_PATH; the installed CLI
#   subdir     examples/cpp with -DMSA_SOURCE_DIR (add_subdirectory), which builds only the library
# Stops at the first failure, showing the end of its log. Needs PyPI (build, numpy and the build
# requirements of pyproject.toml).
set -euo pipefail

BUILD_PIN=build==1.6.1
root=$(cd "$(dirname "$0")/.." && pwd)
git -C "$root" rev-parse --git-dir > /dev/null 2>&1 ||
  { echo "check_install.sh: $root is not a git checkout" >&2; exit 2; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/msa-check-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
src=$tmp/src
mkdir "$src"
(cd "$root" && git ls-files -z --cached --others --exclude-standard |
   while IFS= read -r -d '' f; do if [[ -e $f ]]; then printf '%s\0' "$f"; fi; done |
   tar --null -T - -cf -) | tar -C "$src" -xf -

# CPU only: the CUDA kernels would take most of the time and no GPU is needed to check packaging.
export CMAKE_ARGS=-DMSA_CUDA=OFF
export CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-$(nproc)}
pip_flags=(--disable-pip-version-check -q)
cmake_flags=(-DMSA_CUDA=OFF -DCMAKE_BUILD_TYPE=Release)

venv() { python3 -m venv "$tmp/$1"; }

# examples/cpp configured with the given arguments, built and run (it prints "msa consumer OK").
consumer() {
  local dir=$1; shift
  cmake -S "$src/examples/cpp" -B "$dir" "$@"
  cmake --build "$dir"
  "$dir/msa_consumer" | grep "msa consumer OK"
}

check_sdist() {
  venv venv-build
  "$tmp/venv-build/bin/pip" install "${pip_flags[@]}" "$BUILD_PIN"
  "$tmp/venv-build/bin/python" -m build --sdist --outdir "$tmp/dist" "$src"
  local sdist
  sdist=$(ls "$tmp"/dist/msa_attention-*.tar.gz)
  if tar tzf "$sdist" | grep -E '/(build[^/]*|tests|\.git)/'; then
    echo "the sdist holds build state, tests or .git (above)"; return 1
  fi
}

check_pip_src() {
  venv venv-src
  local py=$tmp/venv-src/bin/python
  "$tmp/venv-src/bin/pip" install "${pip_flags[@]}" "$src" numpy
  (cd "$tmp" && "$py" - <<'EOF'
import numpy as np

import msa

# Causal GQA attention of one request on the CPU against a float64 numpy reference.
rng = np.random.default_rng(0)
T, Hq, Hkv, D = 16, 4, 2, 64
q, k, v = (rng.standard_normal((T, h, D)).astype(np.float16) for h in (Hq, Hkv, Hkv))
cu = np.array([0, T], np.int32)
out = msa.attention_forward(q, k, v, cu, cu_seqlens_k=cu)
kk, vv = (np.repeat(x.astype(np.float64), Hq // Hkv, axis=1) for x in (k, v))
s = np.einsum("thd,shd->hts", q.astype(np.float64), kk) / np.sqrt(D)
s[:, np.triu(np.ones((T, T), bool), 1)] = -np.inf
p = np.exp(s - s.max(-1, keepdims=True))
ref = np.einsum("hts,shd->thd", p / p.sum(-1, keepdims=True), vv)
err = np.linalg.norm(out.astype(np.float64) - ref) / np.linalg.norm(ref)
assert err < 1e-2, f"attention_forward vs numpy: relative L2 error {err:.2e}"
print(f"import msa {msa.__version__}: attention_forward matches numpy (relative L2 {err:.1e})")
EOF
  )
  "$tmp/venv-src/bin/msa" --help
  "$tmp/venv-src/bin/msa" demo --device cpu --seq 256 --hq 4 --hkv 2 --topk 2
  consumer "$tmp/ex-pip" -Dmsa_DIR="$("$py" -c 'import msa; print(msa.cmake_dir())')"
}

check_pip_sdist() {
  venv venv-sdist
  "$tmp/venv-sdist/bin/pip" install "${pip_flags[@]}" "$tmp"/dist/msa_attention-*.tar.gz
  (cd "$tmp" && "$tmp/venv-sdist/bin/python" -c "import msa; print('import msa', msa.__version__)")
}

check_cmake() {
  cmake -S "$src" -B "$tmp/build" "${cmake_flags[@]}" -DMSA_BUILD_TESTS=OFF -DMSA_BUILD_BENCH=OFF
  cmake --build "$tmp/build"
  cmake --install "$tmp/build" --prefix "$tmp/prefix"
  "$tmp/prefix/bin/msa" --version
  consumer "$tmp/ex-prefix" -DCMAKE_PREFIX_PATH="$tmp/prefix"
}

check_subdir() {
  consumer "$tmp/ex-subdir" "${cmake_flags[@]}" -DMSA_SOURCE_DIR="$src"
  if [[ -e $tmp/ex-subdir/msa/tests || -e $tmp/ex-subdir/msa/tools ]]; then
    echo "msa built its tests or CLI as a subproject"; return 1
  fi
}

passed=0
step() {
  local name=$1 t0=$SECONDS rc
  # Not `if (...)`: bash ignores set -e inside a condition, so a failing command would go unseen.
  set +e
  (set -e; "check_${name//-/_}") > "$tmp/$name.log" 2>&1
  rc=$?
  set -e
  if ((rc == 0)); then
    passed=$((passed + 1))
    echo "PASS $name ($((SECONDS - t0)) s)"
  else
    echo "FAIL $name (exit status $rc after $((SECONDS - t0)) s); the end of its log:"
    tail -n 60 "$tmp/$name.log" | sed 's/^/  | /'
    echo "$passed passed, 1 failed"
    exit 1
  fi
}

for s in sdist pip-src pip-sdist cmake subdir; do step "$s"; done
echo "$passed passed, 0 failed"
