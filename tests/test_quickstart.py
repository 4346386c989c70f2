"""The quickstart's last stage: per-group advantages read back from a trajectory file."""

from __future__ import annotations

from pathlib import Path

from ctxrl.commands.quickstart import advantage_report
from ctxrl.train.trajectory import EpisodeRecord, StepCost, StepRecord, save_trajectories


def _episode(group: int, index: int, success: bool, flops: float, mask: list[int]) -> EpisodeRecord:
    step = StepRecord(
        prompt_ids=[1, 2, 3], token_ids=[4] * len(mask), logprobs=[0.0] * len(mask), edit_mask=mask,
        finish_reason="stop", num_cached_tokens=0, prompt_source="reset", rebuild_reason=None, text="",
        tool_calls=[], edit_calls=[], receipts=[], receipt_kinds=[], readout="", nudges=[],
        context_tokens=3, edited=False, free_turn=False, cost=StepCost(3, 0, len(mask), flops),
    )  # fmt: skip
    return EpisodeRecord(
        task_id=f"t{group}", family="retention", split="train", seed=group, difficulty="default", mode="file",
        skill_id="s", group=group, index=index, engine="scripted", success=success, score=float(success),
        reward=float(success), end_reason="submit", answer="a", verdict="", cost_tokens=10.0,
        cost_flops=flops, steps=[step],
    )  # fmt: skip


def test_advantage_report_reads_groups_back(tmp_path: Path) -> None:
    episodes = [
        _episode(0, 0, True, 100.0, [1, 1, 0]),
        _episode(0, 1, True, 300.0, [0, 1, 0]),
        _episode(0, 2, False, 50.0, [0, 0, 0]),
        _episode(0, 3, False, 80.0, [0, 0, 0]),
        _episode(1, 0, False, 10.0, [0, 0]),
        _episode(1, 1, False, 20.0, [0, 0]),
    ]
    lines = advantage_report(save_trajectories(episodes, tmp_path / "t.jsonl"))
    # group 0: success normalised to ±1; the cheaper success gains, the dearer loses (mean cost 200)
    assert lines[0] == (
        "  group 0 (retention): 2/4 solved, task adv [1.0, 1.0, -1.0, -1.0], "
        "efficiency adv [0.5, -0.5, 0.0, 0.0], edit tokens 3"
    )
    # group 1: no success, no signal
    assert lines[1].startswith(
        "  group 1 (retention): 0/2 solved, task adv [0.0, 0.0], efficiency adv [0.0, 0.0]"
    )
