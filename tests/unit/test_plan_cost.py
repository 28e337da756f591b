"""The loading cost model on hand-built inventories: every figure follows from the tensors and the launch shape."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from loadpolicy.plan.cost import Device, Launch, check_launch, predict
from loadpolicy.plan.inventory import Inventory, TensorEntry
from loadpolicy.plan.project import SHAPES, project_inventory
from loadpolicy.policy import LoadPolicyError, PolicyName
from loadpolicy.shape import EPLayout, LaunchShape
from loadpolicy_lab.perf.calibrate import GIB, CalibrationRow, launch_for_case


def launch(
    ranks: int,
    *,
    zero3: bool = False,
    ep: int = 1,
    requested: PolicyName | None = None,
    device: Device = Device.CPU,
    per_expert_keys: bool = True,
    flat_partitions: bool = True,
) -> Launch:
    """A launch as a user writes it: `--ep E` is DistributedConfig(tp_size=E, ep_size=E) per replica."""
    shape = LaunchShape.experts_over(ranks, ep, zero3=zero3, requested=requested)
    return Launch(dataclasses.replace(shape, flat_partitions=flat_partitions), device, per_expert_keys)


# Two layers: attention split by TP (4 KiB each), a norm (100 B), fused experts (8 experts; 64 KiB gate_up, 32 KiB
# down), and an embedding split by TP.
def _layer(i: int) -> tuple[TensorEntry, ...]:
    prefix = f"model.layers.{i}"
    return (
        TensorEntry(f"{prefix}.self_attn.q_proj.weight", (32, 64), 4096, False, True, f"{prefix}.self_attn.q_proj"),
        TensorEntry(f"{prefix}.input_layernorm.weight", (50,), 100, False, False, f"{prefix}.input_layernorm"),
        TensorEntry(f"{prefix}.mlp.experts.gate_up_proj", (8, 64, 64), 65536, True, False, f"{prefix}.mlp.experts"),
        TensorEntry(f"{prefix}.mlp.experts.down_proj", (8, 32, 64), 32768, True, False, f"{prefix}.mlp.experts"),
    )


INVENTORY = Inventory(
    model_type="toy_moe",
    dtype="bfloat16",
    num_experts=8,
    entries=(
        TensorEntry("model.embed_tokens.weight", (64, 128), 16384, False, True, "model.embed_tokens"),
        *_layer(0),
        *_layer(1),
    ),
)
DENSE = 16384 + 2 * (4096 + 100)
EXPERTS = 2 * (65536 + 32768)
TOTAL = DENSE + EXPERTS


def test_inventory_totals_split_dense_and_experts() -> None:
    assert (INVENTORY.dense_bytes, INVENTORY.expert_bytes, INVENTORY.total_bytes) == (DENSE, EXPERTS, TOTAL)
    assert INVENTORY.parameters == TOTAL // 2


def test_inventory_round_trips_through_json() -> None:
    assert Inventory.from_json(INVENTORY.to_json()) == INVENTORY


def test_zero3_init_rank0_reads_everything_others_read_nothing() -> None:
    plan = predict(launch(4, zero3=True, flat_partitions=False), INVENTORY)
    rank0, rest = plan.ranks
    assert (rank0.read.nbytes, rest.read.nbytes) == (TOTAL, 0)
    assert rank0.peak_file.nbytes == TOTAL
    # partition + the largest module (the experts of one layer) gathered whole, + two copies of a merged gate_up
    assert rest.peak_anon.nbytes == TOTAL // 4 + 65536 + 32768
    assert rank0.peak_anon.nbytes == rest.peak_anon.nbytes + 2 * 65536
    assert rank0.held.nbytes == rest.held.nbytes == TOTAL // 4
    assert plan.bottleneck() is rank0


def test_zero3_init_on_gpu_puts_the_partition_on_the_device() -> None:
    rank0, rest = predict(launch(4, zero3=True, device=Device.GPU, flat_partitions=False), INVENTORY).ranks
    assert rest.peak_anon.nbytes == 0
    assert rest.peak_device.nbytes == TOTAL // 4 + 65536 + 32768
    assert rank0.peak_anon.nbytes == 2 * 65536  # only the host-side merge


def test_fused_checkpoint_needs_no_merge() -> None:
    rank0, rest = predict(launch(2, zero3=True, per_expert_keys=False, flat_partitions=False), INVENTORY).ranks
    assert rank0.peak_anon.nbytes == rest.peak_anon.nbytes


def test_partition_reads_read_and_hold_one_wth_on_every_rank() -> None:
    (cost,) = predict(launch(4, zero3=True), INVENTORY).ranks
    assert cost.read.nbytes == cost.held.nbytes == cost.resident.nbytes == TOTAL // 4
    assert cost.peak_file.nbytes == 0  # read, not mapped
    # zero.Init allocates the largest module (one layer's experts) whole, but without its broadcast nothing writes it
    # on the host; ranges are read straight into the partition
    assert cost.peak_anon.nbytes == TOTAL // 4
    (gpu,) = predict(launch(4, zero3=True, device=Device.GPU), INVENTORY).ranks
    assert gpu.peak_device.nbytes == TOTAL // 4 + 65536 + 32768
    assert gpu.peak_anon.nbytes == 65536 // 4  # the largest tensor's partition, on the host before the copy


def test_plain_ep_reads_its_experts_and_its_tp_slice() -> None:
    (cost,) = predict(launch(4, ep=4), INVENTORY).ranks
    owned = 16384 // 4 + 2 * (4096 // 4 + 100) + EXPERTS // 4
    assert cost.read.nbytes == cost.held.nbytes == cost.peak_file.nbytes == owned
    # everything but the two norms is a copy (TP slices, merged experts), plus one layer's local gate_up while merging
    assert cost.peak_anon.nbytes == owned - 200 + 65536 // 4
    assert cost.held_after_deepspeed is None  # no DeepSpeed


def test_ep_meta_reads_dense_weights_and_its_experts_as_partitions() -> None:
    # dense over 4 ranks, each rank's 4 experts over the 2 ranks that hold them: 1/4 of everything
    (cost,) = predict(launch(4, zero3=True, ep=2), INVENTORY).ranks
    assert cost.read.nbytes == cost.held.nbytes == cost.resident.nbytes == TOTAL // 4
    assert cost.held_after_deepspeed is not None
    assert cost.held_after_deepspeed.nbytes == TOTAL // 4
    # the largest module allocated whole (a layer's experts module at 1/ep), on the host never written
    assert cost.peak_anon.nbytes == TOTAL // 4
    assert cost.peak_file.nbytes == 0
    # on a GPU it is: the device holds it beside the partition while it is partitioned (gate_up + down at 1/ep)
    (gpu,) = predict(launch(4, zero3=True, ep=2, device=Device.GPU), INVENTORY).ranks
    assert gpu.peak_device.nbytes == TOTAL // 4 + (65536 + 32768) // 2


def test_ep_meta_keeps_dense_whole_until_deepspeed_partitions_it() -> None:
    (cost,) = predict(launch(4, zero3=True, ep=2, flat_partitions=False), INVENTORY).ranks
    assert cost.held.nbytes == cost.read.nbytes == DENSE + EXPERTS // 2
    # on a CPU launch dense tensors stay views of the mapped file; merged experts are copies
    assert cost.peak_anon.nbytes == EXPERTS // 2 + 65536 // 2
    assert cost.peak_file.nbytes == DENSE + EXPERTS // 2
    assert cost.resident.nbytes == EXPERTS // 2 + DENSE + EXPERTS // 2
    assert cost.held_after_deepspeed is not None
    assert cost.held_after_deepspeed.nbytes == TOTAL // 4


def test_ep_meta_on_gpu_holds_on_the_device_and_maps_what_it_read() -> None:
    (cost,) = predict(launch(4, zero3=True, ep=4, device=Device.GPU, flat_partitions=False), INVENTORY).ranks
    assert cost.peak_device.nbytes == DENSE + EXPERTS // 4 + 65536 // 4
    assert (cost.peak_anon.nbytes, cost.resident.nbytes) == (0, 0)
    assert cost.peak_file.nbytes == DENSE + EXPERTS // 4


def test_dense_zero3_shard_on_read_reads_everything_on_every_rank() -> None:
    (cost,) = predict(launch(4, zero3=True, requested=PolicyName.META_SHARD_ON_READ), INVENTORY).ranks
    assert cost.read.nbytes == cost.held.nbytes == TOTAL
    assert cost.held_after_deepspeed is not None
    assert cost.held_after_deepspeed.nbytes == TOTAL // 4


@pytest.mark.parametrize(
    ("make", "names"),
    [
        (lambda: launch(4, zero3=True, ep=3), "ep=3 must divide ranks=4"),
        (lambda: launch(4, zero3=True, ep=4, requested=PolicyName.ZERO3_INIT), "'Zero3Init' was requested"),
        (lambda: launch(4, zero3=True, requested=PolicyName.EP_META), "'EPMeta' was requested"),
        (lambda: launch(6, zero3=True, ep=6), "ep=6 must divide the number of experts"),
        (lambda: launch(4, ep=2), "tp must be 1 or ranks .4., got 2"),
        (lambda: Launch(LaunchShape(4, True, EPLayout.FSDP_WITHOUT_EP)), "cannot be combined with FSDP2"),
        (lambda: launch(0, zero3=True), "ranks must be >= 1, got 0"),
    ],
)
def test_impossible_launches_are_refused_naming_the_value(make: Callable[[], Launch], names: str) -> None:
    """Refusals come from the launch shape, the selector (its own message) or the model's own limits."""
    with pytest.raises(LoadPolicyError, match=names):
        check_launch(make(), INVENTORY)


