"""The one report header every benchmark opens with (``benchmarks/reporting.py``)."""

from __future__ import annotations

import os
import platform
import re
import time
from importlib.metadata import version

import pytest

from benchmarks.reporting import header


@pytest.fixture
def argv(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.argv", ["benchmarks/overhead.py", "--models", "digits", "--out", "my table.md"])


@pytest.mark.usefixtures("argv")
def test_header_records_command_date_wall_time_machine_versions_and_load() -> None:
    lines = header(time.perf_counter() - 42.4, "0.5, 0.4, 0.3", workers=3, threads=1)
    assert all(line.startswith("- ") for line in lines)
    text = "\n".join(lines)
    # The exact command line, quoted so that it can be pasted back into a shell.
    assert "- command: `python benchmarks/overhead.py --models digits --out 'my table.md'`" in lines
    assert re.search(r"- date: \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d; wall time 42 s", text)
    assert f"{os.cpu_count()} CPU cores" in text and platform.platform() in text
    for package in ("torch", "lightning", "numpy"):
        assert f"{package} {version(package)}" in text
    assert f"python {platform.python_version()}" in text
    assert "; 3 worker process(es); 1 torch thread(s) each" in text
    assert re.fullmatch(r"- load average \(1, 5, 15 min\) before: 0\.5, 0\.4, 0\.3; after: [\d., ]+", lines[-1])
    assert "device" not in text


@pytest.mark.usefixtures("argv")
def test_header_lists_only_the_parallelism_a_script_passes() -> None:
    threads_only = "\n".join(header(time.perf_counter(), "0.0, 0.0, 0.0", threads=2))
    assert "; 2 torch thread(s)\n" in threads_only and "worker" not in threads_only
    neither = "\n".join(header(time.perf_counter(), "0.0, 0.0, 0.0"))
    assert "thread" not in neither and "worker" not in neither


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.usefixtures("argv")
def test_header_names_the_gpu() -> None:
    import torch

    device = header(time.perf_counter(), "0.0, 0.0, 0.0", cuda=True)[-2]
    assert device.startswith(f"- device: {torch.cuda.get_device_name()}, ") and f"CUDA {torch.version.cuda}" in device


def test_significance_is_the_95_percent_t_interval_of_the_paired_mean() -> None:
    from benchmarks.reporting import significance

    # t(0.975, df=4) = 2.7764 (printed t tables); mean 3, sd sqrt(2.5), n = 5.
    half = 2.7764 * 2.5**0.5 / 5**0.5
    assert significance([1, 2, 3, 4, 5]) == f"[{3 - half:.3f}, {3 + half:.3f}] yes"
    assert significance([1, -1, 1, -1, 1]).endswith(" no")  # mean 0.2, half-width 1.36
    assert significance([0.5]) == "– (1 seed)"
