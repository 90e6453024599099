"""gatelab.host: what the program and the machine it runs on are."""

from __future__ import annotations

import pytest
import torch

from gatelab import host


def test_a_programs_start_is_its_first_import_of_gatelab_not_the_process_that_became_it(tmp_path):
    """Under `bash -c 'sleep ... && gatelab ...'` bash execs gatelab in its own process: time/import_s counted the
    sleep (pip, in the issue). The same exec here: a process that sleeps 3 s, then becomes Python."""
    import subprocess
    import sys

    program = "import gatelab.host as h; print(h.seconds_since_start())"
    result = subprocess.run(["bash", "-c", f"sleep 3 && exec {sys.executable} -c '{program}'"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert 0 <= float(result.stdout) < 2.5  # the 3 s before Python are not the program's


# --- the precision `auto` picks on a GPU ----------------------------------------------------------------------------


def _emulating_bf16_supported(native: bool):
    """torch's `is_bf16_supported` as torch 2.5 on has it: with emulation counted unless told otherwise."""
    return lambda including_emulation=True: native or including_emulation


@pytest.mark.parametrize(("native", "expected"), [(True, "bf16-mixed"), (False, "16-mixed")])
def test_auto_precision_on_a_gpu_is_bf16_only_where_bf16_is_native(monkeypatch, native, expected):
    """On a V100 or T4 CUDA emulates bf16 in fp32 and `is_bf16_supported()` still says yes: fp16 there."""

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", _emulating_bf16_supported(native))
    assert host.resolve_precision("auto", "auto") == expected
    assert host.resolve_precision("auto", "gpu", moe=True) == expected
    assert host.resolve_precision("32-true", "gpu") == "32-true"  # as the user set it


@pytest.mark.parametrize(("capability", "expected"), [((7, 0), "16-mixed"), ((7, 5), "16-mixed"),
                                                      ((8, 0), "bf16-mixed"), ((9, 0), "bf16-mixed")])
def test_where_torch_cannot_leave_emulation_out_the_compute_capability_decides(monkeypatch, capability, expected):

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)  # no `including_emulation`: emulation counts
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.version, "hip", None)
    assert host.resolve_precision("auto", "auto") == expected


def test_a_wheel_install_run_from_a_checkout_finds_the_checkout_s_sweeps_and_presets(tmp_path, monkeypatch):
    # a GPU machine installs the checkout as a wheel (site-packages has no experiments/) and runs from the checkout
    site_packages = tmp_path / "site-packages"
    (site_packages / "gatelab").mkdir(parents=True)
    checkout = tmp_path / "checkout"
    for folder in ("experiments", "sweeps"):
        (checkout / folder).mkdir(parents=True)
    (checkout / "pyproject.toml").write_text("")
    monkeypatch.setattr(host, "__file__", str(site_packages / "gatelab" / "host.py"))
    monkeypatch.chdir(checkout)
    assert host.repo_root() == checkout.resolve()
    monkeypatch.chdir(tmp_path)  # not a checkout: the folder above the package, as before
    assert host.repo_root() == site_packages.resolve()


def test_two_machines_under_one_host_name_are_told_apart(monkeypatch):
    """repro-matched-confirm ran on an AMD EPYC and on Intel Xeons, every run tagged host "vm": their step times were
    one machine's to the table's step-time ratio and to `sweep plan`. The host tag now names the CPU and the cores."""
    monkeypatch.setattr(host.socket, "gethostname", lambda: "vm")
    monkeypatch.setattr(host.os, "sched_getaffinity", lambda _pid: {0, 1}, raising=False)
    names = {}
    for model in ("AMD EPYC 9R14", "Intel(R) Xeon(R) Processor", "Intel(R) Xeon(R) Processor"):
        monkeypatch.setattr(host, "cpu_info", lambda model=model: f"model name\t: {model}\n")
        names[model] = host.machine_name()
    assert names == {"AMD EPYC 9R14": "vm (AMD EPYC 9R14, 2 cores)",
                     "Intel(R) Xeon(R) Processor": "vm (Intel(R) Xeon(R) Processor, 2 cores)"}
    monkeypatch.setattr(host.os, "sched_getaffinity", lambda _pid: set(range(16)), raising=False)
    assert host.machine_name() == "vm (Intel(R) Xeon(R) Processor, 16 cores)"  # another share of the machine
    monkeypatch.setattr(host, "cpu_info", lambda: "model name\t: O'Brien CPU\n")
    assert "'" not in host.machine_name()  # it is quoted in the plan's MLflow search
