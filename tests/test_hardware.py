"""The machine facts dart-hf acts on: the dtype chosen where the user names none (mocked CPU flags and GPUs), the
calibration key that keeps machines apart, and the clock that waits for an accelerator (mocked)."""

import time

import torch
from _helpers import prompts, tiny_target

import dart_hf.generation
from dart_hf import DartDraftModel, hardware
from dart_hf.costs import calibration_key
from dart_hf.hardware import CpuInfo, default_dtype, device_clock

SAPPHIRE_RAPIDS = (
    "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu sse avx512f avx512_bf16 amx_bf16 amx_tile\n"
)
ZEN3 = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse avx2 fma\n"
ZEN4 = "processor\t: 0\nmodel name\t: AMD EPYC 9B14\nflags\t\t: fpu sse avx512f avx512_bf16\n"
# a virtual machine's generic name: AVX-512 without bfloat16 units (Ice Lake), or AVX2 only, under one name
ICE_LAKE = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t\t: fpu sse avx2 avx512f avx512_vnni\n"
HASWELL = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t\t: fpu sse avx2 fma\n"


def test_cpu_info_reads_the_model_the_bfloat16_flags_and_avx512():
    assert CpuInfo.parse(SAPPHIRE_RAPIDS) == CpuInfo(
        "Intel(R) Xeon(R) Platinum 8480+", ("amx_bf16", "avx512_bf16"), avx512f=True
    )
    assert CpuInfo.parse(ZEN3).describe() == "AMD EPYC 7B13 [no bf16 units]"
    assert CpuInfo.parse(ZEN4).describe() == "AMD EPYC 9B14 [avx512_bf16]"
    assert CpuInfo.parse(ICE_LAKE).describe() == "Intel(R) Xeon(R) Processor [avx512f, no bf16 units]"
    assert CpuInfo.parse(HASWELL).describe() == "Intel(R) Xeon(R) Processor [no bf16 units]"


def test_default_dtype_on_cpus():
    assert default_dtype("cpu", CpuInfo.parse(SAPPHIRE_RAPIDS))[0] == torch.bfloat16
    assert default_dtype("cpu", CpuInfo.parse(ZEN4))[0] == torch.bfloat16
    dtype, why = default_dtype("cpu", CpuInfo.parse(ZEN3))
    assert dtype == torch.float32 and "no bfloat16" in why and "AMD EPYC 7B13" in why


def test_default_dtype_on_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert default_dtype("cuda")[0] == torch.bfloat16  # H100 / H200
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    dtype, why = default_dtype("cuda")
    assert dtype == torch.float16 and "7.5" in why  # a T4: no native bfloat16
    assert default_dtype("mps")[0] == torch.float32


def test_calibration_key_separates_machines_that_share_a_name(monkeypatch):
    target = tiny_target()
    keys = set()
    for cpuinfo in (SAPPHIRE_RAPIDS, ZEN3, ZEN4, ICE_LAKE, HASWELL):
        monkeypatch.setattr(hardware, "cpu_info", lambda text=cpuinfo: CpuInfo.parse(text))
        keys.add(calibration_key(target))
    monkeypatch.setattr(hardware, "cpu_info", lambda: CpuInfo("AMD EPYC 9B14", ()))  # same name, no bf16 units
    keys.add(calibration_key(target))
    assert len(keys) == 6
    assert calibration_key(target) != calibration_key(target.to(torch.bfloat16))  # and dtypes


def test_a_cpu_clock_is_perf_counter_and_an_accelerator_clock_waits(monkeypatch):
    waits = []
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda device=None: waits.append(device))
    assert device_clock("cpu") is time.perf_counter
    clock = device_clock("cuda:0")
    before = time.perf_counter()
    assert clock() >= before and waits == [torch.device("cuda:0")]


def test_the_decode_loop_times_with_the_device_clock(monkeypatch):
    """With the clock of a (mocked) accelerator, every timing of the loop waits for the device first; the output
    is unchanged."""
    waits = []
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda device=None: waits.append(device))
    monkeypatch.setattr(dart_hf.generation, "device_clock", lambda device: hardware.device_clock("cuda"))
    target = tiny_target(seed=3)
    draft = DartDraftModel.from_target(target)
    prompt = prompts(1, seed=3)[0]
    vanilla = target.generate(prompt, max_new_tokens=24, do_sample=False)
    output = target.generate(prompt, max_new_tokens=24, do_sample=False, assistant_model=draft)
    assert torch.equal(output, vanilla)
    steps = draft.stats.plain_steps + draft.stats.verify_steps
    assert len(waits) >= 2 * steps and set(waits) == {torch.device("cuda")}
