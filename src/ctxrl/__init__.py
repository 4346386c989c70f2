"""ctxrl: train and evolve LLM agents that manage their own context window.

Subpackages (see README "Architecture"):

- ``ctxrl.env``      the harness, its action modes, the sandbox, the task suite, the Gymnasium environment
- ``ctxrl.rewards``  success, prefix-reuse cost, advantages, edit masks
- ``ctxrl.train``    generation engines, rollouts, SFT warm start, stepwise GRPO, checkpoints, export
- ``ctxrl.evolve``   skills, contrastive notes, proposers, the paired gate, the overnight loop

Importing ``ctxrl`` is cheap: no torch, no vLLM.
"""

__version__ = "0.1.0"
