"""A stand-in for a package SGLang imports but does not call on the CPU (scripts/sglang/cpu_site.py): any name
it is asked for is None, so a call would fail at once, naming it."""


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return None
