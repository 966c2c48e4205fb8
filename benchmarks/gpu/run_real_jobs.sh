#!/usr/bin/env bash
# Run the known-problem jobs of benchmarks/gpu/jobs.py on a real GPU through gputop: each job
# under `gputop run`, with `gputop record` and `gputop watch --json` beside it from its start,
# and one default `gputop capture` (3 steps) half-way. Then the plain torch.profiler traces of
# benchmarks/gpu/traces.py. Everything lands in one tarball.
#
#   benchmarks/gpu/run_real_jobs.sh OUTDIR [SECONDS] [CASE ...]
#
# On the lent GPU machine (no package index there) the Python packages gputop needs and the
# image lacks travel as wheels in .whl/ (see the device tool's README); they are installed into
# /tmp/site first when .whl/ exists.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: run_real_jobs.sh OUTDIR [SECONDS] [CASE ...]}
seconds=${2:-20}
shift 2 2>/dev/null || shift $#
cases=("$@")
[ ${#cases[@]} -eq 0 ] && cases=(healthy starved hostbound pcie tinykernels leak sync)

# shellcheck source=benchmarks/gpu/python_env.sh
. benchmarks/gpu/python_env.sh
gputop() { "$py" -m gputop "$@"; }

work=$(mktemp -d)
mkdir -p "$work/rec" "$work/traces" "$work/logs" "$out"
log="$work/logs/run.log"
say() { echo "[$(date +%T)] $*" | tee -a "$log" >&2; }

{
    nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.width.max,pcie.link.gen.current,pcie.link.width.current,power.limit,memory.total,mig.mode.current --format=csv
    "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
} >"$work/logs/machine.txt" 2>&1
gputop snapshot --json >"$work/logs/snapshot_idle.json" 2>>"$log"

for case in "${cases[@]}"; do
    say "case $case: ${seconds}s"
    gputop record --interval 0.5 --flush-every 5 -o "$work/rec/$case" \
        --duration $((seconds + 5)) 2>>"$log" &
    rec=$!
    gputop watch --json --interval 0.5 --duration $((seconds + 5)) \
        >"$work/logs/$case.watch.jsonl" 2>>"$log" &
    watch=$!
    sleep 0.5
    # Not through the function: a backgrounded function is a subshell, and $! must be the job.
    "$py" -m gputop run --capture-dir "$work/traces/$case" -- \
        "$py" benchmarks/gpu/jobs.py "$case" --seconds "$seconds" \
        >"$work/logs/$case.job.log" 2>&1 &
    job=$!
    sleep $((seconds / 2))
    say "case $case: capture of pid $job"
    timeout 45 "$py" -m gputop capture "$job" --steps 3 --timeout 40 --json \
        >"$work/logs/$case.capture.json" 2>"$work/logs/$case.capture.err"
    say "case $case: capture exit $?"
    wait "$job"; say "case $case: job exit $?"
    wait "$rec" "$watch"
    for t in "$work/traces/$case"/*.json; do [ -f "$t" ] && gzip -f "$t"; done
done

if [ -z "${NO_TRACES:-}" ]; then
    say "plain profiler traces"
    timeout 120 "$py" benchmarks/gpu/traces.py "$work/traces/plain" >>"$log" 2>&1
    say "traces exit $?"
fi
tar -C "$work" -czf "$out/gpu_run.tar.gz" rec traces logs
cp "$log" "$out/run.log"
du -sh "$out"/* >&2
