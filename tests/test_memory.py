"""Memory figures: CPU peak RSS, and NVML absence recorded as such rather than failing."""
import pynvml
import pytest

from sbd_bench.runner import memory


def test_cpu_monitor_reports_sampled_rss():
    import torch

    with memory.MemoryMonitor(torch.device("cpu")) as mem:
        block = bytearray(64 << 20)  # 64 MiB resident for the duration
        block[:: 4096] = b"x" * len(block[:: 4096])
    r = mem.result
    assert r["peak_memory_source"].startswith("sampled RSS") and r["peak_memory_bytes"] >= 64 << 20
    assert r["torch_max_allocated_bytes"] is None and r["nvml_peak_used_bytes"] is None
    assert r["nvml"].startswith("not used") and r["process_max_rss_bytes"] >= r["peak_memory_bytes"] // 2


def test_nvml_absence_is_recorded(monkeypatch):
    def no_library():
        raise pynvml.NVMLError_LibraryNotFound(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    nvml = memory.Nvml(0)
    assert nvml.status.startswith("unavailable: NVMLError_LibraryNotFound")
    assert nvml.used_bytes() is None and nvml.versions() == {}


def test_missing_nvml_package_is_recorded(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "pynvml":
            raise ImportError("no pynvml")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    assert memory.Nvml(0).status == "unavailable: nvidia-ml-py is not installed"


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
def test_cuda_monitor_reads_allocator_peak():  # pragma: no cover - runs on GPU machines only
    import torch

    device = torch.device("cuda")
    with memory.MemoryMonitor(device) as mem:
        x = torch.empty(32 << 20, dtype=torch.uint8, device=device)
        del x
    assert mem.result["peak_memory_source"] == "torch.cuda.max_memory_allocated"
    assert mem.result["torch_max_allocated_bytes"] >= 32 << 20
