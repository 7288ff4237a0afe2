#!/usr/bin/env bash
# MaxText 0.2.5's pre-training program, unmodified, under `elastic-dew simulate`
# (docs/maxtext.md): a tiny decoder on synthetic data with elastic_enabled=True, through
#   1. a slice loss and its return,
#   2. two losses on four slices,
#   3. a hang declared dead 3 s later,
#   4. a preemption and its restart,
# each checked from `elastic-dew simulate --report`: exit 0, no fault left unfired, and the
# elastic_retry attempts the schedule implies. Not in the suite (.ci/run): MaxText's install
# is about 2.5 GB and needs Python 3.12.
#
#   scripts/maxtext_simulate.sh [WORK_DIR]     (default /tmp/elastic-dew-maxtext)
#
# Needs: python3.12 on PATH (or PYTHON312=...), network access to PyPI for the install
# (once), `unshare` (util-linux) with the right to make a PID namespace (root, or
# user namespaces enabled): MaxText's iterator clean-up SIGKILLs multiprocessing processes
# it takes for orphans anywhere on the machine, so each run gets a PID namespace of its own.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${1:-/tmp/elastic-dew-maxtext}"
PYTHON312="${PYTHON312:-python3.12}"
VENV="$WORK/venv"
MAXTEXT_VERSION=0.2.5
mkdir -p "$WORK"

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON312" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  # MaxText's wheel without its dependencies, then its CPU requirement set from the wheel
  # itself (dependencies/requirements/generated_requirements/decoupled-requirements.txt).
  "$VENV/bin/python" -m pip install --quiet --no-deps "maxtext==$MAXTEXT_VERSION"
  REQUIREMENTS="$("$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
for f in md.distribution("maxtext").files or ():
    if str(f).endswith("generated_requirements/decoupled-requirements.txt"):
        print(f.locate())
        break
EOF
)"
  if [ -z "$REQUIREMENTS" ]; then
    echo "maxtext $MAXTEXT_VERSION's wheel has no decoupled-requirements.txt" >&2
    exit 1
  fi
  "$VENV/bin/python" -m pip install --quiet -r "$REQUIREMENTS"
  # elastic_dew, for its launcher, without its own pins: MaxText's set has what it imports.
  "$VENV/bin/python" -m pip install --quiet --no-deps -e "$REPO"
fi

BASE_YML="$("$VENV/bin/python" -c 'import maxtext, pathlib; print(pathlib.Path(maxtext.__file__).parent / "configs" / "base.yml")')"
export DECOUPLE_GCLOUD=TRUE  # no Cloud Storage: MaxText calls it at its first slice loss otherwise
export PATH="$VENV/bin:$PATH"

# A tiny decoder on synthetic data; one step function (MaxText's train_step) per step.
TRAIN_ARGS=(
  "$BASE_YML" run_name=elastic-dew-sim base_output_directory="$WORK/out" dataset_type=synthetic
  steps=12 per_device_batch_size=1 max_target_length=32 base_emb_dim=32 base_num_query_heads=2
  base_num_kv_heads=2 base_mlp_dim=64 base_num_decoder_layers=1 head_dim=16 vocab_size=128
  enable_checkpointing=False enable_single_controller=True elastic_enabled=True elastic_min_slice_count=1
  log_period=1
)

failed=0
scenario() {  # NAME SLICES SCHEDULE EXPECTED_ATTEMPTS_JSON
  local name="$1" slices="$2" schedule="$3" expected="$4"
  local run_dir="$WORK/runs/$name"
  rm -rf "$run_dir"
  echo "== $name: $slices slices, schedule $schedule"
  # A PID namespace of its own (see above); niced: the machine is shared.
  if nice -n 10 unshare -p -f --mount-proc \
      "$VENV/bin/elastic-dew" simulate --slices "$slices" --devices-per-slice 2 --schedule "$schedule" \
      --run-dir "$run_dir" --report "$run_dir.json" \
      -- python -m maxtext.trainers.pre_train.train "${TRAIN_ARGS[@]}"; then
    "$VENV/bin/python" - "$run_dir.json" "$expected" <<'EOF' || failed=1
import json, sys
report, expected = json.load(open(sys.argv[1])), json.loads(sys.argv[2])
attempts = [p["attempts"] for p in report["processes"]]
ok = report["exit"] == 0 and not report["never_fired"] and attempts == expected
print(("OK  " if ok else "BAD ") + f"attempts {attempts} (expected {expected}), never fired {report['never_fired']}")
sys.exit(0 if ok else 1)
EOF
  else
    echo "BAD $name: elastic-dew simulate exited $?"
    failed=1
  fi
}

scenario loss-and-return 2 "lose:1@4,restore:1@7" '[[[0,1],[0],[0,1]]]'
scenario two-losses 4 "lose:1@4,lose:2@6,restore:1@8,restore:2@9" '[[[0,1,2,3],[0,2,3],[0,3],[0,1,3],[0,1,2,3]]]'
scenario hang-declared-dead 2 "hang:1@4,lose:1@+3,restore:1@7" '[[[0,1],[0],[0,1]]]'
scenario preemption 2 "preempt@5" '[[[0,1]],[[0,1]]]'
exit "$failed"
