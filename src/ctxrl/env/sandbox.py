"""Run the model's shell commands in its episode workspace.

The public surface is small: :class:`SandboxConfig`, :class:`CommandResult`, :class:`Sandbox`
(``Sandbox(workspace, config).run(command) -> CommandResult``) and :func:`sandbox_overhead_ms`.

What a command sees (backends ``bwrap`` and ``unshare``): its workspace, read-write, at ``/workspace`` (the
working directory and ``$HOME``); ``/usr`` and the ``/bin``, ``/lib*`` entries, read-only; a few world-readable
``/etc`` entries bash and python3 need, read-only; a fresh tmpfs ``/tmp`` of ``tmp_mb``; its own ``/proc``; a
minimal ``/dev``. It runs in new mount, pid, network, ipc and uts namespaces: no network (only its own loopback), no
other process visible, nothing of the host writable. Every process of the command is killed when ``run``
returns, including those it left in the background, because the command's pid namespace dies with it.

Limits: wall time (the whole pid namespace is killed), output (read incrementally; the middle is cut with a
marker that says how many bytes), memory (``RLIMIT_AS`` per process, and a size-capped ``/tmp`` so memory cannot
be parked there), process count (``RLIMIT_NPROC``) and workspace disk (``disk_mb``: no file may grow past it,
``RLIMIT_FSIZE``; and while a command runs, the host filesystem's free space is watched, so once the command
has written more than the quota has room for, the workspace is measured and the command killed if it is over;
``max_files`` the same way for the number of files and folders, through the filesystem's free inodes, since
empty files take no bytes).
A command that is not valid text (a null byte, a lone surrogate) or longer than one program argument may be
(:data:`MAX_COMMAND_BYTES`) is refused with exit code 126; ``run`` raises
for nothing the command holds or does. No process of a command is left behind, zombies included: bubblewrap's
namespace init is reaped too when this process is its reaper (pid 1 or a subreaper).
``RLIMIT_NPROC`` is ignored for host root, so when the harness runs as root the command runs as the
unprivileged host uid ``SandboxConfig.sandbox_uid`` inside a user namespace of its own (the count is then
per sandbox), and the workspace is handed to that uid: all of it before the first command, and afterwards the
top-level entries the host added between commands (a file the host creates deeper must be given to the sandbox
uid by its writer, as the harness does for the context file). Host-side work per command does not grow with
the number or depth of the workspace's files.

Backend ``none`` runs the command with no isolation (a plain ``bash -c`` in the workspace, with the time
and output limits still applied); it exists only as an explicit setting and warns on every episode.
"""

from __future__ import annotations

import contextlib
import functools
import os
import selectors
import shlex
import shutil
import signal
import statistics
import subprocess
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ctxrl.env.gate import loads_bounded
from ctxrl.errors import SandboxError

Backend = Literal["auto", "bwrap", "unshare", "none"]

SANDBOX_WORKDIR = "/workspace"
"""Where the workspace appears inside the sandbox."""

_INNER_UID = 1000
"""The uid (and gid) a command has inside its user namespace."""

_SYSTEM_ENTRIES = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
"""Top-level host entries bound read-only (or re-created as the same symlink) when they exist."""

_ETC_ENTRIES = (
    "alternatives",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "nsswitch.conf",
    "passwd",
    "group",
    "python3",
    "python3.11",
    "python3.12",
    "python3.13",
)
"""World-readable ``/etc`` entries bash, python3 and coreutils use; nothing secret (no shadow, no keys)."""

_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": SANDBOX_WORKDIR,
    "LANG": "C.UTF-8",
    "TMPDIR": "/tmp",
    "USER": "sandbox",
}

_QUOTA_POLL_S = 0.02
"""How often the host filesystem's free space is read while a command runs (one ``statvfs``)."""
_MEASURE_EVERY_S = 0.25
"""At most this often the workspace is measured (``du``) when the free space says it may be over quota."""
REFUSED_EXIT = 126
"""Exit code of a command that was refused without running (not valid text)."""

