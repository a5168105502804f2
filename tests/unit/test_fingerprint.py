"""specbook.store.fingerprint: the git checkout, library versions and the hardware a run ran on."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pandas as pd
import pytest

from specbook.core.errors import RunError
from specbook.core.versions import torch_cuda_version
from specbook.store.fingerprint import (
    GIT_DIRTY_ENV,
    GIT_SHA_ENV,
    cpu_fingerprint,
    cuda_version_text,
    git_info,
    hardware_fingerprint,
    library_versions,
    nvml_cuda_driver_version,
    parse_lscpu,
    parse_nvidia_smi_csv,
)
from specbook.store.manifest import GitInfo

# --------------------------------------------------------------------------------------------------
# git


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_git_sha_and_dirty_flag_in_a_real_repo(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    assert git_info(repo).sha == "unknown" and git_info(repo).short_sha == "nosha"  # no commit yet

    (repo / "a.txt").write_text("one\n")
    (repo / ".gitignore").write_text("outputs/\n")
    _git(repo, "add", "a.txt", ".gitignore")
    _git(repo, "commit", "-q", "-m", "first")
    head = _git(repo, "rev-parse", "HEAD")

    clean = git_info(repo / ".")
    assert clean.sha == head and clean.short_sha == head[:7]
    assert clean.dirty is False
    assert Path(clean.root).resolve() == repo.resolve()

    (repo / "outputs").mkdir()
    (repo / "outputs" / "run.txt").write_text("ignored\n")
    assert git_info(repo).dirty is False  # ignored run folders do not dirty the checkout

    (repo / "a.txt").write_text("two\n")
    assert git_info(repo).dirty is True
    _git(repo, "checkout", "-q", "a.txt")
    (repo / "new_notebook.ipynb").write_text("{}")
    assert git_info(repo).dirty is True  # an uncommitted new file changes what a run does


def test_git_outside_a_repo_is_unknown(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    monkeypatch.delenv(GIT_SHA_ENV, raising=False)
    info = git_info(tmp_path)
    assert info == GitInfo(sha="unknown", short_sha="nogit", dirty="unknown", root=None)


def test_git_outside_a_repo_takes_the_commit_the_sender_names(tmp_path, monkeypatch):
    """A tree copied to a GPU host has no .git: the commit comes from $SPECBOOK_GIT_SHA, dirty stays unknown."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    monkeypatch.setenv(GIT_SHA_ENV, "9e589a0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a")
    info = git_info(tmp_path)
    assert (info.sha, info.short_sha, info.dirty) == ("9e589a0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a", "9e589a0", "unknown")
    monkeypatch.setenv(GIT_SHA_ENV, "not a sha; rm -rf")
    assert git_info(tmp_path).sha == "unknown"


