"""Peak memory of one measured piece of work, with every figure named by where it comes from.

    >>> with MemoryMonitor(torch.device("cuda")) as mem:
    ...     decoder.generate(prompt_ids, solver)
    >>> mem.result   # {"peak_memory_bytes": ..., "peak_memory_source": "torch.cuda.max_memory_allocated", ...}

Figures (keys of ``result``):
  torch_max_allocated_bytes  CUDA only: ``torch.cuda.max_memory_allocated``, reset on entry. Tensors
                             this process allocated; excludes the allocator's cache and CUDA context.
  nvml_peak_used_bytes       CUDA only: device-wide used memory from NVML (every process on the GPU,
                             CUDA context included), sampled every ``interval_s`` by a thread.
  nvml                       "ok", or why NVML gave nothing ("unavailable: ..."); never a failure.
  rss_peak_bytes             resident memory of this process, sampled like NVML (CPU and CUDA).
  process_max_rss_bytes      ``getrusage`` peak RSS of the whole process so far (monotone).
  peak_memory_bytes          the headline figure: torch allocator on CUDA, sampled RSS on CPU;
  peak_memory_source         ... and which one it is.
"""
from __future__ import annotations

import os
import resource
import threading

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def current_rss_bytes() -> int | None:
    """Resident set size now (Linux /proc); None where /proc is missing."""
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            return int(handle.read().split()[1]) * PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return None


def process_max_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


class Nvml:
    """A handle on one GPU through NVML, or the reason there is none (``error``). ``uuid`` (from torch)
    finds the right GPU when CUDA_VISIBLE_DEVICES renumbers them; the index is the fallback."""

    def __init__(self, index: int = 0, uuid: str | None = None):
        self.handle, self.error = None, None
        try:
            import pynvml

            pynvml.nvmlInit()
            try:
                self.handle = pynvml.nvmlDeviceGetHandleByUUID(uuid) if uuid else None
            except pynvml.NVMLError:
                self.handle = None
            if self.handle is None:
                self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except ImportError:
            self.error = "unavailable: nvidia-ml-py is not installed"
        except Exception as exc:  # pynvml.NVMLError and its many subclasses: no driver, no GPU
            self.error = f"unavailable: {type(exc).__name__}: {exc}"

    @property
    def status(self) -> str:
        return self.error or "ok"

    def used_bytes(self) -> int | None:
        if self.handle is None:
            return None
        import pynvml

        try:
            return int(pynvml.nvmlDeviceGetMemoryInfo(self.handle).used)
        except pynvml.NVMLError:
            return None

    def versions(self) -> dict:
        """GPU name, driver version and the driver's CUDA version; empty when NVML is unavailable."""
        if self.handle is None:
            return {}
        import pynvml

        def text(value):
            return value.decode() if isinstance(value, bytes) else value

        try:
            cuda = pynvml.nvmlSystemGetCudaDriverVersion()
            return {"gpu_name": text(pynvml.nvmlDeviceGetName(self.handle)),
                    "driver_version": text(pynvml.nvmlSystemGetDriverVersion()),
                    "cuda_driver_version": f"{cuda // 1000}.{cuda % 1000 // 10}"}
        except pynvml.NVMLError:
            return {}


_NVML: dict[int, Nvml] = {}


def nvml_for(index: int) -> Nvml:
    """One NVML handle per CUDA device index per process (nvmlInit is not free)."""
    if index not in _NVML:
        _NVML[index] = Nvml(index, _cuda_uuid(index))
    return _NVML[index]


def _cuda_index(device) -> int:
    if getattr(device, "index", None) is not None:
        return device.index
    import torch

    return torch.cuda.current_device()


def _cuda_uuid(index: int) -> str | None:
    try:
        import torch

        uuid = str(torch.cuda.get_device_properties(index).uuid)
        return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
    except Exception:  # no CUDA, or a torch without the property: fall back to the index
        return None


class MemoryMonitor:
    """Context manager: peak memory over its body. On CUDA it resets the allocator's peak on entry."""

    def __init__(self, device, interval_s: float | None = None):
        self.cuda = getattr(device, "type", str(device)) == "cuda"
        # on a CPU the sampler competes with the timed threads for cores: wake it less often
        self.device, self.interval_s = device, interval_s or (0.01 if self.cuda else 0.05)
        self.nvml = nvml_for(_cuda_index(device)) if self.cuda else None
        self.result: dict = {}
        self._stop = threading.Event()
        self._peaks = {"rss": None, "nvml": None}

    def _sample(self) -> None:
        for key, value in (("rss", current_rss_bytes()), ("nvml", self.nvml.used_bytes() if self.nvml else None)):
            if value is not None and (self._peaks[key] is None or value > self._peaks[key]):
                self._peaks[key] = value

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> "MemoryMonitor":
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="sbd-memory", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()  # first: the sampler must stop even when the body raised (an OOM, say)
        self._thread.join()
        torch_peak = None
        if self.cuda:
            import torch

            try:
                torch.cuda.synchronize(self.device)
                torch_peak = int(torch.cuda.max_memory_allocated(self.device))
            except RuntimeError:  # a broken CUDA context after a failure: leave the figure out
                pass
        self._sample()  # the last state counts too, even for work shorter than one interval
        if self.cuda:
            headline, source = torch_peak, "torch.cuda.max_memory_allocated"
        else:
            headline, source = self._peaks["rss"], "sampled RSS (process resident memory)"
        self.result = {
            "peak_memory_bytes": headline,
            "peak_memory_source": source,
            "torch_max_allocated_bytes": torch_peak,
            "nvml_peak_used_bytes": self._peaks["nvml"],
            "nvml": self.nvml.status if self.nvml else "not used: no CUDA device",
            "rss_peak_bytes": self._peaks["rss"],
            "process_max_rss_bytes": process_max_rss_bytes(),
        }