def test_the_policy_costed_is_the_selectors() -> None:
    assert launch(4, zero3=True).policy is PolicyName.ZERO3_INIT
    assert launch(4, ep=4).policy is PolicyName.META_SHARD_ON_READ
    assert launch(4, zero3=True, ep=2).policy is PolicyName.EP_META
    assert launch(4, zero3=True, ep=2).tp == 1  # EPMeta leaves dense weights to ZeRO-3
    assert launch(4, ep=4).tp == 4  # plain EP: the TP plan splits them


def test_bench_cases_map_to_the_launch_they_run() -> None:
    assert launch_for_case("Zero3Init (stock)", 2) == launch(2, zero3=True, flat_partitions=False)
    assert launch_for_case("Zero3Init: partition reads", 2) == launch(2, zero3=True)
    assert launch_for_case("EPMeta: partition reads", 4).ep == 4
    assert launch_for_case("EPMeta: partition reads", 4).tp == 1  # dense weights are left to ZeRO-3
    plain_ep = launch(4, ep=4)  # DistributedConfig(tp_size=4, ep_size=4)
    assert launch_for_case("MetaShardOnRead: plain EP", 4) == plain_ep
    assert launch_for_case("MetaShardOnRead: dense ZeRO-3", 4).under_zero3
    with pytest.raises(ValueError, match="unknown bench case"):
        launch_for_case("something else", 2)


