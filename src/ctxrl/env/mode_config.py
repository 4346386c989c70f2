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
    compaction: bool = True
    """The seed's automatic backstop: when the window is full (the limit; the signal threshold is a share of
    the same figure), older history folds into a summary (the pressure pass's fold with its kept rounds; no
    result is spilled, so eviction stays the model's). Off: nothing stops an overflow, which fails."""

    def __post_init__(self) -> None:
        if not 0 <= self.threshold_pct <= 100:
            raise ConfigError(f"threshold_pct must be in [0, 100], not {self.threshold_pct}")
        if self.top_file_views < 0:
            raise ConfigError(f"top_file_views must be >= 0, not {self.top_file_views}")


@dataclass(frozen=True)
class PressureSizing:
    """The pressure pass's thresholds for one episode: :meth:`PressureConfig.sizing` of its limit."""

    spill_chars: int
    """A result at least this many characters long is spilled whatever its age."""
    keep_rounds: int | None
    """Rounds kept from age spill and folding; None: as many of the newest as fit in ``keep_tokens``."""
    keep_tokens: int
    """Token window of the newest rounds kept when ``keep_rounds`` is None (the newest round always stays)."""
    summary_chars: int
    """Most characters of one fold summary."""


@dataclass(frozen=True)
class PressureConfig:
    """The mid-turn pressure pass: spill old and oversized results, fold history at the soft ceiling.

    **Sizing.** ``spill_chars``, ``keep_rounds`` and ``summary_chars`` default to None: sized to the
    episode's limit (``HarnessConfig.limit``, budget − reserve, in tokens) by :meth:`sizing`, so the pass
    keeps the same proportions on a 4k-token window as on a 32k one. Characters are converted from tokens
    with the chars/token that the episode's token counter measures on the task text. The rule:

    - ``spill_chars = max(600, round(spill_pct × limit × chars_per_token))``: a result that alone takes
      ``spill_pct`` of the limit is spilled at once (with the default 0.4 and the soft ceiling at 0.8, two
      such results could not both sit under it); anything smaller is shown to the model at least once.
    - kept rounds: the newest rounds (an assistant turn with its results), newest first, while together
      they take at most ``keep_pct × limit`` tokens; the newest round always stays. With the defaults
      (``keep_pct`` 0.4, ``summary_pct`` 0.1, soft ceiling 0.8) a fold leaves the prefix (up to about 0.3 of
      the limit in the built-in tasks), one summary and the kept rounds under the ceiling.
    - ``summary_chars = max(200, round(summary_pct × limit × chars_per_token))``.

    An explicit value of any of the three wins over the rule.
    """

    enabled: bool = False
    """Run the pass underneath the file, tools and usage modes too (harness mode always runs it)."""
    spill: bool = True
    """Spill old and oversized results; False leaves only the fold (usage mode's compaction backstop)."""
    keep_rounds: int | None = None
    """Results of the last this many rounds are not spilled for age, and not folded; None: the newest rounds
    that fit in ``keep_pct`` of the limit (see the class docstring)."""
    keep_pct: float = 0.4
    """With ``keep_rounds`` None: the token window (fraction of the limit) of the rounds kept."""
    spill_chars: int | None = None
    """A result at least this long is spilled whatever its age; None: ``spill_pct`` of the limit, in
    characters."""
    spill_pct: float = 0.4
    """With ``spill_chars`` None: the share of the limit from which a single result is spilled at once."""
    compact_pct: float = 0.8
    """The soft ceiling (fraction of the limit) at which history folds into a summary."""
    summary_chars: int | None = None
    """Most characters of one fold summary; None: ``summary_pct`` of the limit, in characters."""
    summary_pct: float = 0.1
    """With ``summary_chars`` None: the share of the limit one fold summary may take."""
    summariser: SummariserName = "extractive"
    """``extractive`` (deterministic, no model) or ``engine`` (the policy's generation engine writes the summary;
    a failure falls back to the extractive one, recorded in the pressure event)."""

    def __post_init__(self) -> None:
        if self.keep_rounds is not None and self.keep_rounds < 0:
            raise ConfigError(
                f"keep_rounds must be >= 0 (or null: sized to the limit), not {self.keep_rounds}"
            )
        if self.spill_chars is not None and self.spill_chars < 600:
            raise ConfigError(
                f"spill_chars must be >= 600 (results under 600 characters are never spilled) or null "
                f"(sized to the limit), not {self.spill_chars}"
            )
        if not 0 < self.compact_pct <= 1:
            raise ConfigError(f"compact_pct must be a fraction in (0, 1], not {self.compact_pct}")
        if self.summary_chars is not None and self.summary_chars < 200:
            raise ConfigError(
                f"summary_chars must be >= 200 (or null: sized to the limit), not {self.summary_chars}"
            )
        for name in ("keep_pct", "spill_pct", "summary_pct"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ConfigError(f"{name} must be a fraction in (0, 1], not {value}")

    def sizing(self, limit: int, chars_per_token: float) -> PressureSizing:
        """The thresholds for an episode whose limit is ``limit`` tokens, its text ``chars_per_token``
        characters per token (see the class docstring; explicit values are kept)."""
        if limit < 1 or chars_per_token <= 0:
            raise ConfigError(
                f"sizing needs a positive limit and chars/token, not {limit} and {chars_per_token}"
            )
        spill = self.spill_chars
        if spill is None:
            spill = max(600, round(self.spill_pct * limit * chars_per_token))
        summary = self.summary_chars
        if summary is None:
            summary = max(200, round(self.summary_pct * limit * chars_per_token))
        return PressureSizing(spill, self.keep_rounds, max(1, round(self.keep_pct * limit)), summary)


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
