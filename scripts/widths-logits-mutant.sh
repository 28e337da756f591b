#!/usr/bin/env bash
# The logits judge of `loadpolicy dev widths` shown to fail on what it guards: a sharded forward that leaves each
# rank's partial expert outputs unreduced (AllReduceEP's all-reduce dropped, the `tp = ep` inference path). The
# weights stay the checkpoint's, so the fingerprints pass and only the logits can see it.
#
#   scripts/widths-logits-mutant.sh [WORK] [CHECKPOINTS]     (in the widths environment: `tox -e widths --notest`)
#
# Exits 0 when both EPMeta launches failed on the logits judge, 1 otherwise. About 6 minutes here, 2 ranks on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."  # patches/ and the default paths are the repository's
export PYTHONPATH="$PWD/src"  # this checkout's judge, not whichever loadpolicy the environment installed
work=${1:-build/logits-mutant}
checkpoints=${2:-build/widths/checkpoints}
target=src/transformers/distributed/expert_parallel.py
reduced='        return _AllReduceForward.apply(expert_output, ep_group)'

rm -rf "$work/tf" "$work/series" "$work/run"
loadpolicy checkout "$work/tf"
grep -qxF "$reduced" "$work/tf/$target" || { echo "the all-reduce to remove is not in $target" >&2; exit 1; }
sed -i "s/^$reduced\$/        return expert_output/" "$work/tf/$target"
git -C "$work/tf" -c user.name=loadpolicy -c user.email=loadpolicy@loadpolicy.invalid commit -qam \
    "mutation: AllReduceEP's partial outputs left unreduced

Origin: vendor, loadpolicy
Bug: https://github.com/huggingface/transformers/pull/45548
Forwarded: not-needed
Stack: fork-only: a mutation, not for merging
Last-Update: $(date -u +%F)"
cp -r patches "$work/series"
next=$(($(grep -c '\.patch$' patches/series) + 1))
mutant=$(git -C "$work/tf" format-patch --zero-commit -1 --start-number "$next" -o "$(realpath "$work/series")")
printf '# fork-only: a mutation, not for merging\n%s\n' "$(basename "$mutant")" >> "$work/series/series"

if loadpolicy dev widths-rounds --shape qwen3-30b-a3b --ranks 2 --rounds 1 --case 'EPMeta: partition reads' \
    --checkpoints "$checkpoints" --patches "$work/series" --out "$work/run"; then
    echo "the mutant passed: the logits judge did not see unreduced expert outputs" >&2
    exit 1
fi
# one round: two EPMeta launches (one read at a time, reads in flight), a line each; a NaN or inf counts too
caught=$(grep -c "logits [^ ]* (root mean square) from the float32 forward's, over 2x" "$work/run/rounds.md" || true)
[ "$caught" -eq 2 ] || { echo "expected both EPMeta launches to fail on the logits judge, $caught did" >&2; exit 1; }
echo "caught: both EPMeta launches failed on the logits judge ($work/run/rounds.md)"
