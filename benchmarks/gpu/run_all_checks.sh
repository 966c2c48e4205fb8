#!/usr/bin/env bash
# Every real-GPU check of the project in one run, for a lent GPU machine with a short budget:
# each check under its own timeout (one that hangs costs only its slot), its output in
# OUT/logs/NAME.log, everything in OUT/gpu_checks.tar.gz, a PASS/FAIL summary last.
#
#   benchmarks/gpu/run_all_checks.sh OUT
#
# In order of what the simulator cannot tell: the memory capture and OOM forensics on CUDA,
# the known-problem jobs through record/watch/capture (then replayed through the live rules),
# the bounded capture on CUDA jobs, the trace classes, MFU against GPM, the lost-GPU check, and
# pid namespaces with the real driver.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: run_all_checks.sh OUT}
mkdir -p "$out"
work=$(mktemp -d)
mkdir -p "$work/logs"

# shellcheck source=benchmarks/gpu/python_env.sh
. benchmarks/gpu/python_env.sh
summary="$work/logs/summary.txt"

check() {  # check NAME SECONDS CMD...
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    timeout --kill-after=5 "$limit" "$@" >"$work/logs/$name.log" 2>&1
    local rc=$?
    local verdict=PASS
    [ $rc -ne 0 ] && verdict="FAIL (exit $rc)"
    [ $rc -eq 124 ] && verdict="TIMEOUT (${limit}s)"
    echo "$name: $verdict in $((SECONDS - start)) s" | tee -a "$summary" >&2
}

[ -f benchmarks/gpu/memory_check.py ] &&
    check memory 90 "$py" benchmarks/gpu/memory_check.py
check jobs 200 env PYTHON="$py" NO_TRACES=1 NO_WHEELS=1 \
    benchmarks/gpu/run_real_jobs.sh "$work/jobs" 14
if [ -f "$work/jobs/gpu_run.tar.gz" ]; then
    mkdir -p "$work/jobs/x" && tar -C "$work/jobs/x" -xzf "$work/jobs/gpu_run.tar.gz"
    check replay 60 "$py" benchmarks/gpu/check_replay.py "$work/jobs/x/rec"
fi
check capture 150 "$py" benchmarks/bench_capture.py --device cuda --no-baseline \
    --jobs getitem-nw0,pin-memory,compile,exits
check traces 90 sh -c "$py benchmarks/gpu/traces.py $work/traces copy_h2d final_read && \
    $py benchmarks/gpu/trace_classes.py $work/traces"
check mfu 60 "$py" benchmarks/gpu/mfu_check.py --seconds 20
check lost_gpu 30 "$py" benchmarks/gpu/check_lost_gpu.py --seconds 10
check containers 150 "$py" benchmarks/gpu/check_containers.py

cp "$summary" "$out/summary.txt"
tar -C "$work" -czf "$out/gpu_checks.tar.gz" logs jobs traces 2>/dev/null
cat "$summary"
