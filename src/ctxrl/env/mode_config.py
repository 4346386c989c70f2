"""Typed config of the context-management modes other than file mode (``HarnessConfig.modes``).

One section per mode, plus the overflow store they share. Load overrides like every other field:
``load_config(HarnessConfig, None, ["modes.tools.max_pins=10", "modes.pressure.enabled=true"])``.

This module imports nothing from the harness, so :mod:`ctxrl.env.config` can hold it as a field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ctxrl.errors import ConfigError

Storage = Literal["disk", "memory-only"]
SummariserName = Literal["extractive", "engine"]


@dataclass(frozen=True)
class ToolsModeConfig:
    """Action-based context tools (seed 000): offer rules and the pin cap."""

    enabled: bool = True
    """Master switch: off means the context tools are never offered and a call to one is refused."""
    offer_pct: float = 0.45
    """Usage (fraction of the limit) from which the context tools are offered."""
    offer_round: int = 12
    """Round from which the tools are offered whatever the usage; 0 means usage (and asking) only."""
    offer_from_start: bool = False
    """Offer the context tools from the first prompt, their schemas in the tool list. Off: they are offered by
    the rules above and announced mid-episode by an appended note (the tool list, and so the prompt's prefix,
    stays as it was at reset)."""
    max_pins: int = 20
    """Pins the model may hold at once in one episode."""
    with_pressure: bool = True
    """Run the mid-turn pressure pass underneath, as seed 000 does: its tools sit on top of the automatic
    pass and add nothing to it or remove nothing from it. Off: the tools alone (``pressure.enabled`` still
    turns the pass on for every mode)."""

    def __post_init__(self) -> None:
        if not 0 <= self.offer_pct <= 1:
            raise ConfigError(f"offer_pct must be a fraction in [0, 1], not {self.offer_pct}")
        if self.offer_round < 0:
            raise ConfigError(f"offer_round must be >= 0 (0 = usage only), not {self.offer_round}")
        if self.max_pins < 0:
            raise ConfigError(f"max_pins must be >= 0, not {self.max_pins}")


@dataclass(frozen=True)
class UsageModeConfig:
    """Agent-managed context (seed 001): the usage block, eviction and the archive."""

    evict: bool = True
    """Grant ``evict_file_view`` (and the Top File Views list)."""
    archive: bool = True
    """Grant ``archive_thread`` and ``search_archive`` (together) and the turn headers on tool results."""
    threshold_pct: float = 75.0
    """How full the window must be (percent of the limit) before the usage block is shown; 0 = always."""
    top_file_views: int = 5
    """Files named under Top File Views, largest first."""
    locked_paths: tuple[str, ...] = ()
    """Workspace paths of locked specifications: their file views are never evicted or listed."""

    def __post_init__(self) -> None:
        if not 0 <= self.threshold_pct <= 100:
            raise ConfigError(f"threshold_pct must be in [0, 100], not {self.threshold_pct}")
        if self.top_file_views < 0:
            raise ConfigError(f"top_file_views must be >= 0, not {self.top_file_views}")


@dataclass(frozen=True)
class PressureConfig:
    """The mid-turn pressure pass: spill old and oversized results, fold history at the soft ceiling."""

    enabled: bool = False
    """Run the pass underneath the file, tools and usage modes too (harness mode always runs it)."""
    keep_rounds: int = 4
    """Results of the last this many rounds are not spilled for age, and not folded."""
    spill_chars: int = 8000
    """A result at least this long is spilled whatever its age."""
    compact_pct: float = 0.8
    """The soft ceiling (fraction of the limit) at which history folds into a summary."""
    summary_chars: int = 2000
    """Most characters of one fold summary."""
    summariser: SummariserName = "extractive"
    """``extractive`` (deterministic, no model) or ``engine`` (calls the generation engine given to the mode)."""

    def __post_init__(self) -> None:
        if self.keep_rounds < 0:
            raise ConfigError(f"keep_rounds must be >= 0, not {self.keep_rounds}")
        if self.spill_chars < 600:
            raise ConfigError(
                f"spill_chars must be >= 600 (results under 600 characters are never spilled), "
                f"not {self.spill_chars}"
            )
        if not 0 < self.compact_pct <= 1:
            raise ConfigError(f"compact_pct must be a fraction in (0, 1], not {self.compact_pct}")
        if self.summary_chars < 200:
            raise ConfigError(f"summary_chars must be >= 200, not {self.summary_chars}")


@dataclass(frozen=True)
class ModesConfig:
    """Settings of the tools, usage, harness and append modes and of the overflow store they share."""

    tools: ToolsModeConfig = field(default_factory=ToolsModeConfig)
    """Action-based context tools (``tools`` mode)."""
    usage: UsageModeConfig = field(default_factory=UsageModeConfig)
    """Agent-managed context (``usage`` mode)."""
    pressure: PressureConfig = field(default_factory=PressureConfig)
    """The pressure pass (``harness`` mode, and underneath other modes when enabled)."""
    storage: Storage = "disk"
    """``disk`` keeps dropped bodies restorable; ``memory-only`` writes nothing and says so in every stub."""
    overflow_dir: str | None = None
    """Folder of the overflow store (one subfolder per workspace); None puts it beside the workspace, as
    ``<workspace>.overflow``. Either way it is outside the workspace, so no command can read or alter it."""
