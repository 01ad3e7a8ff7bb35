"""Throttling: SM clock and clock-event reasons read through NVML after every sample.

A sample is throttled when a slowdown reason is active (thermal, hardware, power
brake) or the SM clock is below ``MIN_CLOCK_SHARE`` of the device's maximum; such
samples are discarded and counted, and the engine pauses before the next one.
"""

from __future__ import annotations

import dataclasses

from casebook.measure import gpu

# NVBench discards a trial below 75% of the default SM clock; the same share here.
MIN_CLOCK_SHARE = 0.75
# NVBench sleeps 50 ms after a throttled trial so the device can recover.
PAUSE_S = 0.05
# Reasons that mean the clock was pulled down under load (idle, application clocks
# and sync boost are not slowdowns).
SLOWDOWN_REASONS = ("nvmlClocksEventReasonHwSlowdown", "nvmlClocksEventReasonHwThermalSlowdown",
                    "nvmlClocksEventReasonHwPowerBrakeSlowdown",
                    "nvmlClocksEventReasonSwThermalSlowdown")


@dataclasses.dataclass(frozen=True)
class Reading:
    sm_clock_mhz: int | None
    reasons: int | None  # NVML clock-event reason bits
    throttled: bool


class Unmonitored:
    """No GPU: nothing to read; no sample is discarded, and the record says so."""

    monitored = False
    description = "not monitored (no GPU: NVML has no device here)"
    pause_s = 0.0

    def read(self) -> Reading:
        return Reading(None, None, False)


class NvmlMonitor:
    monitored = True
    pause_s = PAUSE_S

    def __init__(self, tools: gpu.Tools):
        nvml = self.nvml = tools.nvml
        self.handle = nvml.nvmlDeviceGetHandleByIndex(tools.device)
        self.max_mhz = nvml.nvmlDeviceGetMaxClockInfo(self.handle, nvml.NVML_CLOCK_SM)
        self.mask = 0
        for name in SLOWDOWN_REASONS:
            self.mask |= getattr(nvml, name)
        self.description = (f"NVML after every sample: throttled when a thermal/hardware "
                            f"slowdown reason is set or the SM clock is below "
                            f"{MIN_CLOCK_SHARE:.0%} of its {self.max_mhz} MHz maximum")

    def read(self) -> Reading:
        nvml = self.nvml
        reasons = nvml.nvmlDeviceGetCurrentClocksEventReasons(self.handle)
        mhz = nvml.nvmlDeviceGetClockInfo(self.handle, nvml.NVML_CLOCK_SM)
        throttled = bool(reasons & self.mask) or mhz < MIN_CLOCK_SHARE * self.max_mhz
        return Reading(mhz, reasons, throttled)
