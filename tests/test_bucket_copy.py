"""The emulated bucket answers from its copy exactly what the endpoint answers (bytes, ETags,
the object's headers, errors), for the bundled server and another S3 server (moto's); the copy
follows the bucket (a new upload is fetched again, never served stale), and refuses up front a
disk it would not fit."""

from __future__ import annotations

import hashlib
import os
import shutil

import boto3
import botocore.config
import botocore.exceptions
import pytest

from facebench.config import StorageConfig
from facebench.errors import StorageError
from facebench.storage import bucket_copy, client, objects, server
from facebench.storage.address import parse
from facebench.storage.distance import counters, emulated

pytest.importorskip("swift", reason="the local object server needs pip install -e '.[s3server]'")

PREFIX = "copy"
# Names a client must encode (a space, a non-ASCII letter, a plus), small and large objects.
OBJECTS = {
    "a.bin": os.urandom(300_000),
    "with space/é+1.png": os.urandom(20_000),
    "empty": b"",
}
# The headers that describe an object (the rest belong to the request: a date, an id).
DESCRIBING = ("etag", "content-length", "content-type", "last-modified", "content-range")


def _boto(address: str, secret: str = server.SECRET_KEY):
    return boto3.client(
        "s3", endpoint_url=address, region_name=server.REGION,
        aws_access_key_id=server.ACCESS_KEY, aws_secret_access_key=secret,
        config=botocore.config.Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )  # fmt: skip


def _keys(endpoint: str, answers: str) -> StorageConfig:
    return StorageConfig(
        name="s3", url=f"s3://{server.BUCKET}/{PREFIX}", endpoint=endpoint, region=server.REGION,
        path_style=True, latency_ms=1, answers=answers,
    )  # fmt: skip


def _answer(s3, call: str, **arguments) -> tuple:
    """What a boto3 call got: its status, the describing headers and the body, or the error."""
    try:
        answer = getattr(s3, call)(**arguments)
    except botocore.exceptions.ClientError as error:
        meta = error.response["ResponseMetadata"]
        return meta["HTTPStatusCode"], error.response["Error"]["Code"]
    headers = answer["ResponseMetadata"]["HTTPHeaders"]
    described = {name: headers.get(name) for name in DESCRIBING}
    body = answer["Body"].read() if "Body" in answer else None
    if call == "list_objects_v2":
        body = [(item["Key"], item["ETag"], item["Size"]) for item in answer.get("Contents", [])]
    return answer["ResponseMetadata"]["HTTPStatusCode"], described, body


def _requests() -> list[tuple[str, dict]]:
    asked: list[tuple[str, dict]] = []
    for name in OBJECTS:
        key = f"{PREFIX}/{name}"
        asked += [("get_object", {"Key": key}), ("head_object", {"Key": key})]
        if OBJECTS[name]:
            asked += [("get_object", {"Key": key, "Range": "bytes=10-99"}),
                      ("get_object", {"Key": key, "Range": "bytes=-50"})]  # fmt: skip
    asked += [("get_object", {"Key": f"{PREFIX}/missing"})]
    asked += [("list_objects_v2", {"Prefix": f"{PREFIX}/"})] * 2  # the endpoint's, then the copy's
    # Conditions on the ETag (the CRT client sends If-Match with each part of a large object):
    # met, from the copy; not met, the endpoint's 412 and 304.
    etag, key = f'"{hashlib.md5(OBJECTS["a.bin"]).hexdigest()}"', f"{PREFIX}/a.bin"
    asked += [("get_object", {"Key": key, "IfMatch": etag, "Range": "bytes=0-9"}),
              ("get_object", {"Key": key, "IfNoneMatch": '"other"'}),
              ("get_object", {"Key": key, "IfMatch": '"other"'}),
              ("get_object", {"Key": key, "IfNoneMatch": etag})]  # fmt: skip
    return [(call, {"Bucket": server.BUCKET, **arguments}) for call, arguments in asked]


