"""The wheel: `pip wheel .` builds it, it installs into a fresh virtual environment, and the
installed console script runs the export job from a folder outside the checkout.

The fresh environment reuses this environment's installed dependencies through a `.pth` line
(so TensorFlow is not downloaded again) but not its editable install of the package: a path
line in a `.pth` file adds the folder, it does not run that folder's own `.pth` hooks.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
SCRIPT = "keras-posenc-export"
TINY_EXPORT = ["--batch-sizes", "1,2", "--sequence-lengths", "3,17", "--repeats", "1"]

pytestmark = pytest.mark.wheel


def _run(command, cwd, env, timeout=300):
    started = time.perf_counter()
    result = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    seconds = time.perf_counter() - started
    assert result.returncode == 0, (command, result.stdout[-3000:], result.stderr[-3000:])
    return result, seconds


def _clean_env() -> dict:
    """This environment without anything that would put the checkout on the path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["KERAS_BACKEND"] = "tensorflow"
    # The console script must quiet TensorFlow itself when the user did not choose a level.
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    return env


def _checkout_files() -> list[str]:
    """The checkout as a clone plus new files would have it: tracked and untracked, not ignored."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPOSITORY,
        capture_output=True,
        check=True,
    )
    return [name for name in listed.stdout.decode().split("\0") if name]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("wheel")
    env = _clean_env()
    timings = {}

    # Build from a copy: an in-tree build keeps `build/lib`, whose stale modules (a file
    # since deleted or turned into a package) would be shipped in the next wheel.
    source = root / "source"
    for name in _checkout_files():
        if (REPOSITORY / name).is_file():  # a deleted, not yet committed file is listed too
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPOSITORY / name, source / name)
    wheels = root / "wheels"
    _, timings["build"] = _run(
        [sys.executable, "-m", "pip", "wheel", source, "--no-deps", "-w", wheels, "-q"],
        root,
        env,
    )
    (wheel,) = wheels.glob("keras_posenc-*.whl")

    venv = root / "venv"
    started = time.perf_counter()
    _run([sys.executable, "-m", "venv", "--without-pip", venv], root, env)
    python = venv / "bin" / "python"
    site_packages = Path(
        subprocess.check_output(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], text=True
        ).strip()
    )
    (site_packages / "_dependencies_from_the_test_environment.pth").write_text(
        "\n".join(site.getsitepackages()) + "\n"
    )
    _run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", wheel],
        root,
        env,
    )
    timings["venv_and_install"] = time.perf_counter() - started
    outside = root / "elsewhere"
    outside.mkdir()
    return {
        "wheel": wheel,
        "venv": venv,
        "python": python,
        "env": env,
        "outside": outside,
        "timings": timings,
    }


def test_wheel_holds_the_package_and_the_license(installed):
    with zipfile.ZipFile(installed["wheel"]) as wheel:
        names = set(wheel.namelist())
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = wheel.read(metadata).decode()
        (license_file,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        license_text = wheel.read(license_file).decode()
    packages = {n.split("/")[0] for n in names if "/" in n and ".dist-info/" not in n}
    assert "keras_posenc" in packages
    in_wheel = {n for n in names if n.split("/")[0] in packages and n.endswith(".py")}
    in_checkout = {
        n for n in _checkout_files() if n.split("/")[0] in packages and n.endswith(".py")
    }
    assert in_wheel == in_checkout  # every module of the shipped packages, no stale ones
    assert license_text == (REPOSITORY / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "License-Expression: Apache-2.0" in metadata
    assert "License-File: LICENSE" in metadata
    assert "Keywords:" in metadata and "Classifier: Programming Language :: Python :: 3" in metadata


def test_installed_package_is_the_wheel_not_the_checkout(installed):
    code = (
        "import importlib.metadata, json, keras_posenc; "
        "print(json.dumps([keras_posenc.__file__, keras_posenc.__version__, "
        "importlib.metadata.version('keras-posenc')]))"
    )
    result, _ = _run([installed["python"], "-c", code], installed["outside"], installed["env"])
    location, version, distribution = json.loads(result.stdout.strip().splitlines()[-1])
    assert Path(location).is_relative_to(installed["venv"]), location
    assert version == distribution


def test_console_script_help(installed):
    script = installed["venv"] / "bin" / SCRIPT
    assert script.exists(), f"the wheel installs no {SCRIPT} script"
    result, installed["timings"]["help"] = _run(
        [script, "--help"], installed["outside"], installed["env"]
    )
    for flag in ("--encoder", "--model", "--out"):
        assert flag in result.stdout, flag


def test_console_script_exports_from_outside_the_checkout(installed, tmp_path):
    script = installed["venv"] / "bin" / SCRIPT
    assert script.exists(), f"the wheel installs no {SCRIPT} script"
    out = tmp_path / "artifacts"
    result, seconds = _run(
        [script, "--encoder", "sinusoidal", "--out", out, *TINY_EXPORT],
        installed["outside"],
        installed["env"],
        timeout=600,
    )
    timings = {**installed["timings"], "export": seconds}
    print(
        "fresh-venv wheel timings (s): " + json.dumps({k: round(v, 1) for k, v in timings.items()})
    )
    folder = out / "sinusoidal"
    # the artifacts named in the export docs (LiteRT's model.tflite and the ownership
    # marker come with the LiteRT issue; the export tests check the exact list)
    assert {"saved_model", "model.onnx", "report.json"} <= {p.name for p in folder.iterdir()}
    report = json.loads((folder / "report.json").read_text())
    assert report["passed"] is True
    for runtime, summary in report["summary"].items():
        if runtime != "keras":
            assert summary["passed"] and summary["max_abs_error"] <= 1e-5, (runtime, summary)
    # TensorFlow's start-up noise is quieted when the user did not set TF_CPP_MIN_LOG_LEVEL.
    output = result.stdout + result.stderr
    for noise in ("cuInit", "oneDNN custom operations", "absl::InitializeLog"):
        assert noise not in output, noise
    assert list(installed["outside"].iterdir()) == []  # nothing written where it ran
