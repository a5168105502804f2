"""A stand-in for torchvision (image inputs), which SGLang and transformers import but do not call for a text
model on the CPU (scripts/sglang/cpu_site.py): any name it is asked for is None."""

__version__ = "0.28.0"  # transformers reads it


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return None
