"""The foundation: errors, paths, params, the acceptance model, statistics, verdicts, the one writer."""
