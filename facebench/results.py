"""results.json: everything one training job recorded, kept whether or not MLflow took it.

The runner fills a JobResults as the job goes and writes it when the job ends, however it ends;
the sweep summary reads it back, and `python -m facebench.upload` replays it into MLflow as the
run it would have been (its name, params, tags, each epoch's metrics at its step, the job's
metrics, its start and end, its artifacts). Files written before a field existed read with that
field's default.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from facebench.errors import FacebenchError

RESULTS = "results.json"
# How the run reached MLflow: not asked (tracking=false), logged, or lost mid-run (the store
# failed once the run had started; results.json then holds what MLflow is missing).
TRACKING_OFF, TRACKING_LOGGED, TRACKING_LOST = "off", "mlflow", "lost"


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class JobResults:
    run_name: str
    params: dict[str, Any]
    tags: dict[str, str]
    # Names this job's run however often it is uploaded (facebench.upload finds it by this).
    job_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    status: str = "FAILED"  # until the job says otherwise: FINISHED, or KILLED
    metrics: dict[str, float] = field(default_factory=dict)  # the job's, and its last epoch's
    epochs: list[dict[str, float]] = field(default_factory=list)  # each epoch's, by step
    start_time_ms: int = field(default_factory=now_ms)
    end_time_ms: int = 0
    multirun: bool = False
    tracking: str = TRACKING_OFF
    tracking_error: str = ""  # what failed, where tracking is TRACKING_LOST
    run_id: str = ""  # the MLflow run opened for the job, if any
    compare_url: str = ""
    ui_command: str = ""
    classes: dict[str, str] = field(default_factory=dict)  # folder data's class-to-index map

    def write(self, folder: Path) -> Path:
        path = folder / RESULTS
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n", "utf-8")
        return path

    @classmethod
    def read(cls, path: Path) -> JobResults:
        """A training job's results.json; one line naming the file when it is not one."""
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise FacebenchError(f"{path}: cannot be read ({error})") from None
        if not isinstance(raw, dict) or "run_name" not in raw or "params" not in raw:
            raise FacebenchError(
                f"{path}: not the results of a train.py job (prepare.py's, say): nothing to "
                "put into MLflow"
            )
        known = {f.name for f in fields(cls)}
        results = cls(**{key: value for key, value in raw.items() if key in known})
        if "job_id" not in raw:  # written before jobs had ids: one from where it lies
            results.job_id = hashlib.sha1(os.fsencode(path.resolve())).hexdigest()
        return results

    @property
    def not_in_mlflow(self) -> bool:
        """The job asked for MLflow and MLflow failed during it."""
        return self.tracking == TRACKING_LOST


def write_results(path: Path, results: Mapping[str, Any]) -> None:
    """Any job's results as JSON (prepare.py's have a shape of their own)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n", encoding="utf-8")
