#!/usr/bin/env bash
# The wheel as a user installs it: build a wheel from this checkout, install it into a fresh
# virtual environment under a temporary directory, and from a directory unrelated to the
# checkout run `elastic-dew demo --quick` and `elastic-dew simulate -- python guide_loop.py`
# (a pathwaysutils loop shipped in tests/programs/, copied there) with a slice loss and its
# return. Exits non-zero when any of it fails; prints how long it took.
#
#   scripts/wheel_check.sh            # PYTHON=python3.12 to use another interpreter
#
# pip reuses its cache, so a second run installs the dependencies without downloading them.
set -euo pipefail
start=$(date +%s)
repo="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
work="$(mktemp -d "${TMPDIR:-/tmp}/elastic-dew-wheel.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# A copy of the tracked and untracked-but-not-ignored files: the checkout's build outputs
# and virtual environments stay out of the wheel, and the checkout is never written to.
mkdir "$work/src"
(cd "$repo" && git ls-files -z --cached --others --exclude-standard \
    | tar --null --files-from=- --ignore-failed-read -cf - | tar -xf - -C "$work/src")
"$python" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --upgrade pip build
"$work/venv/bin/python" -m build --wheel --outdir "$work/dist" "$work/src" >"$work/build.log" 2>&1 \
    || { cat "$work/build.log"; exit 1; }
wheel=("$work"/dist/elastic_dew-*.whl)
echo "built ${wheel[0]##*/}"

# What the wheel holds: the elastic_dew package alone (no top-level recipes, tests or scripts).
"$work/venv/bin/python" - "${wheel[0]}" <<'PY'
import sys, zipfile
tops = {n.split("/")[0] for n in zipfile.ZipFile(sys.argv[1]).namelist()}
extra = sorted(t for t in tops if t != "elastic_dew" and not t.endswith(".dist-info"))
assert not extra, f"the wheel installs more than elastic_dew: {extra}"
print("the wheel holds elastic_dew alone")
PY
"$work/venv/bin/python" -m pip install --quiet "${wheel[0]}"

# An unrelated directory: nothing of the checkout is importable from here.
mkdir "$work/elsewhere"
cp "$repo/tests/programs/guide_loop.py" "$work/elsewhere/"
cd "$work/elsewhere"
export PATH="$work/venv/bin:$PATH"
unset PYTHONPATH
python -c "import elastic_dew, sys; assert elastic_dew.__file__.startswith(sys.argv[1]), elastic_dew.__file__" \
    "$work/venv"
elastic-dew demo --quick --run-dir "$work/elsewhere/demo"
elastic-dew simulate --slices 2 --schedule lose:1@4,restore:1@8 --run-dir "$work/elsewhere/sim" \
    -- python guide_loop.py --steps 12
echo "wheel check passed in $(( $(date +%s) - start )) s"
