"""The rollout of ``ctxrl bench inflight`` under other engine and sampling settings, one setting a process.

    python scripts/probe_rollout.py [--groups 1,2,4] [--compile] [--temperature T] [--top-p P]
                                    [--model NAME] [--engine vllm|hf] [--steps N] [--new-tokens N]
    python scripts/probe_rollout.py --groups 1                                  # eager, temperature 1, top-p 1
    python scripts/probe_rollout.py --groups 1 --temperature 0.7 --top-p 0.95   # the bench's sampling before
    python scripts/probe_rollout.py --groups 1 --compile                        # engine.compile

Defaults: SmolLM2-135M-Instruct on the in-process vLLM engine in bfloat16, eager, groups of 8 `short`
retention episodes, 256 new tokens, sampled at temperature 1 and top-p 1. Prints the figures of
:func:`ctxrl.commands.bench_inflight.rollouts_in_flight` as JSON. The "Eighth run" section of
docs/train_throughput.md cites it for the separate effects of torch.compile and top-p on the 8-episode rollout.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from ctxrl.commands.bench_inflight import InflightRun, rollouts_in_flight
from ctxrl.train.engines import EngineConfig, SamplingConfig


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", default="1", help="comma-separated numbers of groups, one rollout each")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--compile", action="store_true", help="engine.compile")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--engine", choices=("vllm", "hf"), default="vllm")
    parser.add_argument("--steps", type=int, default=None, help="rollout.max_steps (default: the task's)")
    parser.add_argument("--new-tokens", type=int, default=256)
    args = parser.parse_args(argv)
    engine = EngineConfig(
        name=args.engine,
        max_model_len=4096,
        dtype="bfloat16" if args.engine == "vllm" else None,
        compile=args.compile,
    )
    sampling = SamplingConfig(temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.new_tokens)
    runs = [InflightRun(int(g), sampling) for g in args.groups.split(",")]
    figures = rollouts_in_flight(args.model, engine, runs, args.group_size, args.steps, 1536)
    print(json.dumps({"engine": asdict(engine), "sampling": asdict(sampling), "figures": figures}))


if __name__ == "__main__":
    main()