def test_git_outside_a_repo_takes_the_dirty_flag_the_sender_vouches_for(tmp_path, monkeypatch):
    """scripts/h200/book.sh runs a `git archive` export of the commit it names: it says the copy is clean."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    monkeypatch.setenv(GIT_SHA_ENV, "9e589a0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a")
    for raw, dirty in (("0", False), ("clean", False), ("False", False), ("1", True), ("dirty", True), ("", "unknown")):
        monkeypatch.setenv(GIT_DIRTY_ENV, raw)
        assert git_info(tmp_path).dirty == dirty, raw
    monkeypatch.setenv(GIT_DIRTY_ENV, "nope")
    with pytest.raises(RunError, match=r"SPECBOOK_GIT_DIRTY='nope'.*0.*1"):
        git_info(tmp_path)
    monkeypatch.delenv(GIT_SHA_ENV)  # no commit named: the flag alone says nothing
    monkeypatch.setenv(GIT_DIRTY_ENV, "0")
    assert git_info(tmp_path) == GitInfo()


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_the_dirty_flag_from_env_never_overrides_a_real_checkout(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.txt").write_text("one\n")
    _git(repo, "add", "a.txt")
    _git(repo, "commit", "-q", "-m", "first")
    (repo / "a.txt").write_text("two\n")
    monkeypatch.setenv(GIT_SHA_ENV, "9e589a0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a")
    monkeypatch.setenv(GIT_DIRTY_ENV, "0")
    info = git_info(repo)
    assert info.sha == _git(repo, "rev-parse", "HEAD") and info.dirty is True


# --------------------------------------------------------------------------------------------------
# versions and hardware


def test_library_versions_report_installed_and_absent():
    versions = library_versions(("pandas", "pydantic", "no-such-dist-specbook"))
    assert versions["pandas"] == pd.__version__
    assert re.match(r"\d+\.\d+", versions["pydantic"])
    assert versions["no-such-dist-specbook"] is None


# Verbatim from an H200 host (lscpu, first lines; nvidia-smi --query-gpu=... --format=csv,noheader).
LSCPU_H200_HOST = """\
Architecture:                            x86_64
CPU op-mode(s):                          32-bit, 64-bit
Address sizes:                           46 bits physical, 57 bits virtual
Byte Order:                              Little Endian
CPU(s):                                  16
On-line CPU(s) list:                     0-15
Vendor ID:                               GenuineIntel
Model name:                              Intel(R) Xeon(R) Processor
CPU family:                              6
Model:                                   207
Thread(s) per core:                      1
Core(s) per socket:                      16
Socket(s):                               1
Stepping:                                2
BogoMIPS:                                4200.00
Flags:                                   fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ss ht syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand hypervisor lahf_lm abm 3dnowprefetch cpuid_fault ssbd ibrs ibpb stibp ibrs_enhanced fsgsbase tsc_adjust bmi1 avx2 smep bmi2 erms invpcid avx512f avx512dq rdseed adx smap avx512ifma clflushopt clwb avx512cd sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves avx_vnni avx512_bf16 wbnoinvd arat avx512vbmi umip pku ospke avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni avx512_bitalg avx512_vpopcntdq rdpid bus_lock_detect cldemote movdiri movdir64b fsrm md_clear serialize tsxldtrk ibt amx_bf16 avx512_fp16 amx_tile amx_int8 flush_l1d arch_capabilities
Hypervisor vendor:                       KVM
Virtualization type:                     full
L1d cache:                               768 KiB (16 instances)
"""
NVIDIA_SMI_H200 = "NVIDIA H200, 580.159.04, 143771 MiB, 9.0, 00000000:00:06.0\n"


LSCPU_TWO_SOCKETS = """\
Architecture:                    x86_64
CPU(s):                          224
On-line CPU(s) list:             0-223
Vendor ID:                       GenuineIntel
Model name:                      Intel(R) Xeon(R) Platinum 8480+
Thread(s) per core:              2
Core(s) per socket:              56
Socket(s):                       2
NUMA node(s):                    2
Flags:                           fpu vme avx512f amx_tile amx_bf16 avx2
"""


def test_parse_lscpu_two_sockets():
    info = parse_lscpu(LSCPU_TWO_SOCKETS)
    assert info["model_name"] == "Intel(R) Xeon(R) Platinum 8480+"
    assert (info["threads"], info["cores"], info["sockets"], info["threads_per_core"]) == (224, 112, 2, 2)
    assert info["numa_nodes"] == 2 and info["flags_count"] == 6
    assert info["has_avx512"] and info["has_amx"]
    # the flags hash does not depend on the order lscpu prints them in
    shuffled = LSCPU_TWO_SOCKETS.replace(
        "fpu vme avx512f amx_tile amx_bf16 avx2", "avx2 amx_bf16 fpu vme avx512f amx_tile"
    )
    assert parse_lscpu(shuffled)["flags_sha256"] == info["flags_sha256"]



def test_flags_hash_is_the_one_older_manifests_hold():
    """Moving the hashing to specbook.core.digest did not change the recorded flags_sha256."""
    flags = "fpu vme avx512f amx_tile amx_bf16 avx2".split()
    legacy = hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:16]
    assert parse_lscpu(LSCPU_TWO_SOCKETS)["flags_sha256"] == legacy

@pytest.mark.skipif(shutil.which("lscpu") is None, reason="lscpu not installed")
def test_cpu_fingerprint_of_this_host_matches_the_os():
    info = cpu_fingerprint()
    assert info["threads"] == os.cpu_count()
    assert info["model_name"]
    assert info["flags_sha256"] and len(info["flags_sha256"]) == 16
    proc_flags = next(
        (
            ln.split(":", 1)[1].split()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("flags")
        ),
        None,
    )
    if proc_flags is not None:
        assert info["has_avx512"] == any(f.startswith("avx512") for f in proc_flags)


def test_parse_lscpu_of_a_gpu_host():
    info = parse_lscpu(LSCPU_H200_HOST)
    assert info["model_name"] == "Intel(R) Xeon(R) Processor" and info["vendor"] == "GenuineIntel"
    assert (info["threads"], info["cores"], info["sockets"], info["threads_per_core"]) == (16, 16, 1, 1)
    assert info["has_amx"] and info["has_avx512"]
    assert info["flags_sha256"] != parse_lscpu(LSCPU_TWO_SOCKETS)["flags_sha256"]


def test_parse_nvidia_smi_csv():
    (gpu,) = parse_nvidia_smi_csv(NVIDIA_SMI_H200)
    assert gpu == {
        "name": "NVIDIA H200",
        "driver_version": "580.159.04",
        "memory.total": "143771 MiB",
        "compute_cap": "9.0",
        "pci.bus_id": "00000000:00:06.0",
    }
    short = parse_nvidia_smi_csv(
        "NVIDIA H200, 580.159.04, 143771 MiB\n", ("name", "driver_version", "memory.total")
    )
    assert short == [{"name": "NVIDIA H200", "driver_version": "580.159.04", "memory.total": "143771 MiB"}]


def test_cuda_version_text_decodes_nvml_integers():
    # 1000 x major + 10 x minor: driver 580.159.04 (the H200 hosts) reports 13000
    assert [cuda_version_text(v) for v in (13000, 12080, 12040, 11020)] == ["13.0", "12.8", "12.4", "11.2"]


def test_nvml_cuda_driver_version_initialises_and_shuts_nvml_down(monkeypatch):
    class NVMLError(Exception):
        pass

    calls = []

    def fail():
        raise NVMLError("Driver Not Loaded")

    nvml = types.SimpleNamespace(NVMLError=NVMLError, nvmlInit=lambda: calls.append("init"),
                                 nvmlShutdown=lambda: calls.append("shutdown"),
                                 nvmlSystemGetCudaDriverVersion=lambda: 13000)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    assert nvml_cuda_driver_version() == "13.0" and calls == ["init", "shutdown"]
    nvml.nvmlSystemGetCudaDriverVersion = fail
    assert nvml_cuda_driver_version() is None and calls[-1] == "shutdown"
    nvml.nvmlInit = fail  # no driver: None, and no shutdown of what never started
    calls.clear()
    assert nvml_cuda_driver_version() is None and calls == []
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed
    assert nvml_cuda_driver_version() is None


def test_hardware_fingerprint_fields():
    hw = hardware_fingerprint()
    assert hw["cuda"]["torch"] == torch_cuda_version()
    if importlib.util.find_spec("pynvml") is None:
        assert hw["cuda"]["driver"] is None
    assert hw["hostname"] and hw["kernel"] == os.uname().release
    assert hw["memory_total_bytes"] > 0
    assert hw["cpu"]["threads"] == os.cpu_count()
    assert isinstance(hw["gpu"], dict)
    if shutil.which("nvidia-smi") is None and shutil.which("rocm-smi") is None:
        assert hw["gpu"] == {}
