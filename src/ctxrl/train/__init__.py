"""Generation engines, the tiny offline model, rollouts and training."""
