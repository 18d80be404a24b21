"""A real S3 endpoint for the tests: moto's S3 server on 127.0.0.1 (a free port), reached
over HTTP by pyarrow's S3FileSystem exactly as a cluster reaches AWS S3 / MinIO / Ceph:
``AWS_ENDPOINT_URL`` plus the standard credential variables (dummy values here).

Nothing in the code under test is mocked: the pipeline, the storage layer and the engine CLI
talk HTTP to the server. The server keeps its objects in memory and is started once per test
session; every test gets a fresh bucket. Without moto installed these tests fail and say how
to install it.
"""

import logging
import os
import socket
import uuid

import pyarrow.fs as pafs
import pytest

INSTALL_HINT = ("the S3 tests need moto's server (the 'test' extra): "
                "pip install -e '.[test]'  or  pip install 'moto[server]>=5'")


def _moto_server():
    """moto's server module; without it the S3 tests FAIL (they are not skipped)."""
    try:
        import moto.server
    except ImportError as exc:
        pytest.fail(f"{INSTALL_HINT} ({exc})", pytrace=False)
    return moto.server


# Environment of the pipeline and of subprocesses (the engine CLI): endpoint + credentials.
REGION = "us-east-1"
_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "datamask-test",
    "AWS_SECRET_ACCESS_KEY": "datamask-test-secret",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_REGION": REGION,
    # no instance metadata look-ups, no profile files of the machine running the tests
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}
_CLEARED = ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_ROLE_ARN",
            "AWS_WEB_IDENTITY_TOKEN_FILE")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_endpoint():
    """``http://127.0.0.1:<port>`` of a moto S3 server running for the whole session.

    Bound to a port the OS reported free a moment before (werkzeug needs a concrete port to
    report it back; a lost race fails loudly at start, it never reuses a foreign server)."""
    server = _moto_server().ThreadedMotoServer(ip_address="127.0.0.1", port=_free_port(),
                                            verbose=False)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_env(s3_endpoint, monkeypatch) -> dict:
    """Point the process at the moto server (what a pod gets from its secret + config)."""
    env = {**_CREDENTIALS, "AWS_ENDPOINT_URL": s3_endpoint}
    for name in _CLEARED:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture
def s3fs(s3_env) -> pafs.S3FileSystem:
    """The test's own client of the server (independent of ``engine.storage``'s cache)."""
    host = s3_env["AWS_ENDPOINT_URL"][len("http://"):]
    return pafs.S3FileSystem(endpoint_override=host, scheme="http", region=REGION,
                             access_key=s3_env["AWS_ACCESS_KEY_ID"],
                             secret_key=s3_env["AWS_SECRET_ACCESS_KEY"],
                             allow_bucket_creation=True, allow_bucket_deletion=True)


@pytest.fixture
def bucket(s3fs) -> str:
    """A fresh, empty bucket."""
    name = f"datamask-{uuid.uuid4().hex[:12]}"
    s3fs.create_dir(name)
    return name
