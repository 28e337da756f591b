#!/usr/bin/env bash
# The training-step judge of `loadpolicy dev widths-step` shown to fail on what it guards: expert gradients left
# unscaled under tp = ep (the hand-over to DeepSpeed's expert groups forgets that the ranks of a tp = ep group share
# one batch, so DeepSpeed's average over the world halves every expert gradient at 2 ranks). Loading, the forward
# and the dense gradients stay right: only the experts' gradients and weights after the step can see it.
#
#   scripts/widths-step-mutant.sh [WORK] [CHECKPOINTS]     (in the widths environment: `tox -e widths --notest`)
#
# Exits 0 when the EPMeta tp = ep step failed on the expert gradients and weights, 1 otherwise. About 8 minutes here.
set -euo pipefail
cd "$(dirname "$0")/.."  # patches/ and the default paths are the repository's
export PYTHONPATH="$PWD/src"  # this checkout's judge, not whichever loadpolicy the environment installed
work=${1:-build/step-mutant}
checkpoints=${2:-build/widths/checkpoints}
target=src/transformers/integrations/deepspeed.py
scaled='    gradient_scale = model._tp_size'

rm -rf "$work/tf" "$work/series" "$work/run"
loadpolicy checkout "$work/tf"
grep -qxF "$scaled" "$work/tf/$target" || { echo "the gradient scale to remove is not in $target" >&2; exit 1; }
sed -i "s/^$scaled\$/    gradient_scale = 1/" "$work/tf/$target"
git -C "$work/tf" -c user.name=loadpolicy -c user.email=loadpolicy@loadpolicy.invalid commit -qam \
    "mutation: expert gradients left unscaled under tp = ep

Origin: vendor, loadpolicy
Bug: https://github.com/huggingface/transformers/pull/45548
Forwarded: not-needed
Stack: fork-only: a mutation, not for merging
Last-Update: $(date -u +%F)"
cp -r patches "$work/series"
next=$(($(grep -c '\.patch$' patches/series) + 1))
mutant=$(git -C "$work/tf" format-patch --zero-commit -1 --start-number "$next" -o "$(realpath "$work/series")")
printf '# fork-only: a mutation, not for merging\n%s\n' "$(basename "$mutant")" >> "$work/series/series"

if loadpolicy dev widths-step --case 'EPMeta: partition reads' --checkpoints "$checkpoints" \
    --patches "$work/series" --out "$work/run"; then
    echo "the mutant passed: the step judge did not see unscaled expert gradients" >&2
    exit 1
fi
# every problem an expert parameter's, both its gradient and its weight after the step among them
python - "$work/run/step.json" <<'PY'
import json, sys
problems = [p for row in json.load(open(sys.argv[1])) for p in (row["verdict"] or {}).get("problems", [])]
experts = [p for p in problems if ".experts." in p.split(":")[0]]
kinds = {kind for kind in ("grad", "weight") for p in experts if f": {kind} root mean square error" in p}
if not experts or len(experts) != len(problems) or kinds != {"grad", "weight"}:
    sys.exit(f"expected expert gradients and weights only to fail, got: {problems}")
print(f"caught: {len(experts)} expert gradient and weight checks failed, every dense one passed ({sys.argv[1]})")
PY
