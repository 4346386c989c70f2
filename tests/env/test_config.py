"""The typed config loader and HarnessConfig: defaults, YAML, overrides, and clear errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ctxrl.config import load_config
from ctxrl.env.config import HarnessConfig
from ctxrl.errors import ConfigError

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_defaults_are_the_reference_implementations() -> None:
    cfg = HarnessConfig()
    assert (cfg.budget, cfg.reserve, cfg.limit) == (32000, 2048, 29952)
    assert cfg.nudge_fractions == (0.25, 0.5, 0.75)
    assert (cfg.urgent_limit_fraction, cfg.urgent_output_factor, cfg.urgent_recent_outputs) == (0.10, 2.0, 3)
    assert cfg.urgent_min_fill == 0.5
    assert (cfg.rollback_margin, cfg.rollback_retries) == (2048, 50)
    assert (cfg.max_steps, cfg.lm_call_cap, cfg.finalize_turns) == (64, 2 * 64 + 24, 3)
    assert cfg.gate == "fit" and cfg.monitor


def test_overrides_and_nested_sections(tmp_path: Path) -> None:
    path = tmp_path / "h.yaml"
    path.write_text("budget: 16000\nsandbox:\n  timeout_s: 5\n")
    cfg = load_config(
        HarnessConfig, path, ["gate=shrink", "sandbox.backend=none", "nudge_fractions=[0.3, 0.6]"]
    )
    assert (cfg.budget, cfg.gate, cfg.nudge_fractions) == (16000, "shrink", (0.3, 0.6))
    assert (cfg.sandbox.timeout_s, cfg.sandbox.backend) == (5.0, "none")
    assert load_config(HarnessConfig, {"max_lm_calls": None}).lm_call_cap == 152


def test_unknown_key_names_key_and_nearest() -> None:
    with pytest.raises(ConfigError, match=r"unknown config key 'budgt'; did you mean 'budget'\?"):
        load_config(HarnessConfig, {"budgt": 100})
    with pytest.raises(ConfigError, match=r"'sandbox\.timeout'; did you mean 'timeout_s'\?"):
        load_config(HarnessConfig, {"sandbox": {"timeout": 3}})
    with pytest.raises(ConfigError, match="unknown config key 'zzz'; valid keys: budget"):
        load_config(HarnessConfig, {"zzz": 1})


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"budget": "big"}, r"budget must be int, not 'big'"),
        ({"budget": True}, r"budget must be int, not True"),
        ({"gate": "grow"}, r"gate must be one of 'fit', 'shrink', not 'grow'"),
        ({"nudge_fractions": 0.5}, r"nudge_fractions must be a list"),
        ({"sandbox": 3}, r"sandbox must be a mapping"),
    ],
)
def test_wrong_types_name_the_field(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(HarnessConfig, data)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"budget": -5}, r"budget must be a positive number of tokens, not -5"),
        (
            {"reserve": 32000},
            r"reserve \(32000\) must be smaller than budget \(32000\): lower reserve or raise budget",
        ),
        ({"reserve": -1}, r"reserve must be >= 0"),
        ({"nudge_fractions": (0.5, 0.25)}, r"nudge_fractions must be increasing fractions"),
        ({"rollback_margin": 40000}, r"rollback_margin must be in \(0, limit=29952\)"),
        ({"max_steps": 0}, r"max_steps must be >= 1"),
        ({"max_lm_calls": 3}, r"max_lm_calls \(3\) must be >= max_steps \(64\)"),
        ({"context_file": "../x"}, r"context_file must be a plain file name"),
        ({"calibration_min": 1.5}, r"0 < min <= 1 <= max"),
    ],
)
def test_absurd_values_give_clear_errors(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        HarnessConfig(**fields)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=message):
        load_config(HarnessConfig, dict(fields))


def test_nested_schema_errors_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"sandbox: sandbox.timeout_s must be > 0"):
        load_config(HarnessConfig, {"sandbox": {"timeout_s": -1}})


def test_bad_files_and_overrides(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(HarnessConfig, tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(HarnessConfig, tmp_path / "list.yaml")
    (tmp_path / "bad.yaml").write_text("budget: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(HarnessConfig, tmp_path / "bad.yaml")
    with pytest.raises(ConfigError, match="must look like key=value"):
        load_config(HarnessConfig, None, ["budget"])


@dataclass(frozen=True)
class _Inner:
    size: tuple[int, int] = (1, 2)
    path: Path | None = None


@dataclass(frozen=True)
class _Outer:
    name: str = "x"
    inner: _Inner = field(default_factory=_Inner)
    rates: list[float] = field(default_factory=list)


def test_loader_is_generic() -> None:
    cfg = load_config(_Outer, {"inner": {"size": [3, 4], "path": "a/b"}, "rates": [1, 0.5]})
    assert cfg == _Outer("x", _Inner((3, 4), Path("a/b")), [1.0, 0.5])
    with pytest.raises(ConfigError, match=r"inner.size must have 2 items"):
        load_config(_Outer, {"inner": {"size": [1]}})
    with pytest.raises(ConfigError, match=r"rates\[1\] must be float"):
        load_config(_Outer, {"rates": [1, "a"]})
