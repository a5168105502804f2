"""A stand-in for sglang-kernel (SGLang's CUDA kernels), which SGLang imports but does not call on the CPU
(scripts/sglang/cpu_site.py): any name it is asked for is None, so a call would fail at once, naming it."""

__version__ = "0.4.4"  # the sglang-kernel SGLang 0.5.15.post1 pins


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return None
