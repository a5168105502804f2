"""vLLM (CPU and CUDA builds): the adapter, its CLI shim, its log parser, start-up facts and /metrics counters."""

from specbook.engines.vllm.adapter import VllmEngine, cli_module, is_cpu_build

__all__ = ["VllmEngine", "cli_module", "is_cpu_build"]