def test_calibration_row_flags_misses_beyond_20_percent() -> None:
    assert CalibrationRow("m", "c", 2, "peak", 1.19, 1.0).within
    assert not CalibrationRow("m", "c", 2, "peak", 0.79, 1.0).within
    assert not CalibrationRow("m", "c", 2, "peak", float("nan"), 1.0).within


def test_calibration_scores_the_model_s_own_part_not_the_baseline() -> None:
    """1.5 GiB measured over a 1.0 GiB baseline is 0.5 GiB of the model's own: predicting 0.3 is a 40% miss, which
    adding the baseline to both sides (1.3 / 1.5 = 0.87) would have hidden."""
    from loadpolicy_lab.perf.calibrate import measured_figures, misses

    memory = {
        "baseline_anon_gib": 0.6,
        "baseline_file_gib": 0.4,
        "peak_gib": 1.5,
        "peak_anon_gib": 1.1,
        "peak_file_gib": 0.4,
        "held_gib": 1.5,
    }
    # two launches of the case: their median counts
    launches = [{"memory": memory | {"peak_gib": 1.4}}, {"memory": memory | {"peak_gib": 1.6}}]
    own = measured_figures(launches)
    assert own["peak total"] / GIB == pytest.approx(0.5)
    assert own["peak file-backed"] / GIB == pytest.approx(0.0)
    row = CalibrationRow("m", "c", 2, "peak total", 0.3, own["peak total"] / GIB)
    assert misses([row]) == [row]
    # an own part under the noise floor is shown, not scored
    tiny = CalibrationRow("m", "c", 2, "peak file-backed", 0.3, own["peak file-backed"] / GIB)
    assert not tiny.scored
    assert misses([tiny]) == []


