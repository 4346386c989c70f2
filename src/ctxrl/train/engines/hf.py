"""``hf`` engine: transformers ``generate``, the fallback and the comparison point for the vLLM engines.

Prompts of one call run as one left-padded batch (or chunks of ``batch_size``). Logprobs come from the raw
logits ``generate`` returns (``output_logits=True``), so they are the model's own distribution, before
temperature and top-p, like vLLM's default ``raw_logprobs``. There is no prefix cache (``num_cached_tokens``
is 0) and no sleep mode.

Sampling is reproducible per engine: the engine keeps its own RNG state (seeded at construction; on a CUDA
model the device's generator state too, since sampling then draws from it) and runs ``generate`` inside
``torch.random.fork_rng``, so it neither depends on nor disturbs the global RNG.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ctxrl.errors import EngineError, ModelLoadError
from ctxrl.train.engines.base import (
    FinishReason,
    Generation,
    SamplingConfig,
    Weights,
    iter_named_weights,
    new_token_budgets,
    refuse_json_schema,
    too_long,
)
from ctxrl.train.engines.model_dir import check_causal_lm_dir


class HFEngine:
    """Generation with a transformers causal LM. Build with :meth:`load` or :meth:`from_model`."""

    name = "hf"
    supports_sleep = False
    cache_block_size: int | None = None

    def __init__(
        self,
        model: Any,
        *,
        pad_token_id: int,
        eos_token_ids: Sequence[int],
        seed: int = 0,
        max_model_len: int | None = None,
        batch_size: int = 64,
    ) -> None:
        import torch

        self._model: Any = model.eval()
        self.pad_token_id = pad_token_id
        self.eos_token_ids = tuple(eos_token_ids)
        self.max_model_len: int = int(max_model_len or model.config.max_position_embeddings)
        self.vocab_size: int = int(model.config.vocab_size)
        self.batch_size = batch_size
        gen = torch.Generator().manual_seed(seed)
        self._rng_state = gen.get_state()
        self._seed = seed
        self._device_rng_state: Any = None  # the CUDA generator's state, made on the first CUDA call

    @classmethod
    def from_model(cls, model: Any, **kwargs: Any) -> HFEngine:
        """Wrap a loaded model; pad/EOS ids come from its config and generation config."""
        eos = model.generation_config.eos_token_id
        if eos is None:
            eos = model.config.eos_token_id
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        pad = model.generation_config.pad_token_id
        if pad is None:
            pad = model.config.pad_token_id
        if pad is None:
            pad = eos_ids[0] if eos_ids else 0
        return cls(model, pad_token_id=int(pad), eos_token_ids=eos_ids, **kwargs)

    @classmethod
    def load(cls, model_dir: str | Path, *, dtype: str = "float32", **kwargs: Any) -> HFEngine:
        """Check ``model_dir`` (:class:`ModelLoadError` if it is not a causal LM), then load it on the first
        CUDA device when there is one, else on the CPU."""
        import torch
        from transformers import AutoModelForCausalLM

        path = check_causal_lm_dir(model_dir)
        model: Any
        try:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
        except (OSError, ValueError, RuntimeError) as exc:
            raise ModelLoadError(f"transformers could not load the model in {path}: {exc}") from None
        if torch.cuda.is_available():
            model = model.to(torch.device("cuda"))
        return cls.from_model(model, **kwargs)

    @property
    def model(self) -> Any:
        if self._model is None:
            raise EngineError("this transformers engine is closed")
        return self._model

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig) -> list[Generation]:
        """Generate for every prompt with left-padded batched ``generate`` (contract in ``engines.base``)."""
        refuse_json_schema(sampling, "hf")
        budgets = new_token_budgets(prompts, sampling, self.max_model_len, self.vocab_size)
        results: list[Generation] = []
        for start in range(0, len(prompts), self.batch_size):
            chunk = range(start, min(start + self.batch_size, len(prompts)))
            results.extend(
                self._generate_chunk([prompts[i] for i in chunk], [budgets[i] for i in chunk], sampling)
            )
        return results

    def _generate_chunk(
        self, prompts: list[Sequence[int]], budgets: list[int], sampling: SamplingConfig
    ) -> list[Generation]:
        import torch
        from transformers import GenerationConfig

        run = [k for k, b in enumerate(budgets) if b > 0]
        results: list[Generation | None] = [
            None if b > 0 else too_long(len(p), self.max_model_len) for p, b in zip(prompts, budgets)
        ]
        if not run:
            return [r for r in results if r is not None]
        width = max(len(prompts[k]) for k in run)
        input_ids = torch.full((len(run), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(run), width), dtype=torch.long)
        for row, k in enumerate(run):
            ids = torch.tensor(list(prompts[k]), dtype=torch.long)
            input_ids[row, width - len(ids) :] = ids
            attention_mask[row, width - len(ids) :] = 1

        stop_ids = [] if sampling.ignore_eos else [*self.eos_token_ids, *sampling.stop_token_ids]
        # A fresh config, so nothing from the model's generation_config.json (top_k=50, repetition penalty,
        # its EOS when ignore_eos is asked for) changes the sampling.
        config = GenerationConfig(
            max_new_tokens=max(budgets[k] for k in run),
            do_sample=not sampling.greedy,
            pad_token_id=self.pad_token_id,
            eos_token_id=stop_ids or None,
            return_dict_in_generate=True,
            output_logits=True,
        )
        if not sampling.greedy:
            config.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        device = self.model.device
        cuda = device.type == "cuda"
        with torch.random.fork_rng(devices=[device] if cuda else []), torch.no_grad():
            torch.random.set_rng_state(self._rng_state)
            if cuda:
                if self._device_rng_state is None:
                    self._device_rng_state = (
                        torch.Generator(device=device).manual_seed(self._seed).get_state()
                    )
                torch.cuda.set_rng_state(self._device_rng_state, device)
            out = self.model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                generation_config=config,
            )
            self._rng_state = torch.random.get_rng_state()
            if cuda:
                self._device_rng_state = torch.cuda.get_rng_state(device)

        # Each new token's logprob under the raw logits, computed a step at a time on the model's device: a
        # [batch, steps, vocab] tensor (6 GB at 128 x 256 x 49k in float32) is never stacked or copied to the CPU.
        on_device = out.sequences[:, width:]
        columns = []
        for t, step in enumerate(out.logits):
            logits = step.float()
            columns.append(
                logits.gather(-1, on_device[:, t : t + 1]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
            )
        chosen = torch.stack(columns, dim=1).cpu()
        new_ids = on_device.cpu()
        stop_set = set(stop_ids)
        for row, k in enumerate(run):
            ids = new_ids[row].tolist()[: budgets[k]]
            end = next((n for n, tok in enumerate(ids) if tok in stop_set), None)
            reason: FinishReason
            if end is not None:
                ids, reason = ids[: end + 1], "stop"
            else:
                reason = "length"
            results[k] = Generation(
                token_ids=ids,
                logprobs=chosen[row, : len(ids)].tolist(),
                finish_reason=reason,
                num_cached_tokens=0,
            )
        return [r for r in results if r is not None]

    def update_weights(self, weights: Weights) -> None:
        """Copy the given tensors into the model (names not given keep their values)."""
        import torch

        params = self.model.state_dict()
        with torch.no_grad():
            for name, tensor in iter_named_weights(weights):
                if name not in params:
                    raise EngineError(f"update_weights: the model has no parameter named {name!r}")
                params[name].copy_(tensor)

    def sleep(self) -> None:
        """No-op: transformers has no sleep mode."""

    def wake(self) -> None:
        """No-op: transformers has no sleep mode."""

    def close(self) -> None:
        self._model = None
