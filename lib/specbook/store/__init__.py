"""The run folder: its manifest, its saved frames and logs, the machine's fingerprint."""
