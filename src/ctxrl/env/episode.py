"""The episode factory: the one place where a task, a mode, a skill and a harness config become an episode.

    builder = PromptBuilder(tokenizer)
    episode = TaskEpisode(task, "file", builder, workspace=Path("runs/x/ep0"))
    episode.reset()                           # materialise the task, start the harness, build prompt ids
    step = episode.step(generated_ids)        # parse the calls, apply them, build the next prompt ids
    verdict = episode.finish()                # grade the answer (an empty one if a limit ended it)
    episode.teardown()                        # remove the workspace and the overflow store

The Gymnasium environment (:mod:`ctxrl.env.gym_env`), the rollout loop of training and evaluation
(:mod:`ctxrl.train.rollout`) all run episodes through :class:`TaskEpisode`, so for the same actions they
produce the same episode: the same prompts, steps, receipts, verdict and cost.

**The budget rule** (:func:`episode_config`): an episode's budget is its task's, converted to the policy
tokenizer's tokens (:meth:`Task.budget_for`), with its step limit, and reserve and rollback margin at most an
eighth of the budget, so one large observation still fits under a small budget. Before every step the
context's token count is calibrated to the prompt ids the policy actually saw.

**Prompt ids (token in, token out).** The first prompt is the chat template rendered over the reset
messages (system prompt with the skill, the task, the tools) with the generation prompt, tokenised. After
a step that only appended turns, the next prompt is built *incrementally*:

    next = prompt + generated + encode(close + tail)

where ``generated`` are the ids exactly as sampled (the stop token included); ``close`` is the text the
chat template writes after an assistant message's content (``<|im_end|>\\n`` for ChatML), less the stop
token when the model produced it (so ``\\n``), all of it when generation was cut by the token budget;
and ``tail`` is ``render(messages, generation_prompt=True)`` minus ``render(messages[:k+1])``, the text the
template adds for the turns after the assistant turn (tool results, notes) and the generation prompt,
where ``messages[:k]`` is the previous prompt's messages. So an append-only stretch is an exact token
prefix of every later prompt in it, and what the model sampled is never re-rendered or re-tokenised.
The prompt is **rebuilt** from ``render(messages, generation_prompt=True)`` when the step edited the
context or rolled it back (``edit``), when the messages before the new assistant turn changed (``history``,
e.g. the harness merged a note into an earlier turn, or the tool list changed), or when the template does
not render the messages append-only (``template``). Every step records which.

**Special tokens.** Every string in the messages is neutralised before the template renders them
(:mod:`ctxrl.env.special`), so text that spells a special token (in a tool's output, a note, the context
file, an action's prose or arguments) is tokenised as text: the control tokens of a prompt are exactly the
ones the template writes, plus any the model itself sampled (kept as sampled, token in, token out).

**Edit calls.** A tool call edited the context when it is a shell command (file mode: it changed the
context file) or one of the mode's context-editing tools (the registry's ``edit_tools``) and its result
carries an applied receipt. Reads of the context file, rejected or failed edits and malformed calls do not
count: nothing rewards touching the context without changing it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ctxrl.env.actions import FORMAT_ERROR_TOOL, parse_tool_calls
from ctxrl.env.budget import Means
from ctxrl.env.config import HarnessConfig
from ctxrl.env.context import ChatTemplateCounter, ToolCall, canonical_json, valid_text
from ctxrl.env.harness import Action, Harness, StepResult
from ctxrl.env.modes import make_mode, mode_spec
from ctxrl.env.modes.base import CallOutcome, Episode, Mode, StepNotes
from ctxrl.env.modes.common import store_root
from ctxrl.env.sandbox import Sandbox, SandboxConfig, remove_tree
from ctxrl.env.skills import system_prompt
from ctxrl.env.special import neutral_messages
from ctxrl.env.tasks.base import Task, Verdict, private_root
from ctxrl.errors import ConfigError, UsageError

Messages = list[dict[str, Any]]
HARNESS_TOOL = (
    "[harness] {command} is a harness tool, not a workspace script: call the tool {name} itself (its output "
    "reaches the context whole; it cannot be piped, redirected or filtered). Nothing was run."
)


# --- the budget rule -------------------------------------------------------------------------------------


def episode_config(
    task: Task,
    count_tokens: Callable[[str], int],
    base: HarnessConfig | None = None,
    *,
    max_steps: int | None = None,
    sandbox: SandboxConfig | None = None,
) -> HarnessConfig:
    """The harness config of an episode of ``task``.

    ``base`` (default: the defaults) with, when ``base.task_budget``, the task's budget converted to the
    policy tokenizer's tokens (``count_tokens``: text -> tokens; see :meth:`Task.budget_for`), the task's step
    limit, and reserve and rollback margin at most an eighth of the budget. ``max_steps`` (which also lifts
    the LM-call cap to its default for that limit) and ``sandbox`` then override.
    """
    cfg = base or HarnessConfig()
    if cfg.task_budget:
        budget = task.budget_for(count_tokens)
        cfg = replace(
            cfg,
            budget=budget,
            reserve=min(cfg.reserve, budget // 8),
            rollback_margin=min(cfg.rollback_margin, budget // 8),
            max_steps=task.max_steps,
        )
    if max_steps is not None:
        cfg = replace(cfg, max_steps=max_steps, max_lm_calls=None)
    if sandbox is not None:
        cfg = replace(cfg, sandbox=sandbox)
    return cfg


# --- the task's tools on top of a mode -------------------------------------------------------------------


class TaskToolsMode(Mode):
    """A mode plus the task's tools and the format receipt for malformed calls.

    A task tool call runs through the inner mode as the ``shell`` command it stands for, so the mode treats
    it like any command (rounds, turn headers, the context file sync). A harness tool (``ToolSpec.private``)
    runs the same way, but in a sandbox over the episode's private folder (:func:`private_root`) instead of
    the workspace, so no shell command of the model can run, read or filter it; a shell command that names
    its path is answered with :data:`HARNESS_TOOL` and not run. A call of a tool with a
    ``view`` is announced to the inner mode as a file view before it runs (:meth:`Mode.file_view`). Every
    hook is the inner mode's.
    """

    def __init__(self, inner: Mode, task: Task) -> None:
        self.inner = inner
        self.name = inner.name
        self.budget = inner.budget
        self.task = task
        self._task_tools = {t.name: t for t in task.tools}
        self._private: Sandbox | None = None

    def tool_schemas(self, config: HarnessConfig) -> list[dict[str, Any]]:
        return [*self.inner.tool_schemas(config), *(t.to_openai() for t in self._task_tools.values())]

    def run_call(self, call: ToolCall, episode: Episode) -> CallOutcome:
        spec = self._task_tools.get(call.name)
        if spec is None:
            named = [t for t in self._task_tools.values() if t.private and call.name == "shell"]
            named = [t for t in named if t.command in str(call.args().get("command", ""))]
            if named:  # it is not in the workspace; say so rather than let the shell answer "not found"
                return CallOutcome(HARNESS_TOOL.format(command=named[0].command, name=named[0].name))
            return self.inner.run_call(call, episode)
        args = call.args()
        shell = replace(call, name="shell", arguments=canonical_json({"command": spec.to_shell(args)}))
        key = spec.view_key(args)
        if key is not None:
            self.inner.file_view(episode, call.id, key, spec.name)
        if not spec.private or self._private is None:
            return self.inner.run_call(shell, episode)
        workspace_runner, episode.runner = episode.runner, self._private
        try:
            return self.inner.run_call(shell, episode)
        finally:
            episode.runner = workspace_runner

    def begin_episode(self, episode: Episode) -> None:
        if any(t.private for t in self._task_tools.values()):
            root = private_root(episode.workspace)
            remove_tree(root)  # a kept folder of an earlier episode in the same place
            self.task.materialize_private(root)
            self._private = Sandbox(root, episode.config.sandbox)
        self.inner.begin_episode(episode)

    def after_step(self, episode: Episode, ending: bool) -> StepNotes:
        return self.inner.after_step(episode, ending)

    def signal(self, episode: Episode) -> str | None:
        return self.inner.signal(episode)

    def means(self, config: HarnessConfig) -> Means:
        return self.inner.means(config)


# --- prompt ids ------------------------------------------------------------------------------------------

_MARK = "\u2063ctxrl-mark\u2063"
"""A string no template writes on its own: finds where an assistant message's content ends in a render."""