@pytest.mark.parametrize("which", ["bundled", "moto"])
def test_the_copy_answers_byte_for_byte_as_the_endpoint(which, request, tmp_path, monkeypatch):
    running = request.getfixturevalue("s3" if which == "bundled" else "moto")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.ACCESS_KEY)  # the job's, which the relay checks
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.SECRET_KEY)
    direct = _boto(running.endpoint)
    for name, data in OBJECTS.items():
        direct.put_object(Bucket=server.BUCKET, Key=f"{PREFIX}/{name}", Body=data)
    seen = {}
    for answers in ("copy", "endpoint"):
        with emulated(_keys(running.endpoint, answers), tmp_path) as via:
            relayed = _boto(via)
            seen[answers] = [_answer(relayed, call, **arguments) for call, arguments in _requests()]
            # A wrong secret is refused as the endpoint refuses it: the relay checks signatures.
            seen[answers].append(_answer(_boto(via, "wrong"), "get_object",
                                         Bucket=server.BUCKET, Key=f"{PREFIX}/a.bin"))  # fmt: skip
            counted = counters(via)
        if answers == "copy":  # all from the copy but the missing key, the first listing, the
            # two conditions not met and the wrong secret's request: the endpoint's to answer
            assert counted["storage_relay_requests"] == len(_requests()) + 1
            endpoint = 5 / (len(_requests()) + 1)
            assert counted["storage_relay_endpoint_frac"] == pytest.approx(endpoint), counted
    expected = [_answer(direct, call, **arguments) for call, arguments in _requests()]
    assert seen["copy"][:-1] == expected == seen["endpoint"][:-1]
    assert seen["copy"][-1] == seen["endpoint"][-1]  # whatever the endpoint makes of it
    if which == "bundled":  # Swift checks signatures (moto's server lets any pass)
        assert seen["copy"][-1] == (403, "SignatureDoesNotMatch")
    whole = [answer for answer in expected if answer[0] == 200 and isinstance(answer[2], bytes)]
    assert any(body == OBJECTS["a.bin"] for _, _, body in whole)  # the bytes themselves


def test_a_new_upload_is_fetched_again_never_served_stale(s3, tmp_path):
    client.configure(client.Endpoint(s3.endpoint, server.REGION, True))
    url = f"s3://{server.BUCKET}/{PREFIX}-fresh/object"
    objects.put_bytes(url, b"first version", {})
    folder = tmp_path / "copy"
    first = bucket_copy.refresh(parse(f"s3://{server.BUCKET}/{PREFIX}-fresh"), folder)
    assert (first.objects, first.fetched) == (1, 1)
    again = bucket_copy.refresh(parse(f"s3://{server.BUCKET}/{PREFIX}-fresh"), folder)
    assert (again.objects, again.fetched) == (1, 0)  # current: nothing fetched
    objects.put_bytes(url, b"second, longer version", {})  # a new ETag
    third = bucket_copy.refresh(parse(f"s3://{server.BUCKET}/{PREFIX}-fresh"), folder)
    assert third.fetched == 1
    copy = bucket_copy.BucketCopy.load(folder)
    entry = copy.find(server.BUCKET, f"{PREFIX}-fresh/object")
    assert copy.read(entry) == b"second, longer version"
    assert len(list((folder / "objects").iterdir())) == 1  # the old version's file is gone
    objects.delete(url)
    assert bucket_copy.refresh(parse(f"s3://{server.BUCKET}/{PREFIX}-fresh"), folder).objects == 0


def test_a_copy_its_disk_cannot_hold_is_refused_before_any_fetch(tmp_path, monkeypatch):
    listed = [objects.Listed(f"{n}.jpg", 400_000_000, f"etag{n}") for n in range(10)]
    monkeypatch.setattr(bucket_copy, "list_objects", lambda prefix: iter(listed))
    monkeypatch.setattr(bucket_copy, "get_with_headers", lambda address: pytest.fail("fetched"))
    room = shutil.disk_usage(tmp_path)._replace(free=10**9)  # 1 GB free, whatever is here
    monkeypatch.setattr(bucket_copy.shutil, "disk_usage", lambda path: room)
    with pytest.raises(StorageError) as refused:
        bucket_copy.refresh(parse("s3://bucket/data"), tmp_path / "copy")
    message = str(refused.value)
    assert message.startswith("the emulated bucket's copy needs 4.00 GB more in ")
    assert "which has 1.00 GB free" in message
    assert "storage.answers=endpoint" in message and "data.cache_dir" in message
