"""The campaign's S3 fault proxy in front of moto: forwards, answers errors, loses replies of
requests it carried out, delays and refuses."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import botocore.config
import botocore.exceptions
import pytest

from chaos.services import S3FaultProxy
from tests.support.s3 import ACCESS_KEY_ID, REGION, SECRET_ACCESS_KEY, boto3_client


@pytest.fixture
def proxy(s3_endpoint):
    proxy = S3FaultProxy(urlsplit(s3_endpoint).port, seed=1)
    proxy.start()
    yield proxy
    proxy.close()


def client_via(proxy: S3FaultProxy):
    import boto3

    return boto3.client("s3", endpoint_url=proxy.url, region_name=REGION,
                        aws_access_key_id=ACCESS_KEY_ID, aws_secret_access_key=SECRET_ACCESS_KEY,
                        config=botocore.config.Config(retries={"max_attempts": 1, "mode": "standard"},
                                                      connect_timeout=2, read_timeout=10))


def test_forwards_errors_lost_replies_delay_refusal(proxy, s3_endpoint):
    direct = boto3_client(s3_endpoint)
    direct.create_bucket(Bucket="chaos-proxy-test")
    via = client_via(proxy)

    via.put_object(Bucket="chaos-proxy-test", Key="a", Body=b"x" * 70000)
    assert via.get_object(Bucket="chaos-proxy-test", Key="a", Range="bytes=10-19")["Body"].read() == b"x" * 10
    assert via.head_object(Bucket="chaos-proxy-test", Key="a")["ContentLength"] == 70000

    proxy.error_rate = 1.0
    with pytest.raises(botocore.exceptions.ClientError) as error:
        via.put_object(Bucket="chaos-proxy-test", Key="b", Body=b"y")
    assert error.value.response["Error"]["Code"] == "SlowDown"
    assert "Contents" not in direct.list_objects_v2(Bucket="chaos-proxy-test", Prefix="b")

    proxy.heal()
    proxy.lost_reply_rate = 1.0
    with pytest.raises(botocore.exceptions.ClientError) as error:
        via.put_object(Bucket="chaos-proxy-test", Key="c", Body=b"z")
    assert error.value.response["Error"]["Code"] == "InternalError"
    # carried out all the same
    assert direct.get_object(Bucket="chaos-proxy-test", Key="c")["Body"].read() == b"z"

    proxy.heal()
    proxy.delay = 0.5
    started = time.monotonic()
    via.head_object(Bucket="chaos-proxy-test", Key="a")
    assert time.monotonic() - started >= 0.5

    proxy.heal()
    proxy.refuse = True
    with pytest.raises((botocore.exceptions.EndpointConnectionError,
                        botocore.exceptions.ConnectionClosedError)):
        via.head_object(Bucket="chaos-proxy-test", Key="a")
    proxy.heal()
    assert via.head_object(Bucket="chaos-proxy-test", Key="a")["ContentLength"] == 70000
    assert proxy.counts["errors"] >= 1 and proxy.counts["lost_replies"] >= 1
    assert proxy.counts["refused"] >= 1