_READ_CHUNK = 1 << 16
UNSHARE_SIGKILL_LINE = "unshare: sigprocmask unblock failed: Invalid argument\n"
"""What util-linux's ``unshare`` before 2.40 prints when its child dies of SIGKILL (it tries to reset
SIGKILL's handler, which always fails; fixed upstream by "unshare: don't try to reset the disposition of
SIGKILL"). It once read as the backend refusing to start commands late in long processes: those were
commands killed at their time limit on a loaded machine."""
_DRAIN_GRACE_S = 2.0
"""How long to wait for the last output and the namespace's end after the command (or its kill) finished."""


@dataclass(frozen=True)
class SandboxConfig:
    """Limits and isolation of one episode's commands."""

    backend: Backend = "auto"
    """``auto`` picks bubblewrap, then unshare; ``none`` disables isolation (warns every episode)."""
    timeout_s: float = 30.0
    """Wall-time limit of one command; every process of the command is killed after it."""
    max_output_bytes: int = 64_000
    """Combined stdout+stderr kept; the rest is cut with a marker that says how much."""
    memory_mb: int = 2048
    """Address-space limit per process, MiB."""
    max_processes: int = 256
    """Process limit of the command (a fork bomb stops here)."""
    sandbox_uid: int = 65534
    """Unprivileged host uid (and gid) commands run as when the harness runs as root; unused otherwise."""
    disk_mb: int = 1024
    """Workspace disk quota, MiB: the largest file, and the most the workspace may hold before a command is killed."""
    max_files: int = 100_000
    """Files, folders and links (inodes) the workspace may hold before a command is killed: empty files cost
    no bytes, but a million of them cost the host's inodes and seconds of every later clean-up."""
    tmp_mb: int = 256
    """Size of the command's private ``/tmp`` (memory-backed, so it counts on top of ``memory_mb``), MiB."""

    def __post_init__(self) -> None:
        if self.backend not in ("auto", "bwrap", "unshare", "none"):
            raise ValueError(f"sandbox.backend must be auto, bwrap, unshare or none, not {self.backend!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"sandbox.timeout_s must be > 0, not {self.timeout_s}")
        if self.max_output_bytes < 256:
            raise ValueError(f"sandbox.max_output_bytes must be >= 256, not {self.max_output_bytes}")
        if self.memory_mb < 64:
            raise ValueError(
                f"sandbox.memory_mb must be >= 64 (bash and python3 need it), not {self.memory_mb}"
            )
        if self.max_processes < 8:
            raise ValueError(f"sandbox.max_processes must be >= 8, not {self.max_processes}")
        if not 0 < self.sandbox_uid < 2**32 - 1:
            raise ValueError(f"sandbox.sandbox_uid must be a non-root uid, not {self.sandbox_uid}")
        if self.disk_mb < 1:
            raise ValueError(f"sandbox.disk_mb must be >= 1, not {self.disk_mb}")
        if self.max_files < 100:
            raise ValueError(f"sandbox.max_files must be >= 100, not {self.max_files}")
        if self.tmp_mb < 1:
            raise ValueError(f"sandbox.tmp_mb must be >= 1, not {self.tmp_mb}")


MAX_COMMAND_BYTES = 128 * 1024 - 1
"""The longest command ``run`` takes, in UTF-8 bytes: Linux refuses a single program argument of 128 KiB
(``MAX_ARG_STRLEN``) with E2BIG, and the command is one argument of bash. A longer one is refused."""

_COMMAND_TIME = threading.local()


def command_seconds() -> float:
    """Seconds this thread has spent in :meth:`Sandbox.run` so far: what a step's wall time minus this is
    the harness's own time (``ctxrl bench fuzz`` counts a stall from it)."""
    return float(getattr(_COMMAND_TIME, "seconds", 0.0))


@dataclass(frozen=True)
class CommandResult:
    """What one command did, as the harness and the model see it."""

    command: str
    exit_code: int
    """The shell's exit status; 124 after a timeout (as coreutils ``timeout`` reports)."""
    output: str
    """stdout and stderr interleaved, decoded as UTF-8 with replacement, truncated with a marker."""
    timed_out: bool
    truncated_bytes: int
    """Bytes of output cut by ``max_output_bytes``."""
    duration_s: float
    over_quota: bool = False
    """The command was killed because the workspace passed ``disk_mb`` or ``max_files`` (its output says so)."""


def _join_cut(head: bytes, tail: bytes, cut: int) -> str:
    marker = f"\n[... output truncated: {cut} bytes cut ...]\n"
    return head.decode("utf-8", errors="replace") + marker + tail.decode("utf-8", errors="replace")


def truncate_output(data: bytes, limit: int) -> tuple[str, int]:
    """Keep the head and tail of ``data`` within ``limit`` bytes; return (text, bytes cut)."""
    if len(data) <= limit:
        return data.decode("utf-8", errors="replace"), 0
    cut = len(data) - limit
    return _join_cut(data[: limit // 2], data[len(data) - limit // 2 :], cut), cut


class _OutputCap:
    """Keeps the first and last ``limit // 2`` bytes of a stream; memory stays O(limit) whatever arrives.

    ``result()`` equals ``truncate_output(everything, limit)``.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.half = limit // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        if len(self.head) < self.limit:
            # Until the stream passes the limit we cannot know whether it will be cut, so keep it whole.
            room = self.limit - len(self.head)
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > self.limit:
                del self.tail[: len(self.tail) - self.limit]

    def result(self) -> tuple[str, int]:
        if self.total <= self.limit:
            return bytes(self.head + self.tail).decode("utf-8", errors="replace"), 0
        whole = bytes(self.head + self.tail)  # at most 2 * limit bytes, the stream's first and last
        tail = whole[len(whole) - self.half :] if self.half else b""
        return _join_cut(whole[: self.half], tail, self.total - self.limit), self.total - self.limit


def _system_entries() -> list[tuple[str, str | None]]:
    """(name, symlink target or None for a directory) of the host's top-level system entries."""
    found: list[tuple[str, str | None]] = []
    for name in _SYSTEM_ENTRIES:
        path = Path("/", name)
        if path.is_symlink():
            found.append((name, os.readlink(path)))
        elif path.is_dir():
            found.append((name, None))
    return found


def _etc_entries() -> list[str]:
    return [name for name in _ETC_ENTRIES if os.path.lexists(f"/etc/{name}")]


def _staging_dir(workspace: Path) -> str:
    """A host directory the unshare backend may mount its new root over (privately): not above the workspace."""
    for candidate in ("/mnt", "/srv", "/media", "/opt", "/var/tmp", "/tmp"):
        if Path(candidate).is_dir() and not workspace.is_relative_to(candidate):
            return candidate
    raise SandboxError(
        f"no directory to stage the sandbox root in (workspace {workspace}); use backend bwrap"
    )


class Sandbox:
    """Runs commands in ``workspace`` under ``config``'s isolation and limits.

    Construction checks that the backend works here (``auto``: bwrap, else unshare) and raises
    :class:`~ctxrl.errors.SandboxError` if none does. The instance holds no processes between commands.
    """

    def __init__(self, workspace: str | Path, config: SandboxConfig | None = None) -> None:
        self.workspace = Path(workspace).resolve()
        self.workspace.mkdir(parents=True, exist_ok=True)
        self.config = config or SandboxConfig()
        self.as_root = os.geteuid() == 0
        self._reset_state()
        self.backend = self._pick_backend()
        if self.backend == "none":
            warnings.warn(
                f"sandbox backend 'none': commands run unisolated in {self.workspace}",
                RuntimeWarning,
                stacklevel=2,
            )

    def _reset_state(self) -> None:
        self._handed_over_mtime: int | None = None
        """The workspace root's mtime (ns) when it was last handed over; None: never."""
        self._usage = 0
        """The workspace's size in bytes when last measured (0 until a command writes much)."""
        self._files = 0
        """Its files, folders and links when last measured (0 until a command creates many)."""

    def _pick_backend(self) -> str:
        wanted = self.config.backend
        if wanted == "none":
            return "none"
        uid = self.config.sandbox_uid if self.as_root else None
        errors: list[str] = []
        for backend in ("bwrap", "unshare") if wanted == "auto" else (wanted,):
            problem = _probe(backend, uid)
            if problem is None:
                return backend
            errors.append(f"{backend}: {problem}")
        raise SandboxError(
            "no working command sandbox (" + "; ".join(errors) + "). Install bubblewrap "
            "(apt-get install bubblewrap, or run scripts/setup.sh), or set sandbox.backend: none to run "
            "commands unisolated."
        )

    # -- building the command line -------------------------------------------------------------------

    def _inner(self, command: str) -> list[str]:
        """The chain that runs inside the new root: drop privileges, set limits, run bash."""
        cfg = self.config
        limits = ["prlimit", f"--as={cfg.memory_mb * 1024 * 1024}", f"--nproc={cfg.max_processes}",
                  f"--fsize={cfg.disk_mb * 1024 * 1024}", "--"]  # fmt: skip
        shell = ["bash", "-c", command]
        if self.as_root:
            uid = cfg.sandbox_uid
            # Host root ignores RLIMIT_NPROC and owns the host, so become an unprivileged uid with no
            # capabilities; the extra user namespace makes the process count per sandbox, not per uid.
            return [
                "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
                "--bounding-set=-all", "--no-new-privs", "--",
                "unshare", "--user", f"--map-user={_INNER_UID}", f"--map-group={_INNER_UID}", "--",
                *limits, *shell,
            ]  # fmt: skip
        if self.backend == "unshare":
            # Root of its own user namespace only: drop every capability so it cannot undo the mounts.
            return [
                "setpriv",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--no-new-privs",
                "--",
                *limits,
                *shell,
            ]
        return [*limits, *shell]

    def _argv(self, command: str, info_fd: int | None = None) -> list[str]:
        tmp_bytes = self.config.tmp_mb * 1024 * 1024
        if self.backend == "bwrap":
            return _bwrap_argv(self.workspace, self.as_root, tmp_bytes, info_fd) + self._inner(command)
        if self.backend == "unshare":
            return _unshare_argv(self.workspace, self.as_root, tmp_bytes) + self._inner(command)
        return ["bash", "-c", command]

    def _hand_over_workspace(self) -> None:
        """As root, give the workspace to the sandbox uid so the command can edit what the harness wrote.

        The first time, the whole tree (``chown -R``, which walks any depth without recursion limits); later,
        only when the root's mtime says the host added or removed top-level entries between commands, those
        entries. No command runs between two calls, so nothing else can have changed the root. Symlinks are
        changed themselves, never followed: a link the model made to a host file must not hand that file over.
        """
        uid = self.config.sandbox_uid
        root = self.workspace
        mtime = os.lstat(root).st_mtime_ns
        if self._handed_over_mtime is None:
            _chown_tree(root, uid)
        elif mtime != self._handed_over_mtime:
            with os.scandir(root) as entries:
                for entry in entries:
                    with contextlib.suppress(FileNotFoundError):
                        if entry.stat(follow_symlinks=False).st_uid != uid:
                            _chown_tree(Path(entry.path), uid)
        self._handed_over_mtime = mtime

    def _measure(self) -> tuple[int, int]:
        """Measure the workspace now (bytes, inodes); the figures become the usage the next command starts
        from."""
        self._usage = _disk_usage(self.workspace)
        self._files = _disk_usage(self.workspace, inodes=True)
        return self._usage, self._files

    # -- running -------------------------------------------------------------------------------------

    def run(self, command: str, *, timeout_s: float | None = None) -> CommandResult:
        """Run ``command`` with bash in the workspace; never raises for what the command holds or does.

        A command with a null byte or a lone surrogate cannot be passed to a program: it is refused with exit
        code :data:`REFUSED_EXIT` and a one-line reason. When ``run`` returns, every process the command
        started has ended and been reaped (namespaced backends; with backend ``none`` only those still in its
        process group). The time it took counts into this thread's :func:`command_seconds`.
        """
        start = time.perf_counter()
        try:
            return self._run(command, timeout_s)
        finally:
            _COMMAND_TIME.seconds = command_seconds() + time.perf_counter() - start

    def _run(self, command: str, timeout_s: float | None) -> CommandResult:
        start = time.perf_counter()
        problem = _command_problem(command)
        if problem is not None:
            return CommandResult(command, REFUSED_EXIT, f"[sandbox] {problem}; nothing ran.\n", False, 0, 0.0)
        limit = timeout_s if timeout_s is not None else self.config.timeout_s
        if self.as_root and self.backend != "none":
            self._hand_over_workspace()
        deadline = start + limit
        info_r, info_w = os.pipe() if self.backend == "bwrap" else (-1, -1)
        try:
            proc = subprocess.Popen(
                self._argv(command, info_w if info_w >= 0 else None),
                cwd=self.workspace,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**_ENV, "HOME": str(self.workspace)} if self.backend == "none" else dict(_ENV),
                pass_fds=(info_w,) if info_w >= 0 else (),
            )
        finally:
            if info_w >= 0:
                os.close(info_w)
        try:
            result = self._collect(proc, command, start, deadline)
        finally:
            if info_r >= 0:
                _reap_namespace_init(info_r)
                os.close(info_r)
        if self.as_root and self._handed_over_mtime is not None:
            # The command's own changes to the root are its files: not the host's to hand over next time.
            with contextlib.suppress(OSError):
                self._handed_over_mtime = os.lstat(self.workspace).st_mtime_ns
        return result

    def _collect(
        self, proc: subprocess.Popen[bytes], command: str, start: float, deadline: float
    ) -> CommandResult:
        """Read the command's output under the time, output and disk limits; end it; build the result."""
        assert proc.stdout is not None
        cap = _OutputCap(self.config.max_output_bytes)
        quota = _QuotaWatch(self)
        timed_out = False
        over: tuple[int, int] | None = None
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            fd = proc.stdout.fileno()
            eof = False
            while not eof:
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    timed_out = True
                    break
                over = quota.check()
                if over is not None:
                    break
                if proc.poll() is not None:
                    break  # outer process done; drain below
                # Wake up now and then to notice an exit whose output pipe a leftover process holds open.
                if sel.select(min(remaining, _QUOTA_POLL_S * 2.5)):
                    chunk = os.read(fd, _READ_CHUNK)
                    eof = not chunk
                    cap.add(chunk)
            if eof and not timed_out and over is None:
                # Every writer closed the pipe, so the command is exiting: let it finish on its own
                # (killing it here would report a clean exit as 137).
                try:
                    proc.wait(timeout=max(0.0, deadline - time.perf_counter()))
                except subprocess.TimeoutExpired:
                    timed_out = True
            if timed_out or over is not None or proc.poll() is None:
                self._kill(proc)
            else:
                # With backend none, background processes would outlive the command; end its group.
                _killpg(proc.pid)
            # Whatever is left in the pipe, read within a grace period (the processes are gone or going).
            grace = time.perf_counter() + _DRAIN_GRACE_S
            while not eof and time.perf_counter() < grace:
                if sel.select(0.05):
                    chunk = os.read(fd, _READ_CHUNK)
                    eof = not chunk
                    cap.add(chunk)
        proc.stdout.close()
        returncode = proc.wait()
        if over is None and not timed_out:
            over = quota.check(final=True)
        if over is not None:
            # Measure again now that every writer is dead: what it wrote between the measurement and the kill
            # is the usage the next command starts from (cleaning up must not look like growing).
            now = self._measure()
            over = (max(over[0], now[0]), max(over[1], now[1]))
        text, cut = cap.result()
        if self.backend == "unshare" and text.endswith(UNSHARE_SIGKILL_LINE):
            # util-linux < 2.40 reports a child killed by SIGKILL (ours, at a limit, or the command's own)
            # as this error and exit 1; it is the kill, not a failure to start: say 137, drop the line
            text, returncode = text[: -len(UNSHARE_SIGKILL_LINE)], -signal.SIGKILL
        if over is not None:
            text += f"\n[sandbox] {self._over_quota_line(*over)}: the command was stopped; delete files to go on.\n"
        return CommandResult(
            command=command,
            exit_code=124 if timed_out else (128 - returncode if returncode < 0 else returncode),
            output=text,
            timed_out=timed_out,
            truncated_bytes=cut,
            duration_s=time.perf_counter() - start,
            over_quota=over is not None,
        )

    def _over_quota_line(self, usage: int, files: int) -> str:
        cfg = self.config
        if usage > cfg.disk_mb * 2**20:
            return f"the workspace holds {usage / 2**20:.0f} MiB, over its disk quota of {cfg.disk_mb} MiB"
        return f"the workspace holds {files:,} files and folders, over its quota of {cfg.max_files:,}"

    def _kill(self, proc: subprocess.Popen[bytes]) -> None:
        """End every process of the command, and wait until they are gone.

        Killing the pid namespace's init makes the kernel kill and reap everything in the namespace before the
        outer bwrap/unshare sees it exit, so waiting for the outer process waits for all of them.
        """
        if self.backend != "none":
            # Repeat: under load the outer process may not have forked the namespace's init yet.
            give_up = time.perf_counter() + _DRAIN_GRACE_S
            while time.perf_counter() < give_up:
                for child in _children(proc.pid):
                    _signal(child, signal.SIGKILL)
                try:
                    proc.wait(timeout=0.1)
                    return
                except subprocess.TimeoutExpired:
                    pass
        _killpg(proc.pid)
        proc.wait()

    def close(self) -> None:
        """Nothing to release (no process outlives ``run``); here so callers can treat it as a resource."""

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _QuotaWatch:
    """Watches one command's disk writes through the free space and free inodes of the workspace's
    filesystem.

    A ``statvfs`` every :data:`_QUOTA_POLL_S` costs microseconds whatever the workspace holds; only when the
    filesystem lost more bytes or inodes than the quotas have room for (other writers on the same disk count
    too, so this over-estimates) is the workspace itself measured, at most every :data:`_MEASURE_EVERY_S`.
    The command is over quota when the measured workspace is above ``disk_mb`` (or ``max_files``) **and**
    above what it held when the command started (as last measured): a workspace already over quota can still
    be cleaned up, never grown. A command may overshoot by what it writes between two polls and the
    measurement (tens of ms of writing).
    """

    def __init__(self, box: Sandbox) -> None:
        self.box = box
        self.quota = (box.config.disk_mb * 1024 * 1024, box.config.max_files)
        self.start = (box._usage, box._files)
        self.room = (max(0, self.quota[0] - box._usage), max(0, self.quota[1] - box._files))
        self.free0 = _free_space(box.workspace)
        self.next_poll = 0.0
        self.next_measure = 0.0

    def check(self, *, final: bool = False) -> tuple[int, int] | None:
        """The workspace's bytes and inodes if it was measured over quota now, else None."""
        now = time.perf_counter()
        if self.free0 is None or (now < self.next_poll and not final):
            return None
        self.next_poll = now + _QUOTA_POLL_S
        free = _free_space(self.box.workspace)
        if free is None or (now < self.next_measure and not final):
            return None
        if all(before - after <= room for before, after, room in zip(self.free0, free, self.room)):
            return None
        self.next_measure = now + _MEASURE_EVERY_S
        usage = self.box._measure()
        if any(u > q and u > s for u, q, s in zip(usage, self.quota, self.start)):
            return usage
        # Re-base: what the measurement saw is the usage now; only later writes count against the room.
        self.room = (max(0, self.quota[0] - usage[0]), max(0, self.quota[1] - usage[1]))
        self.free0 = free
        return None


def _free_space(path: Path) -> tuple[int, int] | None:
    """Free bytes and free inodes of ``path``'s filesystem (inodes as 0 where it does not count them)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize, st.f_favail if st.f_files else 0


def _disk_usage(path: Path, *, inodes: bool = False) -> int:
    """Bytes of disk the tree at ``path`` uses, or with ``inodes`` its files, folders and links (``du``: any
    depth, hard links once, this filesystem only)."""
    try:
        done = subprocess.run(
            ["du", "-s", "-x", "--inodes" if inodes else "-B1", "--", str(path)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
            check=False,
        )
        return int(done.stdout.split()[0])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        # Not measurable (a tree too large to walk in time): count it as full, the safe side of a quota.
        return 1 << 62


def _chown_tree(path: Path, uid: int) -> None:
    """``chown -R`` without following symlinks; walks any depth (no recursion limit on this side)."""
    if path.is_symlink() or not path.is_dir():
        with contextlib.suppress(FileNotFoundError):
            os.chown(path, uid, uid, follow_symlinks=False)
        return
    subprocess.run(
        ["chown", "-R", "-P", "-h", f"{uid}:{uid}", "--", str(path)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )


def remove_tree(path: str | Path) -> None:
    """Remove a file, a symlink (never what it points to) or a directory tree of any depth; never raises.

    ``shutil.rmtree`` recurses once per level in Python and raises ``RecursionError`` on a tree about a
    thousand levels deep, which ``ignore_errors`` does not cover; ``rm -rf`` has no such limit.
    """
    path = Path(path)
    if not os.path.lexists(path):
        return
    if path.is_symlink() or not path.is_dir():
        with contextlib.suppress(OSError):
            path.unlink()
        return
    with contextlib.suppress(OSError, RecursionError):
        shutil.rmtree(path)
    if os.path.lexists(path):
        with contextlib.suppress(OSError):
            subprocess.run(
                ["rm", "-rf", "--one-file-system", "--", str(path)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                check=False,
            )


def _command_problem(command: str) -> str | None:
    """Why ``command`` cannot be handed to bash (None if it can)."""
    if "\0" in command:
        return "the command contains a null byte (\\0), which no program argument can hold"
    try:
        size = len(command.encode("utf-8"))
    except UnicodeEncodeError as exc:
        return f"the command is not valid text (a lone surrogate at character {exc.start})"
    if size > MAX_COMMAND_BYTES:
        return (
            f"the command is {size:,} bytes, over the {MAX_COMMAND_BYTES:,}-byte limit of one program argument; "
            "write long content to a file in several commands"
        )
    return None


def _reap_namespace_init(info_fd: int) -> None:
    """Reap bubblewrap's namespace init if it was left to this process.

    The outer bwrap exits once it has the command's status, without waiting for its child, the namespace's
    pid 1; that child is re-parented to the nearest reaper. When that reaper is this process (pid 1 of a
    container, or a subreaper) nobody else will wait for it, so it would stay a zombie. Its pid comes from
    bwrap's ``--info-fd``.
    """
    os.set_blocking(info_fd, False)
    try:
        data = os.read(info_fd, 4096)
        child = int(loads_bounded(data.decode()).get("child-pid", 0))
    except (OSError, ValueError, AttributeError):
        return
    if child <= 0:
        return
    give_up = time.perf_counter() + _DRAIN_GRACE_S
    while _parent_of(child) == os.getpid():
        try:
            pid, _ = os.waitpid(child, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == child or time.perf_counter() > give_up:
            return
        time.sleep(0.001)


def _parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _killpg(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _bwrap_argv(workspace: Path, as_root: bool, tmp_bytes: int, info_fd: int | None = None) -> list[str]:
    argv = ["bwrap", "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox"]  # fmt: skip
    if info_fd is not None:
        argv += ["--info-fd", str(info_fd)]  # tells the namespace init's pid, to reap it (see run)
    if not as_root:
        # Unprivileged bwrap needs a user namespace; as root the inner chain makes its own (see _inner),
        # because bwrap's would map the command to host root, which ignores RLIMIT_NPROC.
        argv += ["--unshare-user", "--uid", str(_INNER_UID), "--gid", str(_INNER_UID)]
    for name, target in _system_entries():
        argv += (
            ["--symlink", target, f"/{name}"] if target is not None else ["--ro-bind", f"/{name}", f"/{name}"]
        )
    # bwrap would create /etc as 0700 root, which the unprivileged command cannot enter.
    argv += ["--perms", "0755", "--dir", "/etc"]
    for name in _etc_entries():
        argv += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    argv += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(tmp_bytes), "--tmpfs", "/tmp",
             "--bind", str(workspace), SANDBOX_WORKDIR,
             "--remount-ro", "/", "--chdir", SANDBOX_WORKDIR, "--"]  # fmt: skip
    return argv


def _unshare_argv(workspace: Path, as_root: bool, tmp_bytes: int) -> list[str]:
    """util-linux ``unshare`` plus a setup script that builds the same view as bwrap and pivots into it."""
    q = shlex.quote
    script = ["set -eu", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", f"r={q(_staging_dir(workspace))}",
              'mount -t tmpfs -o mode=0755 ctxrl "$r"', 'cd "$r"', "mkdir etc dev tmp proc .old"]  # fmt: skip

    def ro_bind(src: str, dst: str) -> None:
        make = f"mkdir -p {q(dst)}" if os.path.isdir(src) else f"touch {q(dst)}"
        script.append(f"{make} && mount --bind {q(src)} {q(dst)} && mount -o remount,bind,ro {q(dst)}")

    for name, target in _system_entries():
        if target is not None:
            script.append(f"ln -s {q(target)} {q(name)}")
        else:
            ro_bind(f"/{name}", name)
    for name in _etc_entries():
        ro_bind(f"/etc/{name}", f"etc/{name}")
    for dev in ("null", "zero", "full", "random", "urandom", "tty"):
        script.append(f"touch dev/{dev} && mount --bind /dev/{dev} dev/{dev}")
    script += [
        "ln -s /proc/self/fd dev/fd && ln -s /proc/self/fd/0 dev/stdin",
        "ln -s /proc/self/fd/1 dev/stdout && ln -s /proc/self/fd/2 dev/stderr",
        "mkdir workspace && mount --bind " + q(str(workspace)) + " workspace",
        f"mount -t tmpfs -o mode=1777,size={tmp_bytes} tmp tmp",
        "mount -t proc proc proc",
        "pivot_root . .old",
        "cd / && umount -l /.old && rmdir /.old",
        "mount -o remount,bind,ro /",
        f"cd {SANDBOX_WORKDIR}",
        'exec "$@"',
    ]
    argv = ["unshare"]
    if not as_root:
        argv += ["--user", "--map-root-user"]
    argv += [
        "--mount",
        "--propagation",
        "private",
        "--pid",
        "--fork",
        "--kill-child",
        "--net",
        "--ipc",
        "--uts",
    ]
    return [*argv, "--", "/bin/sh", "-c", "\n".join(script), "sandbox-setup"]


@functools.cache
def _probe(backend: str, sandbox_uid: int | None) -> str | None:
    """None if ``backend`` runs a command here (checked once per process), else what went wrong."""
    with tempfile.TemporaryDirectory(prefix="ctxrl-sandbox-probe-") as tmp:
        os.chmod(tmp, 0o755)
        # Built by hand, not through __init__, which calls this probe.
        box = object.__new__(Sandbox)
        box.workspace = Path(tmp).resolve()
        box.config = SandboxConfig(timeout_s=10.0, sandbox_uid=sandbox_uid or SandboxConfig.sandbox_uid)
        box.as_root = sandbox_uid is not None
        box._reset_state()
        box.backend = backend
        try:
            result = box.run("echo ok > probe && cat probe")
        except OSError as exc:  # the backend's executable is missing
            return str(exc)
    if result.exit_code == 0 and result.output == "ok\n":
        return None
    return f"exit {result.exit_code}: {result.output.strip()[-300:]}"


def sandbox_overhead_ms(repeats: int = 20, config: SandboxConfig | None = None) -> float:
    """Median extra wall time, in ms, of running ``true`` through the sandbox instead of a plain subprocess.

    Pairs are interleaved (sandboxed, then plain ``bash -c true``) so load drift affects both alike; the
    median of the per-pair differences is returned. ``config`` defaults to ``SandboxConfig()`` (backend auto).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, not {repeats}")
    diffs: list[float] = []
    with tempfile.TemporaryDirectory(prefix="ctxrl-sandbox-bench-") as tmp:
        box = Sandbox(tmp, config)
        box.run("true")  # warm caches (first exec of each binary)
        for _ in range(repeats):
            t0 = time.perf_counter()
            box.run("true")
            t1 = time.perf_counter()
            subprocess.run(["bash", "-c", "true"], cwd=tmp, stdin=subprocess.DEVNULL, check=True)
            t2 = time.perf_counter()
            diffs.append((t1 - t0) - (t2 - t1))
    return 1000.0 * statistics.median(diffs)
