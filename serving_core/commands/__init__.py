"""The command line: ``cli`` parses and dispatches; one module per ``serving-core`` verb."""
