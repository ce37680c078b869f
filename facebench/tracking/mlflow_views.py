"""What a user sees in MLflow's UI: the runs table with facebench's headline numbers, by URL.

MLflow 3.17's UI opens an experiment on its GenAI overview unless the URL says
`workflowType=machine_learning` (the experiment tag `mlflow.experimentKind`, set too for versions
that read it, is ignored by 3.17), and its runs table shows no metric or param column until asked.
A shared view asks: `#/experiments/<id>/runs?viewStateShareKey=<key>` loads the columns, sort and
filter stored in the experiment tag `mlflow.sharedViewState.<key>`, a JSON envelope whose `state`
is zlib-compressed JSON ("deflate;" + base64), as the UI's own "Save view" writes it. The key
must go on the `/runs` route: the experiment's root redirects and drops it.
"""

from __future__ import annotations

import base64
import json
import time
import zlib
from typing import Any

SHARED_VIEW_TAG = "mlflow.sharedViewState."
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
TRAINING_KIND = "custom_model_development"
_TAG_LIMIT = 20_000  # MLflow's longest experiment tag value
UI_ADDRESS = "http://127.0.0.1:5000"  # where `mlflow ui` listens by default

# What a sweep is compared on: the headline numbers, then the choices that vary. Few enough to
# fit beside the run names without scrolling; every other column is a click away.
METRIC_COLUMNS = (
    "images_per_s",
    "epoch_time_s",
    "data_wait_frac",
    "gpu_busy_frac",
    "gpu_util_mean",
    "au",
    "storage_requests_per_s",  # storage=s3 only: a bucket's request rate and latency
    "storage_get_p50_ms",
)
PARAM_COLUMNS = ("loader", "n_workers", "host_only")
# Which data set and how many samples ("synthetic 6,000"); where the workers' time goes, as
# "decode 53%" (facebench/stages.py).
TAG_COLUMNS = ("data_set", "dominant_stage")
_RUN_NAME = "attributes.`Run Name`"


def column(kind: str, key: str) -> str:
    """The UI's column id: metrics.`images_per_s`, params.`loader`, tags.`sweep_id`."""
    return f"{kind}.`{key}`"


NEWEST_FIRST = "attributes.start_time"
FASTEST_FIRST = column("metrics", "images_per_s")


def view_state(search_filter: str, order_by: str = FASTEST_FIRST) -> dict[str, Any]:
    """A runs-table view of the runs the filter selects: facebench's columns, sorted by
    `order_by` (a column id) from the largest."""
    selected = [column("metrics", key) for key in METRIC_COLUMNS]
    selected += [column("params", key) for key in PARAM_COLUMNS]
    selected += [column("tags", key) for key in TAG_COLUMNS]
    return {
        "searchFilter": search_filter,
        "orderByKey": order_by,
        "orderByAsc": False,
        "startTime": "ALL",
        "lifecycleFilter": "Active",
        "modelVersionFilter": "All Runs",
        "datasetsFilter": [],
        "selectedColumns": selected,
        # A width applies only to a column listed in the order: room for whole run names.
        "columnOrder": [_RUN_NAME, *selected],
        "columnWidths": {
            _RUN_NAME: 270,
            **{column("tags", key): 150 for key in TAG_COLUMNS},  # "transform 53%" in full
        },
        "runsHiddenMode": "SHOW_ALL",
        "viewMaximized": False,
        "runListHidden": False,
    }


def envelope(name: str, state: dict[str, Any]) -> str:
    """The experiment tag's value, as the UI writes it (and lists it under "Saved views")."""
    packed = zlib.compress(json.dumps(state, separators=(",", ":")).encode())
    now = int(time.time() * 1000)
    value = json.dumps(
        {
            "name": name,
            "createdAt": now,
            "updatedAt": now,
            "state": "deflate;" + base64.b64encode(packed).decode("ascii"),
        }
    )
    if len(value) > _TAG_LIMIT:
        raise ValueError(f"view {name!r} is {len(value)} characters; MLflow keeps {_TAG_LIMIT}")
    return value


def read_view(value: str) -> dict[str, Any]:
    """A view's state back from its tag value (for checks and tests)."""
    state = json.loads(value)["state"]
    return json.loads(zlib.decompress(base64.b64decode(state.removeprefix("deflate;"))))


def publish(
    client: Any,
    experiment_id: str,
    key: str,
    name: str,
    search_filter: str,
    order_by: str = FASTEST_FIRST,
) -> None:
    """Store the view under `key` in the experiment, replacing an older one of that key."""
    value = envelope(name, view_state(search_filter, order_by))
    client.set_experiment_tag(experiment_id, SHARED_VIEW_TAG + key, value)


def runs_url(experiment_id: str, key: str | None = None, address: str = UI_ADDRESS) -> str:
    """The URL that opens the runs table (with a shared view), not the GenAI overview."""
    query = f"viewStateShareKey={key}&" if key else ""
    return f"{address}/#/experiments/{experiment_id}/runs?{query}workflowType=machine_learning"
