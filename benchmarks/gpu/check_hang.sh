#!/usr/bin/env bash
# The live hang finding on a real GPU (one card): a 2-rank gloo job whose ranks train on
# cuda:0 (tests/scripts/hang_train.py --device cuda), rank 1 asleep before an all_reduce, beside
# `gputop watch --json` with the bound's floor at 5 s (GPUTOP_HANG_MIN_S). Prints the watch's
# hang line (its evidence carries what NVML read of the GPU) and `gputop hang`'s report.
#
#   benchmarks/gpu/check_hang.sh OUT
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: check_hang.sh OUT}
mkdir -p "$out"
# shellcheck source=benchmarks/gpu/python_env.sh
. benchmarks/gpu/python_env.sh
$py -c "import torch, pynvml, psutil, msgspec; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" || exit 3
export XDG_RUNTIME_DIR=$(mktemp -d) GPUTOP_HANG_MIN_S=5 OMP_NUM_THREADS=1
chmod 700 "$XDG_RUNTIME_DIR"
$py -m gputop run -- $py -m torch.distributed.run --nproc-per-node 2 --monitor-interval 3600 \
    tests/scripts/hang_train.py --scenario sleep --rank 1 --at 200 --device cuda \
    >"$out/job.log" 2>&1 &
job=$!
timeout 150 $py -m gputop watch --json --no-where --duration 120 >"$out/watch.jsonl" 2>"$out/watch.err" &
watch=$!
for _ in $(seq 240); do
    grep -q '"id": "hang"' "$out/watch.jsonl" 2>/dev/null && break
    sleep 0.5
done
grep '"id": "hang"' "$out/watch.jsonl" | head -2
timeout 60 $py -m gputop hang "$job" | tee "$out/hang.txt"
kill "$watch" 2>/dev/null
pkill -P "$job" 2>/dev/null
kill "$job" 2>/dev/null
grep -q '"id": "hang"' "$out/watch.jsonl"
