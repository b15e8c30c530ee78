"""Mink inside other people's tests: fault injection (`proxy`) and, later, the harness
(pytest plugin, trio API). Importing this package imports only trio and the stdlib."""
