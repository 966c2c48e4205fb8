"""Kineto traces of CUDA work, event by event, for shapes a CPU-only torch cannot record.

Only for what CPU torch cannot produce (kernels, copies, CUDA runtime calls, device-side
synchronisation records): every other test records real CPU runs. Each event is written with
exactly the fields, categories and argument names torch.profiler's Kineto writes for it (taken
from real traces in ../shared/traces: tracelens_h100_bert_small, hta_alexnet_setup,
hta_event_sync, dlrm8_rank0), and the CUPTI callback ids of cupti_runtime_cbid.h.

Times are microseconds from the start of the trace; ``write`` shifts them to a realistic epoch.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

# CUPTI runtime callback ids (cupti_runtime_cbid.h), as Kineto writes them in "cbid".
CBID = {
    "cudaMemcpyAsync": 41,
    "cudaStreamSynchronize": 131,
    "cudaEventRecord": 135,
    "cudaStreamWaitEvent": 147,
    "cudaDeviceSynchronize": 165,
    "cudaLaunchKernel": 211,
    "cudaGraphLaunch": 311,
    "cuLaunchKernel": 307,
}
BASE_US = 1_700_000_000_000_000.0  # an epoch in microseconds, as Kineto's timestamps are
H200 = {
    "id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150_011_101_184, "computeMajor": 9,
    "computeMinor": 0, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
    "regsPerBlock": 65536, "warpSize": 32, "sharedMemPerBlock": 49152, "numSms": 132,
    "regsPerMultiprocessor": 65536, "sharedMemPerBlockOptin": 232448,
    "sharedMemPerMultiprocessor": 233472,
}
A100 = {**H200, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85_031_714_816,
        "computeMajor": 8, "numSms": 108, "sharedMemPerBlockOptin": 166912,
        "sharedMemPerMultiprocessor": 167936}


class KinetoTrace:
    def __init__(self, device: dict = H200, pid: int = 4242, tid: int = 4242) -> None:
        self.device = device
        self.pid, self.tid = pid, tid
        self.events: list[dict] = []
        self._ext = 0
        self._corr = 1000
        self._py = 0

    def _external(self) -> int:
        self._ext += 1
        return self._ext

    def _x(self, cat: str, name: str, pid, tid, ts: float, dur: float, args: dict) -> dict:
        ev = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid,
              "ts": round(ts, 3), "dur": round(dur, 3), "args": args}
        self.events.append(ev)
        return ev

    # --- host side ---------------------------------------------------------------------------

    def step(self, n: int, ts: float, dur: float) -> None:
        self._x("user_annotation", f"ProfilerStep#{n}", self.pid, self.tid, ts, dur,
                {"External id": self._external(), "Record function id": 0})

    def op(self, name: str, ts: float, dur: float, tid: int | None = None) -> None:
        self._x("cpu_op", name, self.pid, tid or self.tid, ts, dur,
                {"External id": self._external(), "Record function id": 0})

    def python(self, name: str, ts: float, dur: float, parent: int | None = None) -> int:
        """A with_stack frame (``file.py(line): function``); returns its Python id."""
        self._py += 1
        self._x("python_function", name, self.pid, self.tid, ts, dur,
                {"Python parent id": parent, "Python id": self._py, "Python thread": 0})
        return self._py

    def runtime(self, name: str, ts: float, dur: float, tid: int | None = None,
                cat: str = "cuda_runtime") -> int:
        # A runtime call's "External id" is the enclosing operator's (the last one written).
        self._corr += 1
        self._x(cat, name, self.pid, tid or self.tid, ts, dur,
                {"External id": self._ext, "cbid": CBID.get(name, 0),
                 "correlation": self._corr})
        return self._corr

    # --- device side ---------------------------------------------------------------------------

    def kernel(self, corr: int, name: str, ts: float, dur: float, stream: int = 7) -> None:
        self._x("kernel", name, 0, stream, ts, dur,
                {"External id": corr, "queued": 0, "device": self.device["id"], "context": 1,
                 "stream": stream, "correlation": corr, "registers per thread": 32,
                 "shared memory": 0, "blocks per SM": 4.0, "warps per SM": 16.0,
                 "grid": [528, 1, 1], "block": [128, 1, 1], "est. achieved occupancy %": 25})
        self._flow(corr, ts, stream)

    def memcpy(self, corr: int, kind: str, nbytes: int, ts: float, dur: float,
               stream: int = 7) -> None:
        """``kind``: "HtoD (Pinned -> Device)", "DtoH (Device -> Pageable)", ..."""
        self._x("gpu_memcpy", f"Memcpy {kind}", 0, stream, ts, dur,
                {"External id": corr, "device": self.device["id"], "context": 1,
                 "stream": stream, "correlation": corr, "bytes": nbytes,
                 "memory bandwidth (GB/s)": nbytes / (dur * 1e3)})
        self._flow(corr, ts, stream)

    def stream_wait(self, corr: int, ts: float, stream: int, on_stream: int,
                    event_corr: int) -> None:
        """CUPTI's record of a cudaStreamWaitEvent (cat cuda_sync)."""
        self._x("cuda_sync", "Stream Wait Event", 0, stream, ts, 0,
                {"External id": corr, "cuda_sync_kind": "Stream Wait Event",
                 "wait_on_stream": on_stream, "wait_on_cuda_event_record_corr_id": event_corr,
                 "wait_on_cuda_event_id": 1, "stream": stream, "correlation": corr,
                 "device": self.device["id"], "context": 1})

    def _flow(self, corr: int, ts: float, stream: int) -> None:
        self.events.append({"ph": "f", "id": corr, "pid": 0, "tid": stream, "ts": round(ts, 3),
                            "cat": "ac2g", "name": "ac2g", "bp": "e"})

    # --- the common host-side shapes of torch -------------------------------------------------

    def launch(self, ts: float, kernel: str, k_ts: float, k_dur: float, op: str = "aten::mul",
               stream: int = 7, op_dur: float = 12.0) -> int:
        """An operator that launches one kernel (cudaLaunchKernel inside it)."""
        self.op(op, ts, op_dur)
        corr = self.runtime("cudaLaunchKernel", ts + 3, 5)
        self.kernel(corr, kernel, k_ts, k_dur, stream)
        return corr

    def to_device(self, ts: float, nbytes: int, m_ts: float, m_dur: float,
                  pinned: bool = True, stream: int = 7) -> None:
        """``x.to('cuda', non_blocking=True)``: aten::to > aten::_to_copy > aten::copy_ >
        cudaMemcpyAsync, and the copy on the device."""
        self.op("aten::to", ts, 30)
        self.op("aten::_to_copy", ts + 2, 27)
        self.op("aten::copy_", ts + 8, 20)
        corr = self.runtime("cudaMemcpyAsync", ts + 10, 15)
        memory = "Pinned" if pinned else "Pageable"
        self.memcpy(corr, f"HtoD ({memory} -> Device)", nbytes, m_ts, m_dur, stream)

    def to_host(self, ts: float, dur: float, nbytes: int, m_ts: float, m_dur: float,
                stream: int = 7) -> None:
        """``y.cpu()``: the copy is queued behind the stream's work and the call returns when it
        is done (cudaMemcpyAsync into pageable memory, then cudaStreamSynchronize)."""
        self.op("aten::to", ts, dur)
        self.op("aten::_to_copy", ts + 1, dur - 2)
        self.op("aten::copy_", ts + 3, dur - 5)
        corr = self.runtime("cudaMemcpyAsync", ts + 5, 10)
        self.memcpy(corr, "DtoH (Device -> Pageable)", nbytes, m_ts, m_dur, stream)
        self.runtime("cudaStreamSynchronize", ts + 16, dur - 22)

    # --- output ---------------------------------------------------------------------------------

    def write(self, path: Path) -> Path:
        events = [dict(ev, ts=round(ev["ts"] + BASE_US, 3)) if "ts" in ev else ev
                  for ev in self.events]
        span = [ev["ts"] for ev in events] + [ev["ts"] + ev.get("dur", 0) for ev in events]
        events.append({"ph": "X", "cat": "Trace", "ts": min(span) - 50, "dur": max(span) -
                       min(span) + 100, "pid": "Spans", "tid": "PyTorch Profiler",
                       "name": "PyTorch Profiler (0)", "args": {"Op count": 0}})
        for pid, label in ((self.pid, "CPU"), (0, "GPU 0")):
            events.append({"name": "process_labels", "ph": "M", "ts": min(span), "pid": pid,
                           "tid": 0, "args": {"labels": label}})
        doc = {"schemaVersion": 1, "deviceProperties": [self.device],
               "cuda_runtime_version": 12080, "cupti_version": 26, "with_stack": 1,
               "traceEvents": events, "traceName": str(path), "displayTimeUnit": "ms",
               "baseTimeNanoseconds": 1_700_000_000_000_000_000}
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "wt") as fh:
            json.dump(doc, fh)
        return path
