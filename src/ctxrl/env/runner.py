"""The batched runner: many episodes of :class:`~ctxrl.env.gym_env.ContextEnv` at once.

    specs = [EpisodeSpec("retention", "file", seed) for seed in split_seeds("test", 8)]
    results = run_episodes(specs, PolicyActor(make_policy("file-manager")), workers=4)

Each round, every live episode's prompt goes to the actor in ONE call (``actor.act(batch) -> texts``), then
the episodes step in a thread pool (sandbox commands are subprocesses, so steps overlap). Finished episodes
are scored by the environment's verifier, priced by the prefix-reuse cost model, and replaced by waiting ones
(at most ``max_live`` at a time).

**Determinism.** An episode depends only on its spec and on the actor's answers to its own prompts, and the
results come back in spec order, so with a deterministic actor (every scripted policy) the results are the
same whatever ``workers`` and ``max_live`` are. An engine that samples should seed per prompt to keep this.

**Actors.** :class:`Actor` is the interface a generation engine implements to plug in: a batch of
:class:`Prompt` (structured messages, tools, and the rendered prompt text) in, one generated text per prompt
out. :class:`PolicyActor` adapts a per-prompt policy callable, such as a scripted policy.

``bench_env`` is ``ctxrl bench env``: episodes per second of the runner with the scripted policies.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ctxrl.env.gym_env import ContextEnv, load_tokenizer
from ctxrl.env.receipts import ReceiptKind
from ctxrl.rewards.cost import ModelGeometry, Step, episode_cost, replay_episode

RECEIPT_KINDS = tuple(kind.value for kind in ReceiptKind)
"""Receipt kinds, in the order tables show them."""


@dataclass(frozen=True)
class Prompt:
    """One live episode's prompt: what a policy or an engine needs to produce the next action."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    text: str
    """The chat template rendered over ``messages`` and ``tools`` with the generation prompt."""


class Actor(Protocol):
    """Produces one action (generated text) for each prompt of a batch, in order."""

    def act(self, batch: Sequence[Prompt]) -> list[str]: ...


class PolicyActor:
    """An :class:`Actor` from a per-prompt policy ``policy(messages, tools) -> text`` (a scripted policy)."""

    def __init__(self, policy: Callable[[list[dict[str, Any]], list[dict[str, Any]]], str]) -> None:
        self.policy = policy

    def act(self, batch: Sequence[Prompt]) -> list[str]:
        return [self.policy(p.messages, p.tools) for p in batch]


@dataclass(frozen=True)
class EpisodeSpec:
    """Which episode to run: a built-in task (family, split seed, difficulty) in a mode."""

    family: str
    mode: str
    task_seed: int
    split: str = "test"
    difficulty: str = "default"


