"""A stand-in for torchvision.transforms (scripts/sglang/cpu_site.py): transformers reads InterpolationMode's names
at import; any other name is None."""


class InterpolationMode:
    NEAREST = 0
    NEAREST_EXACT = 0
    LANCZOS = 1
    BILINEAR = 2
    BICUBIC = 3
    BOX = 4
    HAMMING = 5


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return None
