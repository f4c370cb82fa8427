"""What this machine computes with: the processor's name and bfloat16 features, the dtype a target runs fastest
in where the user does not choose one, and a clock that times what a device did.

The processor description is part of every calibration key (`costs.calibration_key`): a tree forward's cost
relative to one token differs several-fold between a CPU with bfloat16 matrix units and one without, so two machines
that share a name ("AMD EPYC") and a thread count but not those units must not share measured costs.
"""

from __future__ import annotations

import functools
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

# CPU flags (as /proc/cpuinfo spells them) of instructions that multiply bfloat16 natively: Intel's AMX tiles, and
# the AVX-512 bfloat16 dot products of Intel Cooper Lake / Sapphire Rapids and AMD Zen 4 and later
BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")


@dataclass(frozen=True)
class CpuInfo:
    """A processor's model name, the flags of `BF16_CPU_FLAGS` it has, and whether it has AVX-512 (`avx512f`)."""

    model: str
    bf16_flags: tuple[str, ...]
    avx512f: bool = False

    @classmethod
    def parse(cls, cpuinfo: str) -> CpuInfo:
        """From the text of /proc/cpuinfo (the first processor's `model name` and `flags` lines)."""
        model, flags = "", set()
        for line in cpuinfo.splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and not model:
                model = value.strip()
            elif key == "flags" and not flags:
                flags = set(value.split())
        return cls(
            model or platform.processor() or "unknown CPU", tuple(f for f in BF16_CPU_FLAGS if f in flags),
            avx512f="avx512f" in flags,
        )

    def describe(self) -> str:
        """`model [flags]`, e.g. `AMD EPYC [avx512_bf16]`, `Intel Xeon [avx512f, no bf16 units]` or `AMD EPYC [no
        bf16 units]` (AVX2 at most). bfloat16 units come only with AVX-512, so AVX-512 is named where they are
        absent: its float32 products are twice AVX2's width, and a model name alone (a virtual machine's `Intel(R)
        Xeon(R) Processor`) does not tell the two apart."""
        if self.bf16_flags:
            return f"{self.model} [{' '.join(self.bf16_flags)}]"
        return f"{self.model} [{'avx512f, ' if self.avx512f else ''}no bf16 units]"


@functools.cache
def cpu_info() -> CpuInfo:
    """This machine's processor, read from /proc/cpuinfo (on systems without it: the platform's processor name and
    no bfloat16 flags)."""
    path = Path("/proc/cpuinfo")
    return CpuInfo.parse(path.read_text() if path.exists() else "")


def device_description(device: torch.device | str) -> str:
    """What a forward's cost on `device` depends on beyond the model: the CPU's model, bfloat16 and AVX-512 flags, or
    the accelerator's name."""
    device = torch.device(device)
    if device.type == "cpu":
        return cpu_info().describe()
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"{torch.cuda.get_device_name(device)} [sm_{major}{minor}]"
    return str(device)


def default_device() -> torch.device:
    """The accelerator torch finds (a GPU), else the CPU."""
    accelerator = torch.accelerator.current_accelerator() if hasattr(torch, "accelerator") else None
    return accelerator if accelerator is not None else torch.device("cpu")


def default_dtype(device: torch.device | str, cpu: CpuInfo | None = None) -> tuple[torch.dtype, str]:
    """(dtype, why) for a target on `device` when the user names none: bfloat16 where the hardware multiplies it
    natively (a CPU with `BF16_CPU_FLAGS`, a GPU of compute capability 8 or later), float16 on older GPUs, float32
    elsewhere. cpu: the processor to judge (default this machine's)."""
    device = torch.device(device)
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if major >= 8:
            return torch.bfloat16, f"a GPU of compute capability {major}.{minor} multiplies bfloat16 natively"
        return torch.float16, f"a GPU of compute capability {major}.{minor} multiplies float16, not bfloat16, natively"
    if device.type == "cpu":
        cpu = cpu or cpu_info()
        if cpu.bf16_flags:
            return torch.bfloat16, f"{cpu.describe()} multiplies bfloat16 natively"
        return torch.float32, f"{cpu.describe()} has no bfloat16 matrix instructions"
    return torch.float32, f"no dtype rule for {device.type} devices; pass dtype= to choose one"


def synchronize(device: torch.device | str) -> None:
    """Wait until `device` has finished the work queued on it (a CPU computes as it is called: nothing to wait for)."""
    device = torch.device(device)
    if device.type != "cpu" and hasattr(torch, "accelerator"):
        torch.accelerator.synchronize(device)


def device_clock(device: torch.device | str) -> Callable[[], float]:
    """A clock (seconds, `time.perf_counter`) for timing work on `device`. On an accelerator a call returns before its
    kernels finish, so each reading first waits for the device: the time between two readings is what the device
    did, which is what the decode loop's controller prices budgets with."""
    device = torch.device(device)
    if device.type == "cpu":
        return time.perf_counter

    def clock() -> float:
        synchronize(device)
        return time.perf_counter()

    return clock
