"""Implementations of ``ctxrl`` subcommands; each module is imported only when its subcommand runs."""
