"""The rows of the ranks' agreement: the load inputs agreed before the first collective, a failure on one rank
named on every rank, and a decision every rank takes together."""

from __future__ import annotations

from loadpolicy_lab.validate.mutants.checks import (
    Target,
    fault,
    in_tree,
)
from loadpolicy_lab.validate.mutants.row import Mutation


AGREEMENT_ROWS = (
    Mutation(
        "agreement-off",
        "ranks agree on the load inputs before the first collective",
        Target.TREE,
        "integrations/deepspeed.py",
        "    if (exchange := _load_policy_store()) is None:\n        return\n    store, rank, world_size = exchange",
        "    return\n    store, rank, world_size = _load_policy_store()",
        fault("plain load, ZeRO-3 config on rank 0 only, process group up"),
        "expected an error with 'Ranks disagree on how to load.*got RuntimeError:"
        " Ranks \\[1\\] did not finish loading",
    ),
    Mutation(
        "errors-stay-on-their-rank",
        "a rank that fails or dies while loading stops every other rank, naming it, before their next collective",
        Target.TREE,
        "modeling_utils.py",
        "    @fail_together\n",
        "",
        # a rank killed after its reads: partition reads name a rank that fails while reading on every rank
        # themselves, but nothing else tells the others that a rank failed or died before their next collective
        fault("a rank SIGKILLed between its reads and the tie check, one agent per rank"),
        "rank 0 ended with its backend's error, not the failing rank's",
    ),
    Mutation(
        "missing-expert-unnamed",
        "a checkpoint missing an expert's tensors fails naming them",
        Target.TREE,
        "modeling_utils.py",
        "if not ignore_mismatched_sizes:\n                raise_if_checkpoint_misses_merged_tensors(",
        "if False:\n                raise_if_checkpoint_misses_merged_tensors(",
        fault("checkpoint missing expert 3's weights"),
        'expected an error with \\"ValueError: The checkpoint lacks .*got'
        " RuntimeError: You set `ignore_mismatched_sizes`",
    ),
    Mutation(
        "tied-zero3-not-agreed",
        "every rank of the group takes the same decision for a tied pair, whichever partition differs",
        Target.TREE,
        "integrations/deepspeed.py",
        "    torch.distributed.all_reduce(mismatches, group=group)\n",
        "    pass\n",
        in_tree("test_different_stored_weights_stay_untied_with_their_own_values"),
        # the ranks whose partitions agree tie the pair, the last one does not: the launch hangs to its bound
        "returncode 124",
    ),
    Mutation(
        "ep-load-after-deepspeed-init-distributed-not-refused",
        "an EP load after deepspeed.init_distributed() without a DeepSpeed config names it on every rank",
        Target.TREE,
        "integrations/deepspeed.py",
        '    comm = sys.modules.get("deepspeed.comm")',
        "    comm = None",
        in_tree("test_every_rank_names_the_missing_config_after_deepspeed_init_distributed"),
        "has run, but no DeepSpeed config is active' not found in",
    ),
)
