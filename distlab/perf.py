"""What a device can do and what a process used: native bf16 matmul, peak matmul FLOP/s and peak memory.

Where Lightning's table of GPUs has no entry (a CPU, a chip it does not list) the peak is *measured* once, in
the run's dtype with this process's threads: what this process can reach on this machine (two ranks sharing
cores each measure their share), so MFU against it is honest on a laptop as on a cluster.

Example::

    from distlab.perf import device_peak_flops
    peak, source = device_peak_flops(torch.device("cpu"), torch.float32)   # e.g. (9.1e10, "measured")
"""

from __future__ import annotations

import resource
import time
import warnings

import torch
from lightning.fabric.utilities.throughput import get_available_flops
from lightning.pytorch.profilers import PyTorchProfiler

from distlab.dtypes import dtype_name


def native_bf16_matmul(device: torch.device) -> bool:
    """Whether ``device`` multiplies bf16 matrices in hardware: a CUDA GPU of compute capability 8.0 or later
    (Ampere on), or an x86 CPU with AVX512-BF16 or AMX-BF16 (``torch.cpu.get_capabilities``). Other device types
    (MPS, XPU) count as emulating it (how much slower that is: docs/internals.md, the optimizer's Newton-Schulz)."""
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= (8, 0)
    if device.type != "cpu":
        return False
    caps = torch.cpu.get_capabilities()
    return bool(caps.get("avx512_bf16") or caps.get("amx_bf16"))


def default_ns_dtype(device: torch.device) -> torch.dtype:
    """Newton-Schulz's dtype when none is set, for one process: bf16 (torch.optim.Muon's) where the device
    multiplies bf16 in hardware (:func:`native_bf16_matmul`), else fp32. DistMuonAdamW agrees on it across
    ranks at its first step."""
    return torch.bfloat16 if native_bf16_matmul(device) else torch.float32


def measure_matmul_flops(device: torch.device, dtype: torch.dtype = torch.float32) -> float:
    """Best FLOP/s of 5 timed n x n matmuls on ``device`` after one warm-up (n: 8192 on a GPU, else 1024)."""
    n = 8192 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda device: None
    best = float("inf")
    for i in range(6):
        sync(device)
        t0 = time.perf_counter()
        a @ b
        sync(device)
        if i:  # the first one warms up the kernels and the allocator
            best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def device_peak_flops(device: torch.device, dtype: torch.dtype) -> tuple[float | None, str]:
    """``(peak FLOP/s of one device, where it comes from)``: Lightning's table, else measured here."""
    if device.type == "cuda":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a chip missing from the table is measured instead
            listed = get_available_flops(device, dtype)
        if listed:
            return float(listed), f"{torch.cuda.get_device_name(device)} datasheet"
    if device.type in ("cpu", "cuda"):
        return measure_matmul_flops(device, dtype), f"measured {dtype_name(dtype)} matmul" + (
            f", {torch.get_num_threads()} threads" if device.type == "cpu" else ""
        )
    return None, "unknown device"


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory of this process: allocated CUDA memory on a GPU, the resident set (RSS) on a CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


class TraceProfiler(PyTorchProfiler):
    """Lightning's ``PyTorchProfiler`` (same arguments), for ``configs/trainer/profile.yaml``.

    One difference: a run in which no step was profiled ends with an empty table instead of torch's
    "Profiler must be initialized before accessing events" (``distlab validate``/``test`` under
    :class:`~distlab.callbacks.RankZeroValidation`, which evaluates outside Lightning's step hooks).
    """

    def _cache_functions_events(self) -> None:
        try:
            super()._cache_functions_events()
        except AssertionError as e:
            if "must be initialized" not in str(e):
                raise
            self.function_events = None
