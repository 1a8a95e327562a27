"""Builds the loadable extension with cargo (profile `dist`: stripped, debug info split off) and
ships it inside the package. Needs Rust's cargo and a C compiler; run from a checkout:
`pip install -v ./bindings/python` (pip shows a build's output only with -v: without it, a first
build's minutes of cargo's progress pass without a line)."""

import json
import shutil
import subprocess
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
WORKSPACE = HERE.parent.parent
LIBRARY = "libsqlite_bpe.so"


class BuildWithCargo(build_py):
    def run(self):
        super().run()
        cargo = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
        print("sqlite-bpe: building the loadable extension with cargo (minutes on a first build)")
        subprocess.run(
            [cargo, "build", "--profile", "dist", "-p", "sqlite-bpe"],
            cwd=WORKSPACE,
            check=True,
        )
        # Where cargo put it: CARGO_TARGET_DIR, a cargo config's target-dir, or target/.
        metadata = subprocess.run(
            [cargo, "metadata", "--format-version", "1", "--no-deps"],
            cwd=WORKSPACE,
            check=True,
            capture_output=True,
            text=True,
        )
        target = Path(json.loads(metadata.stdout)["target_directory"])
        built = target / "dist" / LIBRARY
        dest = Path(self.build_lib) / "sqlite_bpe" / LIBRARY
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, dest)


class BinaryDistribution(Distribution):
    """A platform wheel: the package carries a native library."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithCargo}, distclass=BinaryDistribution)
