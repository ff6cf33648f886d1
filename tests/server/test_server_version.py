"""The version `/props` and the OpenAPI document report, installed or from a source tree."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from mlxcel_server import version as version_module
from mlxcel_server.openapi import make_openapi_document


def test_the_installed_version_is_reported():
    assert version_module.server_version() == version("mlxcel-server")
    assert make_openapi_document()["info"]["version"] == version("mlxcel-server")


def test_a_source_tree_without_package_metadata_still_gets_a_version(monkeypatch):
    def no_metadata(name: str) -> str:
        raise PackageNotFoundError(name)

    monkeypatch.setattr(version_module, "version", no_metadata)

    assert version_module.server_version() == version_module.SOURCE_TREE
    assert make_openapi_document()["info"]["version"] == version_module.SOURCE_TREE