class PromptBuilder:
    """Prompt ids from chat messages with a tokenizer's chat template; exact prefixes over append-only steps.

    See the module docstring for the rule. Thread-safe: encoding goes through the Rust tokenizer directly
    (``PreTrainedTokenizerFast.__call__`` mutates padding state and is not safe across threads).
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.counter = ChatTemplateCounter(tokenizer)
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self._split_backend: Any = None
        """A copy of the Rust tokenizer that splits special tokens (built on first use by :meth:`encode_text`:
        the flag is state of the tokenizer object, so a copy keeps ``encode`` and ``encode_text`` thread-safe)."""
        probe = self.render([{"role": "user", "content": "."}, {"role": "assistant", "content": _MARK}])
        if _MARK not in probe:
            raise ConfigError("the tokenizer's chat template does not render assistant message content")
        self.turn_close = probe[probe.rindex(_MARK) + len(_MARK) :]
        """Text the template writes after an assistant message's content (``<|im_end|>\\n`` for ChatML)."""
        eos = getattr(tokenizer, "eos_token_id", None)
        self.stop_id: int | None = int(eos) if eos is not None else None
        """The token a generation stops on (the tokenizer's EOS)."""

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        generation_prompt: bool = False,
    ) -> str:
        # Every string in the messages is neutralised: text that spells a special token (a model's note, a
        # tool's output) renders as text, so the prompt's control tokens are exactly the template's own.
        text: str = self.tokenizer.apply_chat_template(
            neutral_messages(messages, self.counter.spellings),
            tools=list(tools) if tools else None,
            add_generation_prompt=generation_prompt,
            tokenize=False,
        )
        return text

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, special-token markup recognised, nothing added (no BOS). For text the
        template rendered (its control tokens are meant); plain text goes through :meth:`encode_text`."""
        if self._backend is not None:
            return list(self._backend.encode(text, add_special_tokens=False).ids)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_text(self, text: str) -> list[int]:
        """Token ids of plain ``text``: a special-token spelling in it is split into ordinary tokens, as a
        model writing those characters would produce them (markup tokens such as ``<tool_call>`` stay). A lone
        surrogate, which no tokenizer takes and no model emits, is encoded as U+FFFD."""
        text = valid_text(text)
        if self._backend is None:
            return list(self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))
        if self._split_backend is None:  # two threads may both build one: harmless, they are equal
            from tokenizers import Tokenizer

            split = Tokenizer.from_str(self._backend.to_str())
            split.encode_special_tokens = True
            self._split_backend = split
        return list(self._split_backend.encode(text, add_special_tokens=False).ids)

    def count(self, text: str) -> int:
        """Tokens of ``text`` (the budget rule's counter)."""
        return len(self.encode(text))

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with special tokens kept."""
        if self._backend is not None:
            return str(self._backend.decode(list(ids), skip_special_tokens=False))
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def action_ids(self, text: str) -> list[int]:
        """The ids of an action given as text, ending with the stop token as a model's generation does.

        The text is what the model wrote (:meth:`encode_text`: a special-token spelling in it stays text),
        except that a trailing spelling of the stop token is the stop token itself (so the ids of a
        decoded generation come back unchanged); the stop token is appended when the text lacks it.
        """
        stop_text = self.decode([self.stop_id]) if self.stop_id is not None else ""
        if stop_text and text.endswith(stop_text):
            text = text[: -len(stop_text)]
        ids = self.encode_text(text)
        if self.stop_id is not None:
            ids.append(self.stop_id)
        return ids

    def full(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
    ) -> list[int]:
        """The prompt ids of ``messages`` rendered whole, with the generation prompt."""
        return self.encode(self.render(messages, tools, generation_prompt=True))

    def extend(
        self,
        prompt: list[int],
        generated: Sequence[int],
        stopped: bool,
        before: Sequence[Mapping[str, Any]],
        after: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
    ) -> tuple[list[int] | None, str | None]:
        """The next prompt built on ``prompt`` + ``generated``, or ``(None, reason)`` when it cannot be.

        ``stopped``: the generation ended on its stop token (not cut by the token budget). ``before`` are
        the messages ``prompt`` was rendered from; ``after`` the messages after the step (the new assistant
        turn at ``len(before)``, then the appended turns). Reasons: ``history`` (the messages before the
        assistant turn changed), ``template`` (the template does not render append-only).
        """
        k = len(before)
        if len(after) <= k or list(after[:k]) != list(before) or after[k].get("role") != "assistant":
            return None, "history"
        head = self.render(before, tools, generation_prompt=True)
        upto = self.render(after[: k + 1], tools)
        whole = self.render(after, tools, generation_prompt=True)
        if not upto.startswith(head) or not whole.startswith(upto) or not upto.endswith(self.turn_close):
            return None, "template"
        close = self.turn_close
        ids = list(generated)
        if stopped and ids:
            stop_text = self.decode(ids[-1:])
            if stop_text and close.startswith(stop_text):
                close = close[len(stop_text) :]  # the model already wrote the stop token: keep it as sampled
        return [*prompt, *ids, *self.encode(close + whole[len(upto) :])], None


# --- the episode -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EpisodeStep:
    """What one step of a :class:`TaskEpisode` did."""

    prompt_ids: list[int]
    """The prompt the action answered."""
    prompt_source: str
    """``reset``, ``extend`` or ``rebuild`` (how ``prompt_ids`` was built)."""
    rebuild_reason: str | None
    text: str
    """The action as text (special tokens kept)."""
    calls: tuple[ToolCall, ...]
    """The parsed tool calls (a malformed one is ``invalid_tool_call``)."""
    edit_calls: list[int]
    """Indices of ``calls`` that targeted the context."""
    result: StepResult


class TaskEpisode:
    """One episode of ``task`` in mode ``mode``: reset, step, finish, teardown. See the module docstring.

    ``config`` is the harness config (default: :func:`episode_config` of the defaults); ``skill`` the text
    in the system prompt (default: the mode's); ``generate(prompt_text) -> text`` the engine the pressure
    pass's ``engine`` summariser calls (needed when ``config.modes.pressure.summariser`` is ``engine``). Not
    thread-safe; different episodes may run in different threads.
    """

    def __init__(
        self,
        task: Task,
        mode: str,
        builder: PromptBuilder,
        *,
        workspace: Path,
        config: HarnessConfig | None = None,
        skill: str | None = None,
        keep_workspace: bool = False,
        generate: Callable[[str], str] | None = None,
    ) -> None:
        spec = mode_spec(mode)
        self.task, self.mode, self.builder = task, mode, builder
        self.workspace = Path(workspace)
        self.config = config if config is not None else episode_config(task, builder.count)
        self.skill = skill if skill is not None else spec.skill
        self.edit_tools = spec.edit_tools
        self.keep_workspace = keep_workspace
        self.generate = generate
        self.harness: Harness | None = None
        self.messages: Messages = []
        self.tools: list[dict[str, Any]] = []
        self.prompt_ids: list[int] = []
        self.prompt_source = "reset"
        self.rebuild_reason: str | None = None
        self.end_reason: str | None = None
        """``submit``, ``max_steps``, ``max_lm_calls``, ``overflow``, or a reason set by :meth:`end`."""
        self.answer: str | None = None

    @property
    def done(self) -> bool:
        return self.end_reason is not None

    @property
    def live(self) -> Harness:
        if self.harness is None:
            raise UsageError("call reset() before stepping the episode")
        return self.harness

    def reset(self) -> Messages:
        """Materialise the task, start the harness, build the first prompt; return its messages."""
        self.task.materialize(self.workspace)
        mode = TaskToolsMode(make_mode(self.mode, self.config, generate=self.generate), self.task)
        self.harness = Harness(self.config, self.builder.counter, mode=mode)
        self.messages = self.harness.reset(
            system_prompt(self.skill, self.config.context_file, readout=self.harness.features.readout),
            self.task.prompt,
            self.workspace,
        )
        self.tools = self.harness.tools
        self.prompt_ids = self.builder.full(self.messages, self.tools)
        self.prompt_source, self.rebuild_reason = "reset", None
        return self.messages

    def prompt_text(self) -> str:
        """The current prompt as text (the chat template over the live messages, generation prompt added)."""
        return self.builder.render(self.messages, self.tools, generation_prompt=True)

    def step(self, generated: Sequence[int], *, stopped: bool = True) -> EpisodeStep:
        """Apply one action given as the generated ids (``stopped``: it ended on the stop token)."""
        harness = self.live
        if self.done:
            raise UsageError(f"the episode is over ({self.end_reason}); reset() starts a new one")
        prompt, source, why = self.prompt_ids, self.prompt_source, self.rebuild_reason
        text = self.builder.decode(generated)
        prose, calls = parse_tool_calls(text)
        harness.context.calibrate(len(prompt))  # count the budget in the tokens the policy actually saw
        result = harness.step(Action(prose, calls))
        step = EpisodeStep(prompt, source, why, text, calls, self._edit_calls(calls, result), result)
        if result.done:
            self.end_reason, self.answer = result.reason, result.answer
        else:
            self._next_prompt(generated, stopped, result)
        return step

    def end(self, reason: str) -> None:
        """End the episode from outside the harness (``max_model_len``, ``aborted``): graded as unanswered."""
        if not self.done:
            self.end_reason = reason

    def finish(self) -> Verdict:
        """Grade the answer (an empty one when the episode did not submit)."""
        cfg = self.config
        return self.task.verifier.verify(
            self.answer or "", self.workspace, lambda ws: Sandbox(ws, cfg.sandbox)
        )

    def teardown(self) -> None:
        """Release the command runner and remove the workspace and its overflow store (unless kept)."""
        if self.harness is not None:
            self.harness.close()
        if self.keep_workspace:
            return
        remove_tree(self.workspace)  # any depth: a model can nest directories past Python's recursion limit
        store = store_root(self.workspace, self.config.modes)
        if store is not None:
            remove_tree(store)
        remove_tree(private_root(self.workspace))

    def _edit_calls(self, calls: Sequence[ToolCall], result: StepResult) -> list[int]:
        """Indices of the calls that edited the context (see the module docstring): a shell command or a
        context tool whose result carries an *applied* receipt. A read that matched nothing, a rejected or
        failed edit and a malformed call earn no edit credit. The harness appends one result per call, in
        order, so ``result.observations[i]`` is call ``i``'s result."""
        applied = [r.text for r in result.receipts if r.applied]
        chosen = []
        for i, call in enumerate(calls):
            if call.name == FORMAT_ERROR_TOOL or not (call.name == "shell" or call.name in self.edit_tools):
                continue
            shown = result.observations[i] if i < len(result.observations) else ""
            if any(text in shown for text in applied):
                chosen.append(i)
        return chosen

    def _next_prompt(self, generated: Sequence[int], stopped: bool, result: StepResult) -> None:
        harness = self.live
        messages, tools = harness.context.to_messages(), harness.tools
        ids: list[int] | None = None
        reason: str | None = "edit" if result.edited else "history" if tools != self.tools else None
        if reason is None:
            ids, reason = self.builder.extend(
                self.prompt_ids, generated, stopped, self.messages, messages, tools
            )
        if ids is None:
            ids = self.builder.full(messages, tools)
        self.prompt_source = "extend" if reason is None else "rebuild"
        self.rebuild_reason = reason
        self.prompt_ids, self.messages, self.tools = ids, messages, tools
