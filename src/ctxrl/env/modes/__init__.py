"""The context-management modes of the one harness, and :func:`make_mode`, which builds one by name.

| name      | who manages the context | module |
|-----------|-------------------------|--------|
| `file`    | the model, editing the context file with shell tools | :mod:`ctxrl.env.harness` (+ :mod:`.baselines`) |
| `tools`   | the model, through fixed context tools (seed 000) | :mod:`.tools` |
| `usage`   | the model, from a usage signal, with eviction and an archive (seed 001) | :mod:`.usage` |
| `harness` | the harness: the pressure pass spills and folds | :mod:`.pressure`, :mod:`.baselines` |
| `append`  | nobody: the context only grows, and overflowing it fails the episode | :mod:`.baselines` |

Settings come from ``HarnessConfig.modes`` (:class:`ctxrl.env.mode_config.ModesConfig`). With
``modes.pressure.enabled`` the pressure pass also runs underneath the file, tools and usage modes.
"""

from __future__ import annotations

from collections.abc import Callable

from ctxrl.env.config import HarnessConfig
from ctxrl.env.harness import Mode
from ctxrl.env.mode_config import ModesConfig, PressureConfig
from ctxrl.env.modes.baselines import AppendMode, HarnessMode, ManagedFileMode
from ctxrl.env.modes.common import StepNotes
from ctxrl.env.modes.pressure import EngineSummariser, PressurePass, extractive_summary
from ctxrl.env.modes.tools import ToolsMode
from ctxrl.env.modes.usage import UsageMode
from ctxrl.errors import ConfigError

MODE_NAMES = ("file", "tools", "usage", "harness", "append")

__all__ = [
    "MODE_NAMES",
    "AppendMode",
    "EngineSummariser",
    "HarnessMode",
    "ManagedFileMode",
    "PressurePass",
    "StepNotes",
    "ToolsMode",
    "UsageMode",
    "extractive_summary",
    "make_mode",
    "make_pressure",
]


def make_pressure(config: PressureConfig, generate: Callable[[str], str] | None = None) -> PressurePass:
    """The pressure pass with the configured summariser (``engine`` needs ``generate``)."""
    if config.summariser == "engine":
        if generate is None:
            raise ConfigError(
                "modes.pressure.summariser is 'engine' but no generate callable was given to make_mode; "
                "pass generate=... or set modes.pressure.summariser=extractive"
            )
        return PressurePass(config, EngineSummariser(generate, config.summary_chars))
    return PressurePass(config)


def make_mode(
    name: str, config: HarnessConfig | ModesConfig, *, generate: Callable[[str], str] | None = None
) -> Mode:
    """The mode called ``name`` (one of :data:`MODE_NAMES`), set up from ``config`` (its ``modes`` section).

    ``generate(prompt_text) -> str`` is the generation engine the ``engine`` summariser calls.
    """
    modes = config.modes if isinstance(config, HarnessConfig) else config
    pressure = make_pressure(modes.pressure, generate)
    underneath = pressure if modes.pressure.enabled else None
    if name == "file":
        return ManagedFileMode(modes, underneath)
    if name == "tools":
        return ToolsMode(modes, pressure if modes.tools.with_pressure else underneath)
    if name == "usage":
        return UsageMode(modes, underneath)
    if name == "harness":
        return HarnessMode(modes, pressure)
    if name == "append":
        return AppendMode()
    raise ConfigError(f"unknown mode {name!r}; modes: {', '.join(MODE_NAMES)}")
