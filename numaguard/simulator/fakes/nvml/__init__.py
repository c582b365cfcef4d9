"""A fake NVML driver library, at the C boundary.

pynvml calls into ``libnvidia-ml.so`` through ctypes: it looks every C function up on
its ``nvmlLib`` object, passes ctypes arguments (``byref`` out-parameters, string
buffers, structs) and turns the returned code into a real ``NVMLError_*`` subclass.
``FakeNvml`` stands in for that library object, so the exporter runs all of pynvml's
own code — struct layouts, the two-call process listing, error mapping — against GPUs
described in Python: models, MIG layouts, utilization, memory and processes. Failures
and hangs can be injected per C function and GPU.

The library object is in ``library``, what a GPU is in ``records``, and its C
functions by area in ``links``, ``mig`` and ``gpm`` (GPM as the hardware integrates it).
"""

from numaguard.simulator.fakes.nvml.library import FakeNvml
from numaguard.simulator.fakes.nvml.records import FakeGpu, FakeSlice, Process

__all__ = ["FakeGpu", "FakeNvml", "FakeSlice", "Process"]
