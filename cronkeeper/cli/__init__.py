"""The command line: one module per command; callbacks parse, call a function, render."""
