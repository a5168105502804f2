"""What a reader sees: the summary block, tables, plots, the run index and diffs."""
