#!/usr/bin/env bash
# MaxText 0.2.5's pre-training program, unmodified, under `elastic-dew simulate`
# (docs/maxtext.md): a tiny decoder on synthetic data with elastic_enabled=True, through
#   1. a slice loss and its return,
#   2. two losses on four slices,
#   3. a hang declared dead 3 s later,
#   4. a preemption and its restart,
# first with checkpointing off, then with it on (enable_checkpointing=True checkpoint_period=2:
# each recovery resumes from MaxText's newest committed checkpoint), and
#   5. pause-resume (elastic_min_slice_count=-1: every slice or none), the lost slice back
#      3 s after the loss while MaxText waits for it, with checkpointing on.
# Each is checked from `elastic-dew simulate --report`: exit 0, no fault left unfired, the
# elastic_retry attempts the schedule implies, no problem named (but the one a checkpointing
# preemption names, allowed: docs/maxtext.md says why) and the checkpoint step each recovery
# resumed from. Not in the suite (.ci/run): MaxText's install is about 2.5 GB and needs
# Python 3.12.
#
#   scripts/maxtext_simulate.sh [WORK_DIR [SCENARIO ...]]
#
# WORK_DIR defaults to /tmp/elastic-dew-maxtext; SCENARIO names the runs to make (every one
# by default: the names below). Needs: python3.12 on PATH (or PYTHON312=...), network access
# to PyPI for the install (once), `unshare` (util-linux) with the right to make a PID
# namespace (root, or user namespaces enabled): MaxText's iterator clean-up SIGKILLs
# multiprocessing processes it takes for orphans anywhere on the machine, so each run gets a
# PID namespace of its own.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${1:-/tmp/elastic-dew-maxtext}"
ONLY=("${@:2}")
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
  "$BASE_YML" run_name=elastic-dew-sim dataset_type=synthetic
  steps=12 per_device_batch_size=1 max_target_length=32 base_emb_dim=32 base_num_query_heads=2
  base_num_kv_heads=2 base_mlp_dim=64 base_num_decoder_layers=1 head_dim=16 vocab_size=128
  enable_single_controller=True elastic_enabled=True log_period=1
)
NO_CHECKPOINTS=(enable_checkpointing=False elastic_min_slice_count=1)
CHECKPOINTS=(enable_checkpointing=True checkpoint_period=2)

# The check of one run's report: argv is the report, the expected attempts, the expected
# checkpoint steps resumed from, the allowed problem kind ("" for none) and the watch's records.
CHECK="$(cat <<'PY'
import json, sys
report, expected, resumed = json.load(open(sys.argv[1])), json.loads(sys.argv[2]), json.loads(sys.argv[3])
allowed, watch = sys.argv[4], sys.argv[5]
attempts = [p["attempts"] for p in report["processes"]]
kinds = [p["kind"] for p in report["problems"]]
stops = [c for c in report["costs"] if c["action"] not in ("restore", "wake") and c["part_of"] is None]
if "landed" in resumed:  # the newest checkpoint committed when the restarted process began
    restart = report["processes"][-1]["pid"]
    records = [json.loads(line) for line in open(watch)]
    landed = [r["checkpoint"] for r in records if r["e"] == "landed" and r["pid"] == restart][-1]
    resumed = [landed if r == "landed" else r for r in resumed]
got = [c["resumed_step"] if c["resumed_from"] == "checkpoint" else None for c in stops]
known = all(c["resumed_from"] in ("checkpoint", "nothing") for c in stops)
ok = (report["exit"] == 0 and not report["never_fired"] and attempts == expected and known and got == resumed
      and kinds == ([allowed] if allowed else []))
print(("OK  " if ok else "BAD ") + f"attempts {attempts} (expected {expected}), never fired {report['never_fired']}, "
      f"resumed from checkpoint steps {got} (expected {resumed}), problems {kinds}")
for cost in report["costs"]:
    print(f"    {cost['fault']}: resumed from {cost['resumed_from']} {cost['resumed_step']}, "
          f"{cost['redone_steps']} steps redone, taken up after {cost['taken_up_after_steps']} steps")
sys.exit(0 if ok else 1)
PY
)"

