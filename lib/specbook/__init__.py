"""specbook: a reproducible experiment book for speculative-decoding serving engineers."""

__version__ = "0.1.0"
