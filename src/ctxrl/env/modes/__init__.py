"""The context-management modes of the one harness, in one registry: :data:`MODES`.

| name      | who manages the context | module |
|-----------|-------------------------|--------|
| `file`    | the model, editing the context file with shell tools (seed 002) | :mod:`.file` |
| `tools`   | the model, through fixed context tools (seed 000) | :mod:`.tools` |
| `usage`   | the model, from a usage signal, with eviction and an archive (seed 001) | :mod:`.usage` |
| `harness` | the harness: the pressure pass spills and folds | :mod:`.pressure`, :mod:`.baselines` |
| `append`  | nobody: the context only grows, and overflowing it fails the episode | :mod:`.baselines` |

Each :class:`ModeSpec` says everything the rest of ctxrl needs to know about a mode: its name (the mode
class's own ``name``, written once there), how to build
it, its default skill, the tools whose calls edit the context (their tokens are edit tokens), the budget
features it uses, and the scripted reference policy that acts in it. Nothing else in ``src/`` lists the
modes; adding one is one entry here (and its module).

Settings come from ``HarnessConfig.modes`` (:class:`ctxrl.env.mode_config.ModesConfig`). With
``modes.pressure.enabled`` the pressure pass also runs underneath the file, tools and usage modes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from ctxrl.env import skills
from ctxrl.env.budget import BudgetFeatures
from ctxrl.env.config import HarnessConfig
from ctxrl.env.mode_config import ModesConfig, PressureConfig
from ctxrl.env.modes.base import Mode, StepNotes
from ctxrl.env.modes.baselines import AppendMode, HarnessMode
from ctxrl.env.modes.file import ManagedFileMode
from ctxrl.env.modes.pressure import EngineSummariser, PressurePass, extractive_summary
from ctxrl.env.modes.tools import CONTEXT_TOOLS, ToolsMode
from ctxrl.env.modes.usage import UsageMode
from ctxrl.errors import ConfigError

Generate = Callable[[str], str]
"""``generate(prompt_text) -> text``: the engine the ``engine`` summariser of the pressure pass calls."""


@dataclass(frozen=True)
class ModeSpec:
    """One entry of the registry."""

    name: str
    summary: str
    """Who manages the context, in a few words (for help texts and tables)."""
    build: Callable[[ModesConfig, PressurePass], Mode]
    """``build(modes_config, pressure_pass) -> Mode``; the pass is passed whatever the mode does with it."""
    skill: str
    """The default skill: the markdown in the system prompt that steers context management."""
    edit_tools: frozenset[str]
    """The mode's own tools whose calls edit the context (file mode: none; its edits are shell commands on
    the context file, recognised by their receipts)."""
    budget: BudgetFeatures
    """The budget machinery the mode's seed uses (the mode class's ``budget``, written once there)."""
    policy: str
    """The scripted reference policy that acts in this mode (:mod:`ctxrl.env.policies`)."""


def _file(modes: ModesConfig, pressure: PressurePass) -> Mode:
    return ManagedFileMode(modes, pressure if modes.pressure.enabled else None)


def _tools(modes: ModesConfig, pressure: PressurePass) -> Mode:
    return ToolsMode(modes, pressure if modes.tools.with_pressure or modes.pressure.enabled else None)


def _usage(modes: ModesConfig, pressure: PressurePass) -> Mode:
    if modes.pressure.enabled:
        return UsageMode(modes, pressure)
    if modes.usage.compaction:  # seed 001's backstop: history folds when the window is full; nothing spills
        backstop = replace(modes.pressure, spill=False, compact_pct=1.0)
        return UsageMode(modes, PressurePass(backstop, pressure.summariser))
    return UsageMode(modes, None)


def _harness(modes: ModesConfig, pressure: PressurePass) -> Mode:
    return HarnessMode(modes, pressure)


def _append(modes: ModesConfig, pressure: PressurePass) -> Mode:
    return AppendMode()


_SPECS = (
    ModeSpec(
        ManagedFileMode.name,
        "the model, editing the context file with shell tools",
        _file,
        skills.FILE_SKILL,
        frozenset(),
        ManagedFileMode.budget,
        "file-manager",
    ),
    ModeSpec(
        ToolsMode.name,
        "the model, through fixed context tools",
        _tools,
        skills.TOOLS_SKILL,
        frozenset(CONTEXT_TOOLS) - {"context_status"},
        ToolsMode.budget,
        "tools-manager",
    ),
    ModeSpec(
        UsageMode.name,
        "the model, from a usage signal, with eviction and an archive",
        _usage,
        skills.USAGE_SKILL,
        frozenset({"evict_file_view", "archive_thread"}),
        UsageMode.budget,
        "usage-manager",
    ),
    ModeSpec(
        HarnessMode.name,
        "the harness: scheduled spill and fold",
        _harness,
        skills.HARNESS_SKILL,
        frozenset(),
        HarnessMode.budget,
        "harness",
    ),
    ModeSpec(
        AppendMode.name,
        "nobody: append-only, fails on overflow",
        _append,
        skills.APPEND_SKILL,
        frozenset(),
        AppendMode.budget,
        "append",
    ),
)

MODES: dict[str, ModeSpec] = {spec.name: spec for spec in _SPECS}
"""Every mode, by name, in the order tables show them."""
MODE_NAMES: tuple[str, ...] = tuple(MODES)
DEFAULT_MODE: str = ManagedFileMode.name
"""The mode a run uses unless told: the most general design, the context as an editable file."""

EDIT_TOOLS: frozenset[str] = frozenset().union(*(spec.edit_tools for spec in _SPECS))
"""Every mode's context-editing tools (tool names are unique across modes)."""


def mode_spec(name: str) -> ModeSpec:
    """The registry entry of ``name``; ConfigError naming the valid modes otherwise."""
    try:
        return MODES[name]
    except KeyError:
        raise ConfigError(f"unknown mode {name!r}; modes: {', '.join(MODES)}") from None


def default_skill(name: str) -> str:
    """The default skill of mode ``name``."""
    return mode_spec(name).skill


def make_pressure(config: PressureConfig, generate: Generate | None = None) -> PressurePass:
    """The pressure pass with the configured summariser (``engine`` needs ``generate``)."""
    if config.summariser == "engine":
        if generate is None:
            raise ConfigError(
                "modes.pressure.summariser is 'engine' but no generate callable was given to make_mode; "
                "pass generate=... or set modes.pressure.summariser=extractive"
            )
        return PressurePass(config, EngineSummariser(generate, config.summary_chars))
    return PressurePass(config)


def make_mode(name: str, config: HarnessConfig | ModesConfig, *, generate: Generate | None = None) -> Mode:
    """The mode called ``name`` (a key of :data:`MODES`), set up from ``config`` (its ``modes`` section).

    ``generate(prompt_text) -> str`` is the generation engine the ``engine`` summariser calls.
    """
    spec = mode_spec(name)
    modes = config.modes if isinstance(config, HarnessConfig) else config
    return spec.build(modes, make_pressure(modes.pressure, generate))


__all__ = [
    "DEFAULT_MODE",
    "EDIT_TOOLS",
    "MODES",
    "MODE_NAMES",
    "AppendMode",
    "BudgetFeatures",
    "EngineSummariser",
    "HarnessMode",
    "ManagedFileMode",
    "Mode",
    "ModeSpec",
    "PressurePass",
    "StepNotes",
    "ToolsMode",
    "UsageMode",
    "default_skill",
    "extractive_summary",
    "make_mode",
    "make_pressure",
    "mode_spec",
]
