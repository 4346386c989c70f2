"""Preload tcmalloc and Intel OpenMP into the commands that start engines, as vLLM's CPU guide says.

vLLM's CPU installation guide (section "set LD_PRELOAD") asks for ``libtcmalloc_minimal`` (Debian's
``libtcmalloc-minimal4``, which ``scripts/setup.sh`` installs when it can) and Intel OpenMP's
``libiomp5.so`` (the ``intel-openmp`` wheel puts it in the environment's ``lib/``) to be preloaded; on the
reference machine ``ctxrl bench rollout`` runs both engines about 16 % faster with them (the bench prints
both figures). A library given in ``LD_PRELOAD`` only takes effect when the process starts, so a command
that starts an engine re-executes itself once, early, with ``LD_PRELOAD`` set (:func:`maybe_reexec`, called
by :mod:`ctxrl.cli`). The rules (:func:`preload_plan`):

- only the commands in :data:`ENGINE_COMMANDS`, and only a process started as the ``ctxrl`` command (not a
  ``main([...])`` call inside another program, such as a test session);
- ``CTXRL_PRELOAD=0`` turns it off;
- an ``LD_PRELOAD`` the user set is left as it is;
- the marker ``CTXRL_PRELOADED`` in the environment means "already re-executed": never a second time;
- only libraries that exist are preloaded; with none found nothing happens (engines run, just slower).

This module imports only the standard library: it runs before the subcommand's heavy imports.
"""

from __future__ import annotations

import os
import platform
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from pathlib import Path

TCMALLOC_NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc_minimal.so")
"""tcmalloc's file names, preferred first (Debian ships the ``.so.4``; the unversioned link needs ``-dev``)."""
IOMP_NAME = "libiomp5.so"
MARKER = "CTXRL_PRELOADED"
"""Set in the re-executed process: it must not re-execute again."""
SWITCH = "CTXRL_PRELOAD"
"""``0`` turns preloading off."""
ENGINE_COMMANDS = frozenset({"quickstart", "rollout", "eval", "train", "sft", "evolve", "export", "bench"})
"""Subcommands that start (or may start) a vLLM or transformers engine. ``bench`` is one since 2026-12-06, so
its engines and trainers run as ``train`` and ``sft`` run them (before, only the rollout bench's children had
the preload); the rollout bench still starts one child with and one without it, each with an environment of
its own, to show both figures."""


def system_lib_dirs() -> list[Path]:
    """Where the system's shared libraries lie (Debian's multiarch folder first)."""
    arch = sysconfig.get_config_var("MULTIARCH") or f"{platform.machine()}-linux-gnu"
    return [Path(p) for p in (f"/usr/lib/{arch}", f"/lib/{arch}", "/usr/lib64", "/usr/lib", "/usr/local/lib")]


def prefix_lib_dirs() -> list[Path]:
    """The Python environment's ``lib/`` folders (the venv's, then the base installation's or conda's)."""
    return list(dict.fromkeys(Path(p) / "lib" for p in (sys.prefix, sys.base_prefix)))


def find_libraries(
    lib_dirs: Sequence[Path] | None = None, prefix_dirs: Sequence[Path] | None = None
) -> list[Path]:
    """The libraries to preload that exist: tcmalloc from ``lib_dirs`` (default :func:`system_lib_dirs`,
    then the environment's ``lib/``), then ``libiomp5.so`` from ``prefix_dirs`` (default
    :func:`prefix_lib_dirs`). Empty when neither is found."""
    prefix_dirs = prefix_lib_dirs() if prefix_dirs is None else list(prefix_dirs)
    lib_dirs = [*system_lib_dirs(), *prefix_dirs] if lib_dirs is None else list(lib_dirs)
    tcmalloc = next((d / n for d in lib_dirs for n in TCMALLOC_NAMES if (d / n).is_file()), None)
    iomp = next((d / IOMP_NAME for d in prefix_dirs if (d / IOMP_NAME).is_file()), None)
    return [p for p in (tcmalloc, iomp) if p is not None]


def preload_plan(environ: Mapping[str, str], libraries: Sequence[Path]) -> str | None:
    """The ``LD_PRELOAD`` value to re-execute with, or None to run as is (see the module's rules)."""
    if environ.get(MARKER) or environ.get(SWITCH, "1").strip() == "0" or environ.get("LD_PRELOAD"):
        return None
    if not libraries:
        return None
    return ":".join(str(p) for p in libraries)


def with_preload(environ: Mapping[str, str], libraries: Sequence[Path]) -> dict[str, str]:
    """A copy of ``environ`` that preloads exactly ``libraries`` and carries the marker."""
    return {**environ, "LD_PRELOAD": ":".join(str(p) for p in libraries), MARKER: "1"}


def without_preload(environ: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``environ`` with no ``LD_PRELOAD`` and preloading switched off (for a comparison run)."""
    env = {k: v for k, v in environ.items() if k not in ("LD_PRELOAD", MARKER)}
    env[SWITCH] = "0"
    return env


def loaded_libraries(names: Sequence[str] = ("libtcmalloc", "libiomp5")) -> list[str]:
    """Which of ``names`` this process has mapped (from ``/proc/self/maps``; empty where that is missing)."""
    try:
        maps = Path("/proc/self/maps").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return [name for name in names if name in maps]


def maybe_reexec(command: str, environ: Mapping[str, str] | None = None) -> None:
    """Re-execute this process with the preload when :func:`preload_plan` says so; return otherwise.

    The new process runs the same interpreter with the same command line (``sys.orig_argv``: the console
    script or ``-m ctxrl.cli`` alike), the same PID and open files. If the exec itself fails, the command
    continues without the preload.
    """
    if command not in ENGINE_COMMANDS:
        return
    environ = os.environ if environ is None else environ
    value = preload_plan(environ, find_libraries())
    if value is None:
        return
    env = {**environ, "LD_PRELOAD": value, MARKER: "1"}
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
    except OSError:
        return
