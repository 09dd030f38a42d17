#!/usr/bin/env bash
# Before a device call, here: what the GPU acceptance takes along, and a check that it fits.
#
#   bash bench/gpu_prepare.sh
#
# The GPU machine reaches no network and has no SWORD modules, so the corpus travels with the tree: the
# bible-en-es corpus (built here if missing) is copied into .gpu_carry/ (ignored by git: carried, never
# committed), with the commit the run is of. The device tool sends at most 64 MiB (tracked and untracked,
# not ignored files, plus what a call carries): this says the total, and exits 1 if it is over.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cache=$(python3 -c "from numformer.data.bible import default_cache_dir; print(default_cache_dir())")
[ -f "$cache/meta.json" ] || python3 -m numformer.data.bible
rm -rf .gpu_carry/bible-en-es && mkdir -p .gpu_carry && cp -r "$cache" .gpu_carry/bible-en-es
commit=$(git rev-parse --short HEAD)
git diff --quiet HEAD -- || commit="$commit+changes"  # the tree that travels is not exactly the commit
echo "$commit" > .gpu_carry/COMMIT
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | awk 'END {print $1}')
carry=$(du -sb .gpu_carry | cut -f1)
total=$((tree + carry))
limit=$((64 * 1024 * 1024))
awk -v t="$tree" -v c="$carry" -v k="$commit" 'BEGIN {m = 1048576; printf "gpu_prepare: the tree %.1f MiB + .gpu_carry \
%.1f MiB = %.1f MiB of the 64 MiB a device call sends (commit %s)\n", t / m, c / m, (t + c) / m, k}'
[ "$total" -le "$limit" ] || { echo "gpu_prepare: error: over 64 MiB: carry less" >&2; exit 1; }
