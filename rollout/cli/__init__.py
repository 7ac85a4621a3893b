"""The command line: argv -> options, and the only layer that prints."""
