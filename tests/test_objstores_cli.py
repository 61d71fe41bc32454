"""The command line on GCS and Azure stores: ``--storage-option`` reaches gcsfs and adlfs as
it is (``endpoint_url`` too, which for S3 goes into s3fs's ``client_kwargs``)."""

from __future__ import annotations

import pytest

from .conftest import Backend
from .test_cli import as_json, options
from .test_operations import make


# GCS alone: its endpoint_url is the option the command line used to reroute (for s3fs).
@pytest.mark.parametrize("objstore", ["gcs"], indirect=True)
def test_log_and_verify_with_storage_options(objstore: Backend) -> None:
    make(objstore, appends=2)
    opts = options(objstore)
    assert any(o.startswith("endpoint_url=") for o in opts)
    assert [c["version"] for c in as_json("log", objstore.uri, *opts)] == [2, 1, 0]
    assert as_json("verify", objstore.uri, *opts)["ok"]
