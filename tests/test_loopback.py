"""The loopback servers themselves: moto refuses what real S3 refuses; the credential endpoint checks its token;
the stalling proxy forwards signed requests and holds the armed uploads only."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest
from botocore.exceptions import ClientError

from harness.loopback import SERVERS, Keys, PodIdentityEndpoint, StallingProxy, s3_policy, serve

pytestmark = pytest.mark.slow  # every test talks to a loopback server, moto in a child process


@pytest.fixture(scope="module")
def bucket(moto_server):
    return moto_server.create_bucket("loopback-auth")


@pytest.fixture(scope="module")
def writer(moto_server, bucket):
    return moto_server.create_user("loopback-writer", s3_policy(bucket))


def _absent(moto_server, bucket, key):
    with pytest.raises(ClientError) as err:
        moto_server.client("s3").head_object(Bucket=bucket, Key=key)
    return err.value.response["Error"]["Code"] == "404"


def test_keys_with_the_policy_write_and_read(moto_server, bucket, writer):
    s3 = moto_server.client("s3", writer)
    s3.put_object(Bucket=bucket, Key="ok", Body=b"payload")
    assert s3.get_object(Bucket=bucket, Key="ok")["Body"].read() == b"payload"


def test_unknown_keys_are_refused(moto_server, bucket):
    with pytest.raises(ClientError) as err:
        moto_server.client("s3", Keys("AKIAAAAAAAAAAAAAAAAA", "wrong")).put_object(Bucket=bucket, Key="k", Body=b"x")
    assert err.value.response["Error"]["Code"] == "InvalidAccessKeyId"
    assert _absent(moto_server, bucket, "k")


def test_a_wrong_secret_is_refused(moto_server, bucket, writer):
    keys = Keys(writer.access_key_id, "not-the-secret")
    with pytest.raises(ClientError) as err:
        moto_server.client("s3", keys).put_object(Bucket=bucket, Key="k2", Body=b"x")
    assert err.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    assert _absent(moto_server, bucket, "k2")


def test_anonymous_writes_fail(moto_server, bucket):
    with pytest.raises(ClientError):
        moto_server.client("s3", anonymous=True).put_object(Bucket=bucket, Key="anon", Body=b"x")
    assert _absent(moto_server, bucket, "anon")


def test_keys_without_the_policy_are_denied(moto_server, bucket):
    other = moto_server.create_user("loopback-other", s3_policy("some-other-bucket"))
    with pytest.raises(ClientError) as err:
        moto_server.client("s3", other).put_object(Bucket=bucket, Key="k3", Body=b"x")
    assert err.value.response["Error"]["Code"] == "AccessDenied"


def _get(url, token=None):
    req = urllib.request.Request(url, headers={"Authorization": token} if token else {})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def test_credential_endpoint_serves_role_credentials_for_the_token_only(moto_server, bucket):
    keys = moto_server.assume_role(moto_server.create_role("loopback-pod", s3_policy(bucket)))
    with PodIdentityEndpoint(keys, moto_server.account_id) as endpoint:
        with pytest.raises(urllib.error.HTTPError) as err:
            _get(endpoint.url, "wrong-token")
        assert err.value.code == 403
        with pytest.raises(urllib.error.HTTPError):
            _get(endpoint.url)
        body = _get(endpoint.url, open(endpoint.token_file).read())
        assert body["AccessKeyId"].startswith("ASIA") and body["Token"] == keys.session_token
        assert endpoint.calls == ["wrong-token", None, endpoint.token]
        assert endpoint.authorized_calls == 1


def test_botocore_takes_only_the_endpoint_credentials_and_sends_the_token(moto_server, bucket, monkeypatch):
    import boto3

    keys = moto_server.assume_role(moto_server.create_role("loopback-pod2", s3_policy(bucket)))
    with PodIdentityEndpoint(keys, moto_server.account_id) as endpoint:
        for k, v in endpoint.exclusive_env(moto_server.endpoint_url).items():
            monkeypatch.setenv(k, v)
        s3 = boto3.session.Session().client("s3")
        s3.put_object(Bucket=bucket, Key="via-pod-identity", Body=b"x")
        assert endpoint.authorized_calls >= 1 and set(endpoint.calls) == {endpoint.token}


def test_servers_are_registered_and_stop_on_exit():
    with serve("moto") as servers:
        moto = servers["moto"]
        moto.create_bucket("stop-check")
        proc = moto.proc
    assert proc.poll() is not None  # the child exited with the context
    with pytest.raises(OSError):  # connection refused: nothing listens any more
        urllib.request.urlopen(moto.endpoint_url, timeout=2)


def _client_through(moto_server, proxy, keys):
    """A boto3 S3 client signed with `keys` that talks to moto through `proxy` (one attempt, short timeouts)."""
    import boto3
    from botocore.config import Config

    return boto3.session.Session(aws_access_key_id=keys.access_key_id, aws_secret_access_key=keys.secret_access_key,
                                 region_name="us-west-2").client(
        "s3", endpoint_url=proxy.endpoint_url,
        config=Config(retries={"max_attempts": 1}, connect_timeout=5, read_timeout=30))


def test_the_stalling_proxy_forwards_signed_requests(moto_server, bucket, writer):
    with StallingProxy(moto_server.endpoint_url) as proxy:
        s3 = _client_through(moto_server, proxy, writer)
        s3.put_object(Bucket=bucket, Key="via-proxy", Body=b"through")  # the SigV4 signature still matches
        assert s3.get_object(Bucket=bucket, Key="via-proxy")["Body"].read() == b"through"
        assert s3.head_object(Bucket=bucket, Key="via-proxy")["ContentLength"] == len(b"through")
        assert proxy.forwarded == 3 and proxy.held == []
    assert SERVERS["stalling_proxy"] is StallingProxy


def test_the_stalling_proxy_holds_armed_uploads_until_the_client_goes(moto_server, bucket, writer):
    with StallingProxy(moto_server.endpoint_url) as proxy:
        proxy.arm("checkpoint_step_0000004")
        s3 = _client_through(moto_server, proxy, writer)
        s3.put_object(Bucket=bucket, Key="run/checkpoint_step_0000002/a", Body=b"complete")  # not armed
        failed: list[Exception] = []

        def upload():
            try:
                s3.put_object(Bucket=bucket, Key="run/checkpoint_step_0000004/a", Body=b"held")
            except Exception as exc:  # noqa: BLE001 - the client sees its connection closed
                failed.append(exc)

        uploader = threading.Thread(target=upload, daemon=True)
        uploader.start()
        assert proxy.wait_held(30) == [f"/{bucket}/run/checkpoint_step_0000004/a"]
        assert uploader.is_alive()  # no reply while held
        assert _absent(moto_server, bucket, "run/checkpoint_step_0000004/a")  # never forwarded; moto answers
    uploader.join(timeout=30)  # the proxy stopped: the held connection was closed
    assert not uploader.is_alive() and failed
    assert _absent(moto_server, bucket, "run/checkpoint_step_0000004/a")
    assert moto_server.client("s3").get_object(Bucket=bucket, Key="run/checkpoint_step_0000002/a")["Body"].read() \
        == b"complete"
