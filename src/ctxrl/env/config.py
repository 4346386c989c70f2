"""``HarnessConfig``: the one typed config of the context harness (budget, nudges, rollback, steps, gate).

Defaults are the published Context Language Models harness's (docs/seed_features.md). Load overrides
with ``ctxrl.config.load_config(HarnessConfig, None, ["budget=16000"])``, or as the ``harness`` section of
a run config (:mod:`ctxrl.commands.config`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ctxrl.env.mode_config import ModesConfig
from ctxrl.env.sandbox import SandboxConfig
from ctxrl.errors import ConfigError

Gate = Literal["fit", "shrink"]


@dataclass(frozen=True)
class HarnessConfig:
    """Budget, nudges, rollback, step limits, edit gate and sandbox of one episode."""

    budget: int = 32000
    """Context budget in tokens (pinned prefix + editable region + generation prompt)."""
    task_budget: bool = True
    """Size each episode from its task instead: the task's budget in the policy tokenizer's tokens
    (:meth:`Task.budget_for`), its step limit, and ``reserve`` and ``rollback_margin`` at most an eighth of
    that budget. False: ``budget`` and ``max_steps`` as given (the reference harness's 32k). Rollouts, evals,
    the export check and the Gymnasium env all apply it through :func:`ctxrl.env.episode.episode_config`."""
    readout: bool | None = None
    """Show the ``[context: n/limit tokens]`` readout on every tool result; None: the mode's own default
    (its seed's: on in file mode only; :class:`ctxrl.env.budget.BudgetFeatures`)."""
    nudges: bool | None = None
    """Tier and urgent nudges; None: the mode's own default (on in file mode only)."""
    rollback: bool | None = None
    """Roll the newest turns back on overflow (else the episode ends with ``overflow``); None: the mode's
    own default (on in file mode only; the other modes' backstop is their pressure pass, or nothing)."""
    reserve: int = 2048
    """Tokens kept free for the model's reply; the enforced limit is budget − reserve."""
    nudge_fractions: tuple[float, ...] = (0.25, 0.5, 0.75)
    """Fill levels (fractions of the budget) of the one-shot nudges; each re-arms once the context shrinks below it."""
    urgent_limit_fraction: float = 0.10
    """Urgent band floor: urgent while the room left is under this fraction of the limit (or the output rule)."""
    urgent_output_factor: float = 2.0
    """Urgent band from outputs: urgent while the room left is under this × the largest recent tool output."""
    urgent_recent_outputs: int = 3
    """How many of the latest tool outputs the urgent band looks at."""
    urgent_min_fill: float = 0.5
    """The urgent nudge never fires below this fraction of the limit."""
    rollback_margin: int = 2048
    """Tokens an overflow rollback frees below the limit (room for one compaction)."""
    rollback_retries: int = 50
    """Ignored rollbacks (no shrinking edit in between) tolerated before the final turn."""
    rollback_deepen_after: int = 3
    """The rollback margin doubles after every this many consecutive ignored rollbacks."""
    max_steps: int = 64
    """Task steps per episode; a free edit turn (context-only, silent, exit 0) does not count."""
    max_lm_calls: int | None = None
    """Model calls per episode, free edit turns included; None means 2 · max_steps + 24."""
    finalize_turns: int = 3
    """A finalize notice appears on every tool result while at most this many steps or calls are left."""
    gate: Gate = "fit"
    """Edit gate: ``fit`` allows growth while the result stays under the limit; ``shrink`` rejects any growth."""
    context_file: str = "context.md"
    """Name of the context file in the episode workspace (a plain file name)."""
    calibration_min: float = 0.8
    """Lowest accepted ratio engine-reported prompt tokens / locally counted tokens."""
    calibration_max: float = 1.25
    """Highest accepted ratio engine-reported prompt tokens / locally counted tokens."""
    monitor: bool = True
    """Flag instruction-shaped text the model writes into its own context (recorded, never blocked)."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """Isolation and limits of the model's shell commands."""
    modes: ModesConfig = field(default_factory=ModesConfig)
    """Settings of the tools, usage, harness and append modes (:mod:`ctxrl.env.modes`)."""

    @property
    def limit(self) -> int:
        """The enforced context limit in tokens: budget − reserve."""
        return self.budget - self.reserve

    @property
    def lm_call_cap(self) -> int:
        """Model calls allowed per episode."""
        return self.max_lm_calls if self.max_lm_calls is not None else 2 * self.max_steps + 24

    def __post_init__(self) -> None:
        problems = _problems(self)
        if problems:
            raise ConfigError("; ".join(problems))


def _problems(cfg: HarnessConfig) -> list[str]:
    """Every violated rule of ``cfg``, each as a message that says how to fix it."""
    out: list[str] = []
    if cfg.budget <= 0:
        out.append(f"budget must be a positive number of tokens, not {cfg.budget} (the default is 32000)")
    if cfg.reserve < 0:
        out.append(f"reserve must be >= 0 tokens, not {cfg.reserve}")
    elif cfg.reserve >= cfg.budget:
        out.append(
            f"reserve ({cfg.reserve}) must be smaller than budget ({cfg.budget}): lower reserve or raise budget"
        )
    fr = cfg.nudge_fractions
    if any(not 0 < f < 1 for f in fr) or list(fr) != sorted(set(fr)):
        out.append(
            f"nudge_fractions must be increasing fractions in (0, 1), e.g. [0.25, 0.5, 0.75], not {list(fr)}"
        )
    for name in ("urgent_limit_fraction", "urgent_min_fill"):
        value = getattr(cfg, name)
        if not 0 <= value <= 1:
            out.append(f"{name} must be a fraction in [0, 1], not {value}")
    if cfg.urgent_output_factor < 0:
        out.append(f"urgent_output_factor must be >= 0, not {cfg.urgent_output_factor}")
    if cfg.urgent_recent_outputs < 1:
        out.append(f"urgent_recent_outputs must be >= 1, not {cfg.urgent_recent_outputs}")
    if cfg.budget > cfg.reserve >= 0 and not 0 < cfg.rollback_margin < cfg.limit:
        out.append(
            f"rollback_margin must be in (0, limit={cfg.limit}) tokens, not {cfg.rollback_margin}: "
            "lower it or raise budget"
        )
    if cfg.rollback_retries < 0:
        out.append(f"rollback_retries must be >= 0, not {cfg.rollback_retries}")
    if cfg.rollback_deepen_after < 1:
        out.append(f"rollback_deepen_after must be >= 1, not {cfg.rollback_deepen_after}")
    if cfg.max_steps < 1:
        out.append(f"max_steps must be >= 1, not {cfg.max_steps}")
    if cfg.max_lm_calls is not None and cfg.max_lm_calls < cfg.max_steps:
        out.append(
            f"max_lm_calls ({cfg.max_lm_calls}) must be >= max_steps ({cfg.max_steps}); "
            "leave it unset for 2 · max_steps + 24"
        )
    if cfg.finalize_turns < 0:
        out.append(f"finalize_turns must be >= 0, not {cfg.finalize_turns}")
    if cfg.gate not in ("fit", "shrink"):
        out.append(f"gate must be 'fit' or 'shrink', not {cfg.gate!r}")
    name = cfg.context_file
    if not name or name in (".", "..") or any(c in name for c in "/\\\0") or name != name.strip():
        out.append(f"context_file must be a plain file name such as 'context.md', not {name!r}")
    if not 0 < cfg.calibration_min <= 1 <= cfg.calibration_max:
        out.append(
            "calibration_min and calibration_max must satisfy 0 < min <= 1 <= max, "
            f"not min={cfg.calibration_min}, max={cfg.calibration_max}"
        )
    return out
