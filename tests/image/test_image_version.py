"""One version for the package, the chart and the operator image: the chart deploys the image
that `make image` builds and tags (pure: reads the files, builds nothing)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "pdscale"


def pyproject_version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def test_chart_app_version_is_the_package_version():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == pyproject_version(), (
        "charts/pdscale/Chart.yaml appVersion must be pyproject.toml's version: the image tag "
        "defaults to it and image/build tags the image with the package version"
    )


def test_chart_deploys_the_image_the_build_names():
    values = yaml.safe_load((CHART / "values.yaml").read_text())["image"]
    build = (ROOT / "image" / "build").read_text()
    repository = re.search(r"^REPOSITORY=(\S+)", build, re.MULTILINE)
    assert repository is not None and values["repository"] == repository.group(1)
    # an empty tag means the chart's appVersion (templates/deployment.yaml)
    assert values["tag"] == ""
    assert ".Values.image.tag | default .Chart.AppVersion" in (
        CHART / "templates" / "deployment.yaml").read_text()


def test_containerfile_labels_the_package_version():
    containerfile = (ROOT / "image" / "Containerfile").read_text()
    assert re.search(r"^ARG VERSION=(\S+)$", containerfile, re.MULTILINE).group(1) == pyproject_version()
