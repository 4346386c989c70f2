"""The ``evolve`` section of the run config: what one evolution run (``ctxrl evolve``) does.

Which tasks come from the run config's ``tasks`` section (``tasks.families``, ``tasks.difficulty``; its
``split`` and ``count`` do not apply: evolution reads the train split for notes, the dev split for the gate
and the test split once, at the end). The mode is ``rollout.mode``; the policy is the run's engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ctxrl.errors import ConfigError
from ctxrl.evolve.gate import CtxrlGate
from ctxrl.evolve.proposal import MAX_EDITS, ProposalStyle
from ctxrl.evolve.skill import MAX_BODY_CHARS

ProposerName = Literal["offline", "openai", "self"]
ParentRule = Literal["pool", "incumbent"]


@dataclass(frozen=True)
class EvolveConfig:
    """Rounds, task counts, the gate, the proposer of a skill-evolution run."""

    rounds: int = 3
    """Rounds to run; a resumed run continues up to this many (raise it to extend a night)."""
    proposals: int = 3
    """Candidates asked of the proposer per round."""
    train_tasks: int = 8
    """Train tasks per round (their contrastive notes feed the proposer)."""
    train_repeats: int = 2
    """Episodes of the incumbent per train task (a note needs two runs of a task that differ)."""
    dev_tasks: int = 40
    """Dev tasks per round on which every candidate is paired with the incumbent (the gate's N)."""
    repeats: int = 1
    """Episodes per dev and test task and skill (averaged per task: the task is the gate's unit)."""
    test_tasks: int = 40
    """Test tasks of the final comparison (final incumbent vs the seed skill), run once at the end."""
    fresh_tasks: bool = True
    """Each round takes the next train and dev seeds of their splits, so no gate reuses episodes of tasks an
    earlier decision was made on; false: every round uses the first ones."""
    seed_skill: str | None = None
    """A skill file (frontmatter + body, or a plain markdown body) to start from; None: the mode's default."""
    gate: CtxrlGate = field(default_factory=CtxrlGate)
    """The paired held-out gate (alpha over the night, spending, margin, looks, futility)."""
    proposer: ProposerName = "offline"
    """``offline`` (deterministic and rule-based, for tests and CPU demos), ``openai`` (an OpenAI-compatible
    endpoint) or ``self`` (the policy model through its engine)."""
    proposer_url: str | None = None
    """``openai``: the endpoint's base URL, e.g. ``http://127.0.0.1:8000/v1``."""
    proposer_model: str = ""
    """``openai``: the model name the endpoint serves."""
    proposer_api_key_env: str = "OPENAI_API_KEY"
    """``openai``: the environment variable holding the API key (unset: no key sent)."""
    proposer_timeout_s: float = 120.0
    """``openai``: seconds one request may take."""
    proposer_retries: int = 3
    """``openai``: retries of a failed request (connection errors, timeouts, HTTP 408/429/5xx)."""
    proposer_temperature: float = 0.9
    """``openai`` and ``self``: sampling temperature of the proposals."""
    proposer_max_tokens: int = 2048
    """``openai`` and ``self``: most tokens of one proposal."""
    proposer_response_format: bool = True
    """``openai``: send the proposal's JSON schema as ``response_format`` (structured outputs); false for an
    endpoint that refuses the field (the schema is then only described in the prompt)."""
    proposal_style: ProposalStyle = "edits"
    """``edits``: a proposal is a few add / revise / remove operations on the parent's itemised rules, which
    keep every rule they do not name (:mod:`ctxrl.evolve.rules`); ``rewrite``: a whole new body."""
    max_edits: int = MAX_EDITS
    """``edits`` style: most operations in one proposal. With more than one a proposal can name a rule twice,
    which the JSON schema cannot forbid (it is then dropped as malformed); the proposals of a round explore
    several edits either way."""
    parents: ParentRule = "pool"
    """Where a round's proposals start from: ``pool``, a skill drawn from the Pareto pool (the incumbent and
    every candidate best on at least one dev task it ran, :meth:`ctxrl.evolve.lineage.Lineage.pool`), weighted
    by the tasks it is best on; ``incumbent``: always the incumbent. The gate compares with the incumbent
    either way."""
    max_removed_share: float = 0.5
    """A candidate that drops more than this share of its parent's rule text is flagged in the lineage and
    the report (a whole rewrite that collapses the skill; an ``edits`` proposal can only do it rule by rule)."""
    max_notes: int = 8
    """Contrastive notes shown to the proposer per round (success-vs-failure notes first)."""
    max_chars: int = MAX_BODY_CHARS
    """Length cap of a candidate's body; longer candidates are dropped."""
    policy_jitter: float = 0.0
    """``scripted`` engine only: half-width of the per-episode random shift of the skill's compaction threshold
    (:class:`ctxrl.env.policies.ScriptedPolicy`), the stand-in for a sampled model's variation; repeat ``r`` draws
    with seed ``engine.seed + r``, the same for every skill (common random numbers)."""

    gepa_budget: int | None = None
    """``ctxrl evolve --optimizer gepa`` only: the episodes GEPA may spend on train and dev tasks (its
    ``max_metric_calls``); None: what the ctxrl loop with this config plans,
    ``rounds * (train_tasks * train_repeats + (proposals + 1) * dev_tasks * repeats)`` (see
    :func:`ctxrl.evolve.gepa_adapter.planned_episodes`)."""

    def __post_init__(self) -> None:
        names = (
            "rounds",
            "proposals",
            "train_tasks",
            "dev_tasks",
            "repeats",
            "test_tasks",
            "max_notes",
            "max_edits",
        )
        for name in names:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.train_repeats < 2:
            raise ConfigError(
                f"train_repeats must be >= 2 (a note contrasts two runs), got {self.train_repeats}"
            )
        if self.max_chars < 1 or self.proposer_timeout_s <= 0 or self.proposer_retries < 0:
            raise ConfigError("max_chars must be >= 1, proposer_timeout_s > 0 and proposer_retries >= 0")
        if self.gepa_budget is not None and self.gepa_budget < 1:
            raise ConfigError(f"gepa_budget must be >= 1 (episodes) or null, got {self.gepa_budget}")
        if not 0.0 < self.max_removed_share <= 1.0:
            raise ConfigError(f"max_removed_share must be in (0, 1], got {self.max_removed_share}")
        if not 0.0 <= self.policy_jitter < 1.0:
            raise ConfigError(f"policy_jitter must be in [0, 1), got {self.policy_jitter}")
        if self.proposer == "openai" and (not self.proposer_url or not self.proposer_model):
            raise ConfigError(
                "proposer=openai needs proposer_url (e.g. http://127.0.0.1:8000/v1) and proposer_model"
            )
