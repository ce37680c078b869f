"""What the entry points (train.py, prepare.py, advise) share: config registration, the command
line's group choices, how a job reports failure and ends, signals."""

from __future__ import annotations

import difflib
import hashlib
import logging
import os
import signal
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from facebench import loaders
from facebench.config import register_configs, typed
from facebench.errors import FacebenchError, Interrupted, TrackingLost, interruption
from facebench.host import parent_death, printable
from facebench.host.distributed import agent_pid
from facebench.host.paths import PROJECT_ROOT
from facebench.run.guesses import FORM, own_pipeline_guess

log = logging.getLogger("facebench")
T = TypeVar("T")


def configure() -> None:
    """Register every schema (and the run-folder resolver) before Hydra composes the config."""
    register_configs()
    loaders.register_schemas()
    if not OmegaConf.has_resolver("facebench_run_dir"):
        OmegaConf.register_new_resolver("facebench_run_dir", run_dir)
    sys.argv = [sys.argv[0], *(spelled_now(arg) for arg in sys.argv[1:])]
    loaders.add_search_path(sys.argv[1:])  # a user's own loader/*.yaml: choices like any other
    unknown = own_pipeline_guess(sys.argv[1:], loaders.names()) or unknown_choice(sys.argv[1:])
    if unknown:
        sys.exit(unknown)  # one line on stderr, status 1, before Hydra lists its search path


# Group choices renamed, by their old name: the old spelling still runs, with a note.
RENAMED = {
    ("loader", "synthetic"): (
        "ceiling",
        "the compute ceiling is loader=ceiling (data=synthetic is the generated data)",
    ),
}


def spelled_now(arg: str) -> str:
    """A command-line argument as it is spelled now: `+experiment=article` (which Hydra refuses
    since `experiment` is in train.yaml's defaults) as `experiment=article`, and a renamed
    choice (in a sweep's list too) by its new name, with a note on stderr."""
    if arg.startswith("+experiment="):
        return arg.removeprefix("+")
    group, sep, values = arg.partition("=")
    if not sep:
        return arg
    renamed = []
    for value in values.split(","):
        new, note = RENAMED.get((group, value), (value, ""))
        if note:
            print(f"{group}={value}: {note}; running {group}={new}", file=sys.stderr)
        renamed.append(new)
    return f"{group}={','.join(renamed)}"


def unknown_choice(args: list[str], conf: Path = PROJECT_ROOT / "conf") -> str | None:
    """`loader=datapipes`, `data=celeb`, or a sweep's `loader=dataset,datapipes`: the line that
    names the closest real choice (Hydra's own error lists every file of the group and its
    search path, and names none). None when every group choice is a file of its group (or,
    for loader=, a loader in the command's search path), or, for the other groups, when the
    command adds search paths of its own."""
    searched = any(arg.startswith("hydra.searchpath") for arg in args)
    for arg in args:
        group, sep, values = arg.partition("=")
        folder = conf / group
        if not sep or not group.isidentifier() or not folder.is_dir():
            continue
        if searched and group != "loader":
            continue  # its choices may be in the search path's folders
        choices = sorted(path.stem for path in folder.glob("*.yaml"))
        if group == "loader":
            choices = loaders.names()
        for value in values.split(","):
            if value in choices or value == "null" or not value.isidentifier():
                continue  # a sweep's glob(), range() or choice() is Hydra's to read
            closest = _closest(value, choices)
            hint = f"; did you mean {group}={closest}?" if closest else ""
            if group == "loader" and not closest:
                hint = f"; your own pipeline: {FORM.format(target='mymodule.MyDataset')}"
            return (
                f"{group}={value}: no such choice (conf/{group}/ holds {', '.join(choices)}){hint}"
            )
    return None


def _closest(value: str, choices: list[str]) -> str | None:
    """The choice a typo most likely meant: one that starts with it or that it starts with,
    else the nearest spelling."""
    for choice in choices:
        if choice.startswith(value) or value.startswith(choice):
            return choice
    found = difflib.get_close_matches(value, choices, n=1, cutoff=0.5)
    return found[0] if found else None


