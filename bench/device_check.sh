#!/usr/bin/env bash
# One call on a machine with many cores and a GPU (issue 43): the measurements
# that need it, in at most 9 minutes on 16 cores and one GPU, no network, no Ray.
#
#   bash bench/device_check.sh [--smoke] [DIR]
#
# DIR (default: $OUT where set, else a new temporary folder) receives the JSON
# of each step and a table against the targets (device-check.json); the log is
# device-check.log there. Nothing else is written outside DIR and a temporary
# folder that is removed at the end (bytecode and temporary files included).
# Steps, each under its own time limit (a step that fails or runs out says so
# in the table and the others go on):
#   gpu-tests    pytest tests/test_gpu.py (the real-GPU tests)
#   gpu          bench/gpu_bench.py: serial, an 8-process Pool, gpus_per_task 1..0.125
#   linear       mm.linear(device="cuda") against the CPU at 1,000,000 groups
#   million      bench/million_bench.py at 1,000,000 groups, one worker per core
#   million-nice the same without and with a store, the workers 5 steps nicer
#                (MANYMODELS_WORKER_NICENESS=5, not the default)
#   files-sweep  one model per file and the RandomForest sweep against a Pool
# --smoke runs the same steps at small sizes (at most 2 minutes on 2 cores); without
# a GPU the GPU tests skip, the gpu step is skipped (gpu_bench.py is not run),
# mm.linear runs PyTorch on the CPU against NumPy, and the table says "skipped: no GPU".
# PYTHON picks the interpreter (default: .venv/bin/python if present, else python3);
# DEVICE_CHECK_BUDGET_S the time budget of all steps (default 540 s; smoke 120 s).
set -u
cd "$(dirname "$0")/.."
smoke=0
dest=""
for arg in "$@"; do
    case "$arg" in
        --smoke) smoke=1 ;;
        -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        -*) echo "device_check.sh: unknown option $arg" >&2; exit 2 ;;
        *) dest="$arg" ;;
    esac
done
dest="${dest:-${OUT:-}}"
[ -n "$dest" ] || dest="$(mktemp -d "${TMPDIR:-/tmp}/mm-device-check-XXXXXX")"
mkdir -p "$dest" || exit 2
dest="$(cd "$dest" && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/mm-device-work-XXXXXX")" || exit 2
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/tmp"
export TMPDIR="$work/tmp" PYTHONPYCACHEPREFIX="$work/pycache" PYTHONUNBUFFERED=1
export MPLCONFIGDIR="$work/mpl" PYTHONPATH="$PWD/src:$PWD/bench${PYTHONPATH:+:$PYTHONPATH}"
py="${PYTHON:-}"
if [ -z "$py" ]; then
    if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
fi
cores="$(nproc)"
budget="${DEVICE_CHECK_BUDGET_S:-$([ $smoke = 1 ] && echo 120 || echo 540)}"
started=$SECONDS
log="$dest/device-check.log"
: > "$log"
steps="$work/steps.tsv"
: > "$steps"

# step NAME LIMIT_S COMMAND...: run it under min(LIMIT_S, what is left of the budget)
step() {
    local name="$1" limit="$2"
    shift 2
    local left=$((budget - (SECONDS - started)))
    [ "$limit" -gt "$left" ] && limit="$left"
    if [ "$limit" -lt 5 ]; then
        printf '%s\t%s\t%s\n' "$name" "skipped: out of time" 0 >> "$steps"
        echo "== $name (skipped): out of time" | tee -a "$log"
        return
    fi
    echo "== $name (at most ${limit} s): $*" | tee -a "$log"
    local begin=$SECONDS rc=0
    timeout --kill-after=15 "$limit" "$@" 2>&1 | tee -a "$log"
    rc="${PIPESTATUS[0]}"
    local status="ok"
    case "$rc" in
        0) ;;
        124|137) status="timed out after ${limit} s" ;;
        *) status="exit code $rc" ;;
    esac
    # gpu_bench.py exits 2 where PyTorch sees no CUDA GPU (a GPU nvidia-smi lists)
    [ "$name" = gpu ] && [ "$rc" = 2 ] && status="skipped: no GPU"
    printf '%s\t%s\t%s\n' "$name" "$status" $((SECONDS - begin)) >> "$steps"
}

if [ $smoke = 1 ]; then
    groups=2000; files=16; sweep=2,4; gpu_args=(--tasks 4 --steps 5 --pool 2)
    linear_groups=2000
else
    groups=1000000; files=2000; sweep=""; gpu_args=(--tasks 32 --steps 300 --pool 8)
    linear_groups=1000000
fi
if command -v nvidia-smi > /dev/null && nvidia-smi -L 2> /dev/null | grep -q '^GPU'; then
    device=cuda
    nvidia-smi 2>&1 | tee -a "$log"
else
    device=cpu
    echo "no GPU (nvidia-smi lists none): the GPU tests skip, gpu_bench.py says so," \
        "mm.linear runs PyTorch on the CPU" | tee -a "$log"
fi
echo "device check: $cores cores, python $py, budget ${budget} s, JSON into $dest" | tee -a "$log"

step gpu-tests 150 "$py" -m pytest -p no:cacheprovider -q -x tests/test_gpu.py \
    --junitxml="$dest/gpu-tests.xml"
# (found, not imported: importing PyTorch takes seconds)
if "$py" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)" \
        2> /dev/null; then
    if [ "$device" = cuda ]; then
        step gpu 180 "$py" bench/gpu_bench.py --device cuda "${gpu_args[@]}" \
            --out "$dest/gpu.json"
    else  # gpu_bench.py would only say that PyTorch sees no CUDA GPU
        printf '%s\t%s\t%s\n' gpu "skipped: no GPU" 0 >> "$steps"
        echo "== gpu (skipped): no GPU" | tee -a "$log"
    fi
    step linear 90 "$py" bench/device_check.py linear --groups "$linear_groups" \
        --device "$device" --out "$dest/linear.json"
else
    for name in gpu linear; do
        printf '%s\t%s\t%s\n' "$name" "skipped: no PyTorch" 0 >> "$steps"
        echo "== $name (skipped): no PyTorch" | tee -a "$log"
    done
fi
step million 240 "$py" bench/million_bench.py --groups "$groups" --workers "$cores" \
    --case-timeout 120 --out "$dest/million.json"
step million-nice 120 env MANYMODELS_WORKER_NICENESS=5 "$py" bench/million_bench.py \
    --groups "$groups" --workers "$cores" --cases "mm,mm+store" --case-timeout 60 \
    --out "$dest/million-nice.json"
step files-sweep 150 "$py" bench/device_check.py files-sweep --files "$files" \
    ${sweep:+--sweep "$sweep"} --workers "$cores" --out "$dest/files-sweep.json"

"$py" bench/device_check.py table "$dest" --steps "$steps" $([ $smoke = 1 ] && echo --smoke) \
    2>&1 | tee -a "$log"
echo "took $((SECONDS - started)) s" | tee -a "$log"
