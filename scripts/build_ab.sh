#!/usr/bin/env bash
# Builds TARGETS (default: bench_sparse_fwd test_sparse_fwd) for main and for each wip/<name>
# patch series named on the command line, into build-device-bin/ab/<name>/ (main:
# build-device-bin/ab/main/), so one device call can A/B them (`bench/device_session.sh ab` runs
# each folder's tests, racecheck on them and its benchmarks; carry build-device-bin/ab). Builds incrementally in BUILD (default build-me)
# on a throwaway branch per series and returns the tree to the branch it started on; the working
# tree must be clean.
#   scripts/build_ab.sh combine-seg uniform-lpt
#   TARGETS="bench_indexer test_indexer_gpu" scripts/build_ab.sh indexer-fused-tmpl
set -euo pipefail
BUILD=${BUILD:-build-me}
JOBS=${JOBS:-2}
TARGETS=${TARGETS:-"bench_sparse_fwd test_sparse_fwd"}
if ! git diff --quiet || ! git diff --cached --quiet; then
  echo "build_ab.sh: commit or stash your changes first" >&2
  exit 1
fi
base=$(git rev-parse --abbrev-ref HEAD)
build_into() {
  cmake --build "$BUILD" -j "$JOBS" --target $TARGETS > /dev/null
  mkdir -p "build-device-bin/ab/$1"
  for t in $TARGETS; do
    if [[ -f $BUILD/bench/$t ]]; then cp "$BUILD/bench/$t" "build-device-bin/ab/$1/"
    else cp "$BUILD/tests/cuda/$t" "build-device-bin/ab/$1/"; fi
  done
  echo "built build-device-bin/ab/$1"
}
make --no-print-directory configure BUILD="$BUILD" > /dev/null
rm -rf build-device-bin/ab
build_into main
for name in "$@"; do
  [[ -d wip/$name ]] || { echo "build_ab.sh: no wip/$name" >&2; exit 1; }
  git checkout -q -b "ab/$name"
  if ! git am -q wip/"$name"/*.patch; then
    git am --abort; git checkout -q "$base"; git branch -D -q "ab/$name"
    echo "build_ab.sh: wip/$name does not apply" >&2; exit 1
  fi
  build_into "$name"
  git checkout -q "$base"
  git branch -D -q "ab/$name"
done
cmake --build "$BUILD" -j "$JOBS" --target $TARGETS > /dev/null  # objects back to $base
