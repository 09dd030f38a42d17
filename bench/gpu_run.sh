#!/usr/bin/env bash
# The one command run on the GPU machine: the acceptance (bench/gpu_acceptance.py), its output in OUT.
#
#   bash bench/gpu_prepare.sh                  # here first: the corpus and commit into .gpu_carry/, the size checked
#   bash bench/gpu_run.sh "$OUT"               # there (device run, carry [".gpu_carry"]): every part, 300 s
#   bash bench/gpu_run.sh "$OUT" --parts decode,train_step   # a rerun of the named parts only
#
# OUT receives the acceptance's own files (summary.json, rewritten after every part; log.txt; nvidia-smi.txt;
# train_metrics.jsonl) and console.txt, everything the run printed, teed as it comes (unbuffered), so that a
# call cut off by its time limit still brings back what ran. Flags after OUT go to bench/gpu_acceptance.py.
# Nothing is installed: the machine has no network. numformer runs from this tree (PYTHONPATH), not installed.
set -uo pipefail
out=${1:?"usage: bash bench/gpu_run.sh OUT [bench/gpu_acceptance.py flags]"}
shift
root=$(cd "$(dirname "$0")/.." && pwd)
carry=${NUMFORMER_GPU_CARRY:-$root/.gpu_carry}  # what bench/gpu_prepare.sh wrote (another folder: tests)
corpus=$carry/bible-en-es
corpus_flag=(--corpus-dir "$corpus")
if [ ! -f "$corpus/train.src" ]; then
    case " $* " in
        *" --quick "*) corpus_flag=() ;;  # the dry run writes its own small corpus
        *) echo "bench/gpu_run.sh: error: $corpus is missing: run 'bash bench/gpu_prepare.sh' before the device" \
                "call and carry .gpu_carry" >&2; exit 2 ;;
    esac
fi
mkdir -p "$out"
# NUMFORMER_DEBUG: a bug's traceback is printed into the log (its crash file would stay on the GPU machine)
export PYTHONUNBUFFERED=1 NUMFORMER_DEBUG=1 PYTHONPATH=$root${PYTHONPATH:+:$PYTHONPATH}
[ -f "$carry/COMMIT" ] && export NUMFORMER_COMMIT=$(cat "$carry/COMMIT")
cd "$root" && python3 bench/gpu_acceptance.py "$out" "${corpus_flag[@]}" "$@" 2>&1 | tee "$out/console.txt"
