#!/usr/bin/env bash
# On-policy distillation beside off-policy distillation (SFT on the teacher's own samples)
# at the same number of student tokens, each graded at every fifth of its run: run the
# quickstart first, then (from the same directory)
#
#   bash examples/quickstart/opd-longer.sh          # 150 steps; PT_OPD_STEPS=N for others
#
# 1. OPD from the warm start (opd.yaml: forward KL over the teacher's top 8 and the tail)
#    with 64 problems a step (PT_OPD_PROBLEMS=N for others) and a cosine schedule down
#    to a tenth, an HF checkpoint every fifth of the run;
# 2. the teacher samples two answers to each of half as many problems (as many samples
#    as OPD's student draws, at its temperature 1.0), pt-data builds them into packed SFT
#    rows (offpolicy-data.yaml), and SFT from the warm start trains one epoch of them (8
#    rows a step) at OPD's learning rate and schedule, a checkpoint every fifth;
# 3. every checkpoint is evaluated as the quickstart evaluates (the 200 held-out problems,
#    8 samples at temperature 0.6, seed 0); prints accuracy against the student tokens
#    trained on, and draws it (quickstart-out/opd-longer.png).
# PT_OPD_STUDENT and PT_OPD_TEACHER name other checkpoints (default: the warm start and
# the SFT model of the quickstart).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
HERE="$REPO/examples/quickstart"
OUT=${PT_QUICKSTART_OUT:-$PWD/quickstart-out}
STEPS=${PT_OPD_STEPS:-150}
STUDENT=${PT_OPD_STUDENT:-runs/sft/inference/step-240}
TEACHER=${PT_OPD_TEACHER:-runs/sft/inference/step-600}
BATCH=${PT_OPD_PROBLEMS:-64}  # problems a step
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export DS_ACCELERATOR=${DS_ACCELERATOR:-cpu} TOKENIZERS_PARALLELISM=false
export PATH="$REPO/.venv/bin:$PATH"

if [[ ! "$STEPS" =~ ^[1-9][0-9]*$ ]]; then
    echo "error: PT_OPD_STEPS=$STEPS is not a number of steps" >&2
    echo "hint: a whole number above 0, e.g. PT_OPD_STEPS=150" >&2
    exit 2
fi
if [[ ! "$BATCH" =~ ^[1-9][0-9]*$ ]]; then
    echo "error: PT_OPD_PROBLEMS=$BATCH is not a number of problems" >&2
    echo "hint: a whole number above 0, e.g. PT_OPD_PROBLEMS=64" >&2
    exit 2
fi
for needed in manifest-sft.json grades-sft.json grades-base.json data/train-prompts \
              data/test-prompts "$STUDENT" "$TEACHER"; do
    if [[ ! -e "$OUT/$needed" ]]; then
        echo "error: no quickstart output in $OUT ($needed is missing)" >&2
        echo "hint: run 'bash examples/quickstart/run.sh' first, or set PT_QUICKSTART_OUT" >&2
        exit 2
    fi
done
cd "$OUT"
mkdir -p rollouts grades
every=$(( (STEPS + 4) / 5 ))

started=$(date +%s)
trap 'rm -f manifest-opd-longer.json.tmp opd-longer.json.tmp' EXIT
# no figures of an earlier run
rm -rf runs/opd-longer runs/offpolicy-longer data/offpolicy rollouts/teacher-samples.jsonl \
    manifest-opd-longer.json opd-longer.json opd-longer.png grades/opd-longer-* \
    grades/offpolicy-longer-* rollouts/opd-longer-* rollouts/offpolicy-longer-*
echo "1/3 OPD, $STEPS steps of $BATCH problems" >&2
pt-train run "$HERE/opd.yaml" run_name=opd-longer model.name_or_path="$STUDENT" \
    objective.teacher.path="$TEACHER" training.global_batch_size="$BATCH" \
    training.micro_batch_size=$(( BATCH < 32 ? BATCH : 32 )) training.lr_schedule=cosine training.min_lr_ratio=0.1 \
    training.max_steps="$STEPS" training.inference_steps=$every > manifest-opd-longer.json.tmp
mv manifest-opd-longer.json.tmp manifest-opd-longer.json
opd_seconds=$(( $(date +%s) - started ))

