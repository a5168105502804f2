"""vLLM (CPU and CUDA builds): the adapter, its launcher module, its log parser, start-up facts and /metrics counters."""

from specbook.engines.vllm.adapter import CLI_MODULE, VllmEngine, is_cpu_build

__all__ = ["CLI_MODULE", "VllmEngine", "is_cpu_build"]
