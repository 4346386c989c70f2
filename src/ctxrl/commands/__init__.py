"""Implementations of the ``ctxrl`` subcommands; :mod:`ctxrl.cli` parses arguments and imports them lazily."""
