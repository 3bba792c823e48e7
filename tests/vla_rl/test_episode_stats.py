"""Episode bookkeeping of the trainer: returns, lengths and success overall and per task."""

import torch

from vla_rl.rollout import EpisodeStats


def test_summary_holds_each_tasks_success_of_the_episodes_that_ended() -> None:
    stats = EpisodeStats.zeros(3, ("reach", "push"))
    task = torch.tensor([0, 1, 1])
    no = torch.zeros(3, dtype=torch.bool)
    stats.record(torch.ones(3), torch.tensor([True, False, True]), no, 1, task)
    stats.record(torch.ones(3), no, torch.tensor([True, True, False]), 1, task)
    summary = stats.pop_summary()
    assert summary["episodes"] == 2 and summary["episode_return"] == 2.0
    assert summary["episode_success/reach"] == 1.0 and summary["episode_success/push"] == 0.0
    # The third env's episode (push, succeeded) ends later, after a reset of the first two.
    stats.record(torch.ones(3), no, torch.tensor([False, False, True]), 1, task)
    summary = stats.pop_summary()
    assert summary == {"episode_return": 3.0, "episode_length": 3.0, "episode_success": 1.0, "episodes": 1.0,
                       "episode_success/push": 1.0}
    assert stats.pop_summary() == {}


def test_one_task_gets_no_per_task_keys() -> None:
    stats = EpisodeStats.zeros(1, ("reach",))
    stats.record(torch.ones(1), torch.ones(1, dtype=torch.bool), torch.ones(1, dtype=torch.bool), 1, torch.zeros(1))
    assert set(stats.pop_summary()) == {"episode_return", "episode_length", "episode_success", "episodes"}
