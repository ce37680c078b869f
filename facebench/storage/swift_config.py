"""The local object server's files: Swift's configs for its four daemons, and its rings.

One user, ACCESS_KEY / SECRET_KEY (Swift's tempauth), in one region; each daemon one process
(workers = 0), on 127.0.0.1, logging warnings only. The proxy's pipeline is Swift's with its S3
middleware (s3api) and memcache; its data live under <root>/data/d1.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from facebench.errors import StorageError

ACCESS_KEY = "facebench:admin"  # tempauth's <account>:<user>
SECRET_KEY = "facebench-local"
REGION = "us-east-1"

DAEMON = [sys.executable, "-m", "facebench.storage.swift_daemon"]

_PROXY_PIPELINE = (
    "catch_errors gatekeeper healthcheck proxy-logging cache listing_formats s3api tempauth "
    "copy slo dlo proxy-logging proxy-server"
)
# Pipeline name -> Swift's entry point, for the filters that take no settings.
_PROXY_FILTERS = {
    "catch_errors": "catch_errors",
    "gatekeeper": "gatekeeper",
    "healthcheck": "healthcheck",
    "proxy-logging": "proxy_logging",
    "listing_formats": "listing_formats",
    "copy": "copy",
    "slo": "slo",
    "dlo": "dlo",
}


def write_rings(swift_dir: Path, ports: dict[str, int]) -> None:
    kinds = ("account", "container", "object")
    command = [*DAEMON, "rings", str(swift_dir), *(str(ports[kind]) for kind in kinds)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise StorageError(f"the local object server's rings were not built: {done.stderr[-500:]}")


def _ini(sections: dict[str, dict[str, str | int]]) -> str:
    return "".join(
        f"[{name}]\n" + "".join(f"{key} = {value}\n" for key, value in values.items()) + "\n"
        for name, values in sections.items()
    )


def write_configs(root: Path, ports: dict[str, int], memcache_port: int) -> None:
    swift_dir = root / "conf"
    common = {
        "bind_ip": "127.0.0.1",
        "workers": 0,  # one process each: on a small machine the loaders need the cores
        "swift_dir": str(swift_dir),
        "log_level": "WARNING",
        "log_name": "facebench-s3server",
    }
    (swift_dir / "swift.conf").write_text(
        _ini(
            {
                "swift-hash": {"swift_hash_path_suffix": "facebench", "swift_hash_path_prefix": ""},
                "storage-policy:0": {"name": "default", "default": "yes"},
            }
        )
    )
    for kind in ("account", "container", "object"):
        server = {"devices": str(root / "data"), "mount_check": "false"}
        config = {
            "DEFAULT": {**common, **server, "bind_port": ports[kind]},
            "pipeline:main": {"pipeline": f"{kind}-server"},
            f"app:{kind}-server": {"use": f"egg:swift#{kind}"},
        }
        (swift_dir / f"{kind}-server.conf").write_text(_ini(config))
    proxy = {
        "DEFAULT": {**common, "bind_port": ports["proxy"]},
        "pipeline:main": {"pipeline": _PROXY_PIPELINE},
        "app:proxy-server": {"use": "egg:swift#proxy", "account_autocreate": "true"},
        # With no memcached, a port nothing listens on: tempauth and s3api need the filter, and
        # the proxy then looks every account and container up again (slower, still correct).
        "filter:cache": {
            "use": "egg:swift#memcache",
            "memcache_servers": f"127.0.0.1:{memcache_port}",
        },
        "filter:s3api": {"use": "egg:swift#s3api", "location": REGION},
        "filter:tempauth": {
            "use": "egg:swift#tempauth",
            "user_facebench_admin": f"{SECRET_KEY} .admin",
        },
        **{f"filter:{name}": {"use": f"egg:swift#{egg}"} for name, egg in _PROXY_FILTERS.items()},
    }
    (swift_dir / "proxy-server.conf").write_text(_ini(proxy))
