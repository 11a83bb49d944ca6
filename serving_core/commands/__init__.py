"""The command line: one module per ``serving-core`` verb that needs more than a few lines."""
