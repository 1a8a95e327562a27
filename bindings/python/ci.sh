#!/usr/bin/env bash
# The Python package as a user installs it: a virtual environment of Debian's python3 (its stdlib
# sqlite3 can load extensions), `pip install ./bindings/python`, then its tests with pytest.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv="$(pwd)/target/py-venv"
rm -rf "$venv"
/usr/bin/python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check ./bindings/python pytest apsw gunicorn
# Out of the source tree, so that the installed package (with its library) is the one imported.
cd bindings/python/tests
"$venv/bin/python" -m pytest -q .
