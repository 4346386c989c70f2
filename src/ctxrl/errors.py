"""User-facing errors.

Everything a user can cause (a bad path, a broken config, an unreachable server) raises a subclass of
:class:`CtxrlError` with a message that names what is wrong and how to fix it. The CLI prints the message
on one line and exits 1; it never shows a traceback for these. ``assert`` is kept for internal invariants.
"""

from __future__ import annotations


class CtxrlError(Exception):
    """Base class of every error a user can cause and fix."""


class ConfigError(CtxrlError):
    """A config file or value is invalid (unknown key, wrong type, out of range)."""


class UsageError(CtxrlError):
    """A command was called in a way that cannot work (e.g. a non-empty output folder without --force)."""


class ModelLoadError(CtxrlError):
    """A model or tokenizer folder cannot be loaded as a causal LM."""


class EngineError(CtxrlError):
    """A generation engine failed to start or answer (unreachable server, prompt too long)."""


class SandboxError(CtxrlError):
    """No working command sandbox (bubblewrap or unshare missing or refused); install one or set backend none."""


class TaskError(CtxrlError):
    """A task is invalid or cannot be made: unknown family, seed outside its split, malformed task file."""


class BenchError(CtxrlError):
    """A benchmark could not measure what it claims to (e.g. the workload did not reach its size)."""
