"""Closed by default: the Kubernetes API endpoint is private unless the variable file names who may reach it, and the
whole internet only with an explicit field; `config check` says which, and the one edit kubectl from outside needs."""

from __future__ import annotations

import pytest

from config import ConfigError
from tests.helpers import load_variant, write_variant

MINE = ["203.0.113.7/32"]


def test_the_shipped_file_is_private():
    from config import load_config

    cluster = load_config(None).cluster
    assert (cluster.endpoint_access, cluster.public_access_cidrs) == ("private", [])


def test_a_public_endpoint_needs_cidrs(tmp_path):
    with pytest.raises(ConfigError, match=r"cluster\.public_access_cidrs: endpoint_access: public_and_private with "
                                          r"no CIDRs; name who may reach the Kubernetes API"):
        load_variant(tmp_path, {"cluster": {"endpoint_access": "public_and_private"}})


def test_the_internet_needs_the_explicit_field(tmp_path):
    opened = {"endpoint_access": "public_and_private", "public_access_cidrs": ["0.0.0.0/0"]}
    with pytest.raises(ConfigError, match=r"0\.0\.0\.0/0 opens the Kubernetes API endpoint to the whole internet; "
                                          r".*set cluster\.endpoint_open_to_internet: true"):
        load_variant(tmp_path, {"cluster": opened})
    assert load_variant(tmp_path, {"cluster": {**opened, "endpoint_open_to_internet": True}})


def test_a_public_only_endpoint_is_the_internet(tmp_path):
    with pytest.raises(ConfigError, match=r"0\.0\.0\.0/0 opens"):
        load_variant(tmp_path, {"cluster": {"endpoint_access": "public", "public_access_cidrs": ["0.0.0.0/0"]}})


def test_cidrs_on_a_private_endpoint_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"endpoint_access is private, so no CIDR can reach the API"):
        load_variant(tmp_path, {"cluster": {"public_access_cidrs": MINE}})


def test_config_check_explains_private_and_the_one_edit(capsys):
    from config.__main__ import main

    assert main(["check"]) == 0
    out = capsys.readouterr().out
    assert "Kubernetes API endpoint: private, reachable only from inside the VPC (closed by default)" in out
    assert ("The one edit for that: endpoint_access: public_and_private and public_access_cidrs: "
            "[<your address>/32]") in out


def test_config_check_names_the_cidrs_of_a_narrowed_endpoint(tmp_path, capsys):
    from config.__main__ import main

    path = write_variant(tmp_path, {"cluster": {"endpoint_access": "public_and_private", "public_access_cidrs": MINE}})
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "Kubernetes API endpoint: public to 203.0.113.7/32 and from inside the VPC" in out
    assert "endpoint_access is private" not in out