@dataclass
class EpisodeResult:
    """What one episode did, for tables and logs."""

    spec: EpisodeSpec
    task_id: str
    success: bool
    reason: str
    """Why it ended: ``submit``, ``max_steps``, ``max_lm_calls`` or ``overflow``."""
    verdict: str
    steps: int
    """Task steps (free edit turns excluded)."""
    lm_calls: int
    prompt_tokens: int
    """Prompt tokens summed over the episode's model calls."""
    generated_tokens: int
    peak_tokens: int
    """Largest context size (budget readout) seen in the episode."""
    cost_tokens: float
    """Computed tokens (prefilled + generated) after prefix-cache reuse."""
    cost_flops: float
    """FLOPs of the episode under the runner's model geometry, after prefix-cache reuse."""
    edits: int
    """Actions that targeted the context (each got at least one receipt)."""
    rollbacks: int
    """Steps that ended in an overflow rollback."""
    receipts: dict[str, int] = field(default_factory=dict)
    """Receipt count per kind (:data:`RECEIPT_KINDS`)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Live:
    """One running episode: its environment and what is recorded step by step."""

    index: int
    spec: EpisodeSpec
    env: ContextEnv
    prompt: Prompt
    calls: list[tuple[list[int], list[int]]] = field(default_factory=list)
    peak: int = 0
    edits: int = 0
    rollbacks: int = 0
    receipts: Counter[str] = field(default_factory=Counter)


class _Runner:
    """Starts, steps and finishes episodes; its methods run in the worker threads."""

    def __init__(self, tokenizer: Any, geometry: ModelGeometry, workdir: Path | None) -> None:
        self.tokenizer = tokenizer
        self.geometry = geometry
        self.workdir = workdir

    def _ids(self, text: str) -> list[int]:
        ids: list[int] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids

    def start(self, index: int, spec: EpisodeSpec) -> _Live:
        workdir = self.workdir / f"episode-{index:06d}" if self.workdir is not None else None
        env = ContextEnv(
            spec.family,
            spec.mode,
            split=spec.split,
            difficulty=spec.difficulty,
            tokenizer=self.tokenizer,
            workdir=workdir,
        )
        obs, info = env.reset(options={"task_seed": spec.task_seed})
        return _Live(index, spec, env, Prompt(info["messages"], info["tools"], obs), peak=info["tokens"])

    def step(self, live: _Live, action: str) -> EpisodeResult | None:
        """Apply ``action``; return the result if the episode ended (its environment is then closed)."""
        live.calls.append((self._ids(live.prompt.text), self._ids(action)))
        obs, _, terminated, truncated, info = live.env.step(action)
        live.peak = max(live.peak, info["tokens"])
        live.edits += bool(info["receipts"])
        live.rollbacks += info["rolled_back_turns"] > 0
        live.receipts.update(info["receipt_kinds"])
        if not (terminated or truncated):
            live.prompt = Prompt(info["messages"], info["tools"], obs)
            return None
        live.env.close()
        cached = replay_episode([Step(p, g) for p, g in live.calls], block_size=16)
        return EpisodeResult(
            spec=live.spec,
            task_id=info["task_id"],
            success=bool(info["success"]),
            reason=str(info["reason"]),
            verdict=str(info["verdict"]),
            steps=int(info["steps"]),
            lm_calls=int(info["lm_calls"]),
            prompt_tokens=sum(len(p) for p, _ in live.calls),
            generated_tokens=sum(len(g) for _, g in live.calls),
            peak_tokens=live.peak,
            cost_tokens=episode_cost(cached, "tokens"),
            cost_flops=episode_cost(cached, "flops", geometry=self.geometry),
            edits=live.edits,
            rollbacks=live.rollbacks,
            receipts={kind: live.receipts.get(kind, 0) for kind in RECEIPT_KINDS},
        )


def tiny_geometry() -> ModelGeometry:
    """The FLOPs geometry of the tiny offline model (``ctxrl tiny-model``), the default cost reference."""
    from ctxrl.train.tiny_model import TinyModelConfig

    return ModelGeometry.from_config({**asdict(TinyModelConfig()), "model_type": "qwen3"})


def run_episodes(
    specs: Sequence[EpisodeSpec],
    actor: Actor,
    *,
    workers: int = 4,
    max_live: int | None = None,
    tokenizer: Any = None,
    geometry: ModelGeometry | None = None,
    workdir: str | Path | None = None,
    progress: bool | str = False,
) -> list[EpisodeResult]:
    """Run every episode of ``specs`` to its end; return their results in spec order.

    ``workers`` threads step the environments; at most ``max_live`` episodes (default ``8 * workers``) run at
    once. ``tokenizer`` is the policy tokenizer (default: the tiny model's), ``geometry`` the model the cost
    is priced for (default: :func:`tiny_geometry`). ``workdir`` holds the episode workspaces (default: a
    temporary folder per episode). ``progress`` shows a progress bar (a string is its label).
    """
    from tqdm import tqdm

    if workers < 1:
        raise ValueError(f"workers must be >= 1, not {workers}")
    runner = _Runner(
        tokenizer if tokenizer is not None else load_tokenizer(None),
        geometry if geometry is not None else tiny_geometry(),
        Path(workdir) if workdir is not None else None,
    )
    limit = max_live if max_live is not None else 8 * workers
    waiting = deque(enumerate(specs))
    live: list[_Live] = []
    results: list[EpisodeResult | None] = [None] * len(specs)
    label = progress if isinstance(progress, str) else "episodes"
    with (
        ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ctxrl-env") as pool,
        tqdm(total=len(specs), desc=label, unit="ep", disable=not progress, dynamic_ncols=True) as bar,
    ):
        try:
            while waiting or live:
                starting = [waiting.popleft() for _ in range(min(len(waiting), limit - len(live)))]
                live += pool.map(lambda item: runner.start(*item), starting)
                actions = actor.act([ep.prompt for ep in live])
                if len(actions) != len(live):
                    raise ValueError(f"the actor returned {len(actions)} actions for {len(live)} prompts")
                ended = list(pool.map(runner.step, live, actions))
                still = []
                for ep, result in zip(live, ended):
                    if result is None:
                        still.append(ep)
                        continue
                    results[ep.index] = result
                    bar.update(1)
                live = still
                done = [r for r in results if r is not None]
                bar.set_postfix(
                    success=f"{sum(r.success for r in done) / max(len(done), 1):.2f}",
                    live=len(live),
                    refresh=False,
                )
        finally:
            for ep in live:  # an error left these running: remove their workspaces
                ep.env.close()
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


def bench_env(args: argparse.Namespace) -> dict[str, float]:
    """``ctxrl bench env``: episodes per second of the runner, every scripted policy on every family.

    Default difficulty, test split; 2 episodes per (policy, family) with ``--quick``, else 6; 4 workers.
    """
    from ctxrl.env.policies import POLICY_MODES, make_policy
    from ctxrl.env.tasks.registry import FAMILIES
    from ctxrl.env.tasks.splits import split_seeds

    per = 2 if args.quick else 6
    seeds = split_seeds("test", per)
    tokenizer = load_tokenizer(None)
    episodes = steps = 0
    start = time.perf_counter()
    for name, mode in POLICY_MODES.items():
        specs = [EpisodeSpec(family, mode, seed) for family in FAMILIES for seed in seeds]
        results = run_episodes(specs, PolicyActor(make_policy(name)), workers=4, tokenizer=tokenizer)
        episodes += len(results)
        steps += sum(r.lm_calls for r in results)
    seconds = time.perf_counter() - start
    return {
        "episodes_per_s": episodes / seconds,
        "steps_per_s": steps / seconds,
        "episodes": float(episodes),
        "seconds": seconds,
    }