echo "2/3 the teacher's samples, SFT on them" >&2
started=$(date +%s)
pt-rollout generate --model "$TEACHER" --prompts data/train-prompts --engine hf --n 2 \
    --temperature 1.0 --max-tokens 40 --seed 0 --limit $(( STEPS * BATCH / 2 )) \
    --out rollouts/teacher-samples.jsonl > /dev/null
rows=$(pt-data build "$HERE/offpolicy-data.yaml" \
    | python3 -c "import json,sys; print(json.load(sys.stdin)['rows'])")
sft_steps=$(( (rows + 7) / 8 ))  # one epoch of 8 rows a step
pt-train run "$HERE/finetune.yaml" --data data/offpolicy run_name=offpolicy-longer \
    objective.name=sft model.name_or_path="$STUDENT" training.learning_rate=1.0e-3 \
    training.global_batch_size=8 training.micro_batch_size=8 \
    training.min_lr_ratio=0.1 training.weight_decay=0 training.seed=0 \
    training.max_steps=$sft_steps training.inference_steps=$(( (sft_steps + 4) / 5 )) \
    training.logging_steps=1 > /dev/null
offpolicy_seconds=$(( $(date +%s) - started ))

echo "3/3 every checkpoint on the held-out problems (pt-eval's tables: grades/*-longer-*.log)" >&2
for run in opd-longer offpolicy-longer; do
    for ckpt in "runs/$run"/inference/step-*; do
        name=$run-${ckpt##*/}
        pt-rollout generate --model "$ckpt" --prompts data/test-prompts --engine hf --n 8 \
            --temperature 0.6 --max-tokens 40 --seed 0 --out "rollouts/$name.jsonl" \
            | pt-eval grade - --out "grades/$name.jsonl" > "grades/$name.json" 2> "grades/$name.log"
    done
done

python3 - "$opd_seconds" "$offpolicy_seconds" <<'EOF'
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

opd_seconds, offpolicy_seconds = sys.argv[1:]


def accuracy(path):
    return json.load(open(path))["accuracy"]


teacher = json.load(open("grades-sft.json"))["accuracy"]
start = json.load(open("grades-base.json"))["accuracy"]
curves = {}
for run in ("opd-longer", "offpolicy-longer"):
    tokens = {m["step"]: m["trained_tokens"] for m in map(json.loads, open(f"runs/{run}/metrics.jsonl"))}
    points = [(0, start)]
    for ckpt in sorted(Path(f"runs/{run}/inference").glob("step-*"), key=lambda p: int(p.name[5:])):
        step = int(ckpt.name[5:])
        points.append((tokens[step], accuracy(f"grades/{run}-{ckpt.name}.json")))
    curves[run] = points
labels = {"opd-longer": "OPD (on-policy)", "offpolicy-longer": "SFT on the teacher's samples"}
fig, ax = plt.subplots(figsize=(6.4, 4))
for run, points in curves.items():
    ax.plot([t for t, _ in points], [100 * a for _, a in points], marker="o", label=labels[run])
ax.axhline(100 * teacher, color="gray", linestyle="--", label="teacher (SFT model)")
ax.axhline(85 * teacher, color="gray", linestyle=":", label="85% of the teacher")
ax.set_xlabel("student tokens trained on")
ax.set_ylabel("held-out accuracy (%)")
ax.legend()
fig.tight_layout()
fig.savefig("opd-longer.png", dpi=120)
result = {"teacher": teacher, "warm_start": start, "opd_seconds": int(opd_seconds),
          "offpolicy_seconds": int(offpolicy_seconds),
          **{run: [{"tokens": t, "accuracy": a} for t, a in points] for run, points in curves.items()}}
Path("opd-longer.json.tmp").write_text(json.dumps(result, indent=1) + "\n")
Path("opd-longer.json.tmp").rename("opd-longer.json")
for run, points in curves.items():
    row = "  ".join(f"{t:>7,}: {100 * a:4.1f}%" for t, a in points)
    print(f"{labels[run]:<30} {row}")
opd = curves["opd-longer"][-1][1]
share = f"{100 * opd / teacher:.0f}% of the teacher" if teacher else "the teacher gets none right"
print(f"teacher {100 * teacher:.1f}%; OPD ends at {100 * opd:.1f}% ({share}) after "
      f"{opd_seconds} s of training; curve: opd-longer.png")
EOF