failed=0
# scenario NAME SLICES SCHEDULE EXPECTED_ATTEMPTS_JSON RESUMED_JSON [MAXTEXT_KEY=VALUE ...]
# RESUMED_JSON: for each fault that stops work (in firing order, but one whose recovery
# another carries), the checkpoint step it resumed from: null for a fresh state, "landed"
# for the newest checkpoint committed when the restarted process began (a save in flight at
# the preemption may or may not have committed). ALLOW=KIND: a problem kind expected, and
# allowed; it must be the only one named.
scenario() {
  local name="$1" slices="$2" schedule="$3" expected="$4" resumed="$5"
  shift 5
  if [ "${#ONLY[@]}" -gt 0 ] && [[ " ${ONLY[*]} " != *" $name "* ]]; then
    return 0
  fi
  local run_dir="$WORK/runs/$name" out="$WORK/out/$name" allow=()
  rm -rf "$run_dir" "$run_dir.json" "$out"
  if [ -n "${ALLOW:-}" ]; then allow=(--allow "$ALLOW"); fi
  echo "== $name: $slices slices, schedule $schedule, $*"
  # A PID namespace of its own (see above); niced: the machine is shared.
  if nice -n 10 unshare -p -f --mount-proc \
      "$VENV/bin/elastic-dew" simulate --slices "$slices" --devices-per-slice 2 --schedule "$schedule" \
      --run-dir "$run_dir" --report "$run_dir.json" "${allow[@]}" \
      -- python -m maxtext.trainers.pre_train.train "${TRAIN_ARGS[@]}" base_output_directory="$out" "$@"; then
    "$VENV/bin/python" -c "$CHECK" "$run_dir.json" "$expected" "$resumed" "${ALLOW:-}" "$run_dir/watch.jsonl" \
      || failed=1
  else
    echo "BAD $name: elastic-dew simulate exited $?"
    failed=1
  fi
}

# Checkpointing off: each attempt, and the restarted process, starts from a fresh state.
scenario loss-and-return 2 "lose:1@4,restore:1@7" '[[[0,1],[0],[0,1]]]' '[null]' "${NO_CHECKPOINTS[@]}"
scenario two-losses 4 "lose:1@4,lose:2@6,restore:1@8,restore:2@9" \
  '[[[0,1,2,3],[0,2,3],[0,3],[0,1,3],[0,1,2,3]]]' '[null,null]' "${NO_CHECKPOINTS[@]}"
scenario hang-declared-dead 2 "hang:1@4,lose:1@+3,restore:1@7" '[[[0,1],[0],[0,1]]]' '[null]' "${NO_CHECKPOINTS[@]}"
scenario preemption 2 "preempt@5" '[[[0,1]],[[0,1]]]' '[null]' "${NO_CHECKPOINTS[@]}"
# Checkpointing on: each loss resumes from the checkpoint of step 2 (the loss fires at
# MaxText's step 3; the second of two losses at step 4, before its checkpoint is saved).
scenario checkpointed-loss-and-return 2 "lose:1@4,restore:1@7" '[[[0,1],[0],[0,1]]]' '[2]' \
  "${CHECKPOINTS[@]}" elastic_min_slice_count=1
scenario checkpointed-two-losses 4 "lose:1@4,lose:2@6,restore:1@8,restore:2@9" \
  '[[[0,1,2,3],[0,2,3],[0,3],[0,1,3],[0,1,2,3]]]' '[2,2]' "${CHECKPOINTS[@]}" elastic_min_slice_count=1
scenario checkpointed-hang-declared-dead 2 "hang:1@4,lose:1@+3,restore:1@7" '[[[0,1],[0],[0,1]]]' '[2]' \
  "${CHECKPOINTS[@]}" elastic_min_slice_count=1
ALLOW=no_save_at_preemption scenario checkpointed-preemption 2 "preempt@5" '[[[0,1]],[[0,1]]]' '["landed"]' \
  "${CHECKPOINTS[@]}" elastic_min_slice_count=1
scenario checkpointed-pause-resume 2 "lose:1@4,restore:1@+3" '[[[0,1],[0,1]]]' '[2]' \
  "${CHECKPOINTS[@]}" elastic_min_slice_count=-1
exit "$failed"