def run_dir() -> str:
    """The output folder's name: the time, or under torchrun the job's id, so that every rank
    of one job (started a second apart, maybe) writes to the same folder."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != "none" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return f"torchrun/{run_id}"
    return datetime.now().strftime("%Y-%m-%d/%H-%M-%S")


# Set for the ranks a job starts on one host (facebench/run/per_host.py): they are that job.
SWEEP_ID_ENV = "FACEBENCH_SWEEP_ID"
MULTIRUN_ENV = "FACEBENCH_MULTIRUN"


def sweep_id() -> str:
    """An id shared by every job of one multirun (and unique to a single run)."""
    if os.environ.get(SWEEP_ID_ENV):
        return os.environ[SWEEP_ID_ENV]
    hydra = HydraConfig.get()
    folder = hydra.sweep.dir if hydra.mode == RunMode.MULTIRUN else hydra.runtime.output_dir
    return hashlib.sha1(os.fsencode(str(Path(folder).resolve()))).hexdigest()[:10]


def user_message(error: FacebenchError) -> str:
    """The message, without the worker traceback a DataLoader wraps around errors from workers."""
    text = str(error)
    marker = f"{type(error).__name__}: "
    if "Original Traceback" in text and marker in text:
        return text.rsplit(marker, 1)[1].strip()
    return text


def run_job(task: Callable[..., T], cfg: DictConfig) -> T | None:
    """Run one job; a user error is one clear line, not a traceback.

    In a single run it exits with status 1 (3 where the job finished but MLflow failed during
    it: TrackingLost). In a multirun the sweep goes on with its other jobs: where the sweep ends
    with a summary (train.py's), that summary lists the failed job and sets the exit status;
    elsewhere the error is re-raised, so Hydra marks this job failed (and exits non-zero at the
    end). Ctrl-C or SIGTERM stops the job (and a sweep) with one line and status 130 or 143;
    HYDRA_FULL_ERROR=1 shows the traceback instead.
    """
    install_process_handlers()
    printable.install()  # Hydra's handlers: a file name with odd bytes is logged, not a failure
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    output_dir = Path(HydraConfig.get().runtime.output_dir)
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN or os.environ.get(MULTIRUN_ENV) == "1"
    try:
        _named_by_choice(cfg)
        return task(typed(cfg), output_dir=output_dir, sweep_id=sweep_id(), multirun=multirun)
    except BaseException as error:
        return _end(error, multirun, distributed)


def _named_by_choice(cfg: DictConfig) -> None:
    """A loader from the user's own config folder (loader=shop, whose file starts from
    `custom`) runs, and is recorded, under its own name."""
    choice = HydraConfig.get().runtime.choices.get("loader")
    if choice and "loader" in cfg and loaders.user_file(choice) is not None:
        cfg.loader.name = choice


def _end(error: BaseException, multirun: bool, distributed: bool) -> None:
    """How a job that raised ends: one line and an exit status, the error passed on, or (in a
    sweep whose summary reports it) nothing more."""
    stop = interruption(error)
    if stop is not None and os.environ.get("HYDRA_FULL_ERROR") != "1":
        # The run (and a sweep's later jobs) stop here, workers with it.
        interrupted = Interrupted.of(stop, "stopped before anything was recorded")
        log.error("%s", interrupted)
        sys.exit(interrupted.exit_code)
    if isinstance(error, FacebenchError):
        log.error("%s", user_message(error))
        if multirun and not distributed:
            if _sweep_summarised():
                return None
            raise error
        sys.exit(error.exit_code if isinstance(error, TrackingLost) else 1)
    if isinstance(error, Exception) and distributed:
        # One rank failing must end the job: going on to the next job of a sweep would pair
        # its collectives with the other ranks' and hang or mix up the runs.
        log.error("this rank failed; ending the job", exc_info=error)
        sys.exit(1)
    raise error


def _sweep_summarised() -> bool:
    """Whether this sweep ends with facebench's summary, which reads every job's results.json
    and exits non-zero for the failed ones (facebench.report.sweep_summary)."""
    return "sweep_summary" in (HydraConfig.get().callbacks or {})


_job_pid = 0
_REDELIVER_S = 0.1
_swallowed: KeyboardInterrupt | None = None  # the last interrupt a finalizer dropped
_stopping = False  # a Ctrl-C or SIGTERM is ending the job

# How long a rank whose torchrun agent is gone (killed with its job) has to stop in order, as if
# the agent had stopped it, before it leaves at once: a rank stops within a second or two.
RANK_STOP_GRACE_S = 5.0


def install_process_handlers() -> None:
    """How this process, and the workers it forks, end and report failures.

    SIGTERM (torchrun stopping the other ranks, SLURM's scancel or time limit) ends the job like
    Ctrl-C: runs are closed as KILLED and workers stopped, rather than left RUNNING. Either one
    raised inside a finalizer, which drops it, is delivered again a moment later. A worker
    whose main process stopped listening (it failed, and says why in one line) goes without
    printing the broken pipe's traceback. Every process forked from here on dies with its
    parent, even one killed with SIGKILL (facebench.host.parent_death), and so does a rank
    started by torchrun's agent: it stops, as on SIGTERM, once the agent is gone.
    """
    global _job_pid
    _job_pid = os.getpid()
    parent_death.install()
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGALRM, _redeliver)
    if not getattr(sys.unraisablehook, "facebench", False):
        sys.unraisablehook = _swallowed_interrupts(sys.unraisablehook)
        sys.unraisablehook.facebench = True  # type: ignore[attr-defined]
    sys.excepthook = _quiet_broken_pipes_in_workers
    agent = agent_pid()
    if agent is not None:
        # An agent killed outright (with its job, by the OOM killer) cannot stop its ranks,
        # which it starts in sessions of their own: they would run on, feeding no one.
        parent_death.end_with(agent, "torchrun's agent", signal.SIGTERM, RANK_STOP_GRACE_S)


def _quiet_broken_pipes_in_workers(kind: type[BaseException], error: BaseException, tb) -> None:
    # multiprocessing's resource sharer (how a worker hands a tensor's file descriptor over)
    # reports a receiver that went away through sys.excepthook, as a full traceback.
    if os.getpid() != _job_pid and issubclass(kind, (BrokenPipeError, ConnectionResetError)):
        return
    sys.__excepthook__(kind, error, tb)


def _interrupt(signum: int, frame: object) -> None:
    if os.getpid() != _job_pid:
        # A forked worker inherits this handler; multiprocessing ends its daemonic workers
        # with SIGTERM at exit, and a worker should then just go, without a traceback, and
        # without leaving the folder of its file-descriptor sockets in /tmp.
        parent_death.remove_own_tempdir()
        os._exit(128 + signum)
    global _stopping
    _stopping = True
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _swallowed_interrupts(hook: Any) -> Any:
    """sys.unraisablehook: a Ctrl-C or SIGTERM raised where Python cannot pass it on (a
    finalizer, such as a loader iterator's __del__ shutting its workers down, or a fork hook)
    was printed as "Exception ignored" and dropped, and the run went on. It is delivered again a
    moment later instead, by SIGALRM: a timer needs no lock that the dropping code may hold."""

    def unraisable(args: Any) -> None:
        if os.getpid() == _job_pid and isinstance(args.exc_value, KeyboardInterrupt):
            global _swallowed
            _swallowed = args.exc_value
            signal.setitimer(signal.ITIMER_REAL, _REDELIVER_S)
            return
        if _stopping and os.environ.get("HYDRA_FULL_ERROR") != "1":
            # Objects cut short by the stop fail to finalize (a DataLoader iterator interrupted
            # while it was being built, say): noise after the one line that says what happened.
            log.debug("while stopping: %r in %r", args.exc_value, args.object)
            return
        hook(args)

    return unraisable


def _redeliver(signum: int, frame: object) -> None:
    if _swallowed is not None:
        raise KeyboardInterrupt(*_swallowed.args)
