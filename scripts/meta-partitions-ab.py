"""A/B: EPMeta loads with its modules built on the meta device against the same tree allocating them whole.

Interleaved launches from a cold page cache (`bench.run.launch_load`, values checked against the checkpoint), so the
drift of this machine's disk hits both alike. The whole-module tree is the patched tree with the mutation
`ep-partitions-built-from-whole-modules` applied by hand:

    cp -r build/widths/trees/patched /tmp/whole
    sed -i 's/    device = "meta" if _zero3_init_skips_values() else "cpu"/    device = "cpu"/' \\
        /tmp/whole/src/transformers/integrations/deepspeed.py
    PYTHONPATH=src python scripts/meta-partitions-ab.py build/widths/trees/patched /tmp/whole build/widths \\
        gpt-oss-20b mixtral-8x7b

Needs the checkpoints and fingerprints of a `loadpolicy dev widths` run under its third argument.
"""

import sys
from pathlib import Path

from loadpolicy.shape import LaunchShape
from loadpolicy_lab.bench.run import launch_load
from loadpolicy_lab.widths.shapes import SHAPES_BY_NAME


def main(meta: Path, whole: Path, widths: Path, shapes: list[str], repeats: int = 3, ranks: int = 2) -> None:
    for name in shapes:
        model_class = SHAPES_BY_NAME[name].architecture.model_class
        spec = {
            "policy": "EPMeta",
            "zero3": True,
            "distributed": LaunchShape.experts_over(ranks, ranks, zero3=True).distributed_config(),
            "requested": None,
            "checkpoint": str((widths / "checkpoints" / name).resolve()),
            "model_class": model_class,
            "fingerprints": str((widths / "fingerprints" / name / "fingerprints.json").resolve()),
        }
        for repeat in range(repeats):
            for label, tree in (("whole", whole), ("meta", meta)):
                out = Path(f"/tmp/meta-partitions-ab/{name}-{label}-{repeat}")
                results = launch_load(spec, ranks, tree.resolve(), out, 600)
                if isinstance(results, str):
                    print(name, label, repeat, "FAILED", results, flush=True)
                    continue
                seconds = max(r["seconds"] + r["touch_seconds"] for r in results)
                problems = sum(len(r["value_problems"]) for r in results)
                compared = min(r["fingerprinted"] for r in results)
                print(f"{name} {label} {repeat}: {seconds:.2f} s, {compared} compared, {problems} differ", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:])