def test_a_third_of_the_full_bench_is_held_out() -> None:
    from loadpolicy_lab.models.bench import FULL
    from loadpolicy_lab.perf.calibrate import HELD_OUT
    from loadpolicy_lab.perf.run import CASES, _applies

    cases = {(m.name, c.label, n) for m in FULL for c in CASES if _applies(c, m) for n in (2, 4)}
    assert cases >= HELD_OUT
    assert len(HELD_OUT) * 3 >= len(cases)


def test_projection_uses_the_launch_shapes_users_run() -> None:
    shapes = dict(SHAPES)
    assert shapes["EPMeta (ep = min(R, 8), dp = R / ep)"](64).ep == 8
    assert shapes["EPMeta (ep = min(R, 8), dp = R / ep)"](4).ep == 4
    assert shapes["MetaShardOnRead (plain EP, tp = ep = R)"](8).tp == 8
    rows = project_inventory("toy", INVENTORY, (2, 4, 8))
    assert len(rows) == len(SHAPES) * 3
    zero3 = {r.ranks: r for r in rows if r.policy == "Zero3Init (stock)"}
    assert zero3[8].read_gib == zero3[2].read_gib  # rank 0 reads the whole checkpoint at any scale
    reads = {r.ranks: r for r in rows if r.policy == "Zero3Init: partition reads"}
    assert reads[8].read_gib * 4 == reads[2].read_gib  # 1/R of it on every rank
    ep_meta = {r.ranks: r for r in rows if r.policy == "EPMeta (ep = R)"}
    assert ep_meta[8].read_gib < ep_meta[2].read_gib


def test_token_dispatch_loads_as_the_shape_that_shares_batches() -> None:
    """Token dispatch changes what each rank trains, not what it loads: the same policy, the same figures per rank."""
    dispatch = Launch(LaunchShape.dispatching(8, 4, zero3=True), device=Device.GPU)
    shared = Launch(LaunchShape.experts_over(8, 4, zero3=True), device=Device.GPU)
    assert (dispatch.policy, dispatch.ep, dispatch.tp, dispatch.dp) == (PolicyName.EP_META, 4, 1, 2)
    assert predict(dispatch, INVENTORY).ranks == predict(shared, INVENTORY).ranks


def test_projection_counts_rank_0s_node_and_the_80_gb_gpu() -> None:
    rows = {(r.policy, r.ranks): r for r in project_inventory("toy", INVENTORY, (4,))}
    stock, reads = rows[("Zero3Init (stock)", 4)], rows[("Zero3Init: partition reads", 4)]
    # stock: rank 0 maps the whole checkpoint, counted once for the node; partition reads map nothing
    assert stock.peak_node_host_gib > TOTAL / GIB
    assert reads.peak_node_host_gib == 4 * reads.peak_host_gib
    assert reads.fits_80gb_gpu


def test_plan_launch_reads_partitions_unless_asked_to_gather_and_copy() -> None:
    import argparse

    from loadpolicy.plan.command import launch_shape

    args = {"policy": "Zero3Init", "zero3": False, "dispatch": False, "ranks": 4, "ep": 1}
    reads = launch_shape(argparse.Namespace(**args, gather_and_copy=False))
    stock = launch_shape(argparse.Namespace(**args, gather_and_copy=True))
    assert predict(Launch(reads), INVENTORY).ranks[0].read.nbytes == TOTAL // 4
    assert [cost.ranks for cost in predict(Launch(stock), INVENTORY).ranks] == ["0", "1-3"]
