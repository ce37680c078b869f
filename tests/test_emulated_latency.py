"""The emulated bucket's pieces that need no server: latencies drawn with the profile's median
and tail, signatures checked as S3 checks them, byte ranges read as S3 reads them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from facebench.storage.latency import Latency
from facebench.storage.relay_copy import _span
from facebench.storage.sigv4 import verify


def test_drawn_latencies_have_the_profiles_median_and_tail():
    latency = Latency(20.0, 100.0, seed=3)
    draws = sorted(latency.draw_s() * 1000 for _ in range(40_000))
    assert draws[len(draws) // 2] == pytest.approx(20.0, rel=0.03)
    assert draws[int(0.99 * len(draws))] == pytest.approx(100.0, rel=0.08)
    assert sum(draws) / len(draws) == pytest.approx(latency.mean_s * 1000, rel=0.03)
    assert latency.quantile_s(0.5) == pytest.approx(0.020) and latency.mean_s > 0.020
    # Seeded: the same sequence again; a constant without a tail.
    assert [Latency(20.0, 100.0, 3).draw_s() for _ in range(5)] == [
        Latency(20.0, 100.0, 3).draw_s() for _ in range(5)
    ]
    assert {Latency(20.0).draw_s() for _ in range(100)} == {0.020}
    with pytest.raises(ValueError, match="need 0 <= p50 <= p99"):
        Latency(20.0, 10.0)


def _signed(url: str, secret: str, **headers: str):
    request = AWSRequest(method="GET", url=url, headers=headers)
    S3SigV4Auth(Credentials("key", secret), "s3", "us-east-1").add_auth(request)
    prepared = request.prepare()
    parts = urlsplit(prepared.url)
    found = {"host": [parts.netloc]}
    for name, value in prepared.headers.items():
        found.setdefault(name.lower(), []).append(value)
    return parts.path + (f"?{parts.query}" if parts.query else ""), found


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9000/bucket/data/CelebA/with%20space/%C3%A9%2B1.jpg",
        "http://127.0.0.1:9000/bucket?list-type=2&prefix=data%2FCelebA%2F&max-keys=1000",
        "http://127.0.0.1:9000/bucket/data/a.jpg?x-id=GetObject",
    ],
)
def test_a_signature_is_checked_as_s3_checks_it(url):
    target, headers = _signed(url, "secret", Range="bytes=0-9")
    assert verify("GET", target, headers, {"key": "secret"})
    assert not verify("GET", target, headers, {"key": "another"})  # another secret
    assert not verify("GET", target, headers, {"other": "secret"})  # another key
    assert not verify("HEAD", target, headers, {"key": "secret"})  # not what was signed
    assert not verify("GET", target, {**headers, "range": ["bytes=0-99"]}, {"key": "secret"})
    later = datetime.now(UTC) + timedelta(minutes=20)  # S3 answers RequestTimeTooSkewed then
    assert not verify("GET", target, headers, {"key": "secret"}, now=later)


def test_byte_ranges_are_read_as_s3_reads_them():
    assert _span(None, 100) == (0, 100)
    assert _span(["bytes=10-19"], 100) == (10, 20)
    assert _span(["bytes=90-"], 100) == (90, 100)
    assert _span(["bytes=90-500"], 100) == (90, 100)  # past the end: to the end
    assert _span(["bytes=-30"], 100) == (70, 100)
    assert _span(["bytes=-300"], 100) == (0, 100)
    # Left to the endpoint, whose answer (416, or the whole object) the client then gets.
    for asked in (["bytes=100-"], ["bytes=5-2"], ["bytes=0-1,5-6"], ["items=0-1"], ["bytes=-0"]):
        assert _span(asked, 100) is None, asked
