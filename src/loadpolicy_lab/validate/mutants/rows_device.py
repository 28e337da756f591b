"""The rows of what only an accelerator would show: staging buffers, asynchronous copies, buffer and collective
devices. Each one's check shows it on the CPU (a deferred copy step, a renamed accelerator, a mocked device index)."""

from __future__ import annotations

from loadpolicy_lab.validate.mutants.checks import Target, in_tree
from loadpolicy_lab.validate.mutants.row import Mutation


READS = "integrations/deepspeed_partition_reads.py"

DEVICE_ROWS = (
    Mutation(
        "staging-buffer-reused-before-its-copies",
        "a staging buffer is read into again only once the copies out of it are done",
        Target.TREE,
        READS,
        "        for done in copies:  # the copies out of it have finished: it may be read into again\n"
        "            done.synchronize()\n",
        "",
        in_tree("test_a_staging_buffer_is_read_into_again_only_once_its_copies_are_done"),
        # the deferred copies of an early chunk copy a later chunk's bytes
        "torch.equal\\(out, expected.double\\(\\)\\)",
    ),
    Mutation(
        "staged-reads-in-model-order",
        "reads through staging buffers are issued in file order, merged with their neighbours",
        Target.TREE,
        READS,
        "sorted(self.queued, key=lambda read: (read.file.fileno(), read.offset))",
        "list(self.queued)",
        in_tree("test_ranges_into_another_dtype_are_read_in_file_order_through_one_buffer_each"),
        "reads out of file order",
    ),
    Mutation(
        "staged-reads-not-waited-for",
        "the loader's wait ends only once every copy out of the staging buffers has",
        Target.TREE,
        READS,
        "            future.result()  # raises the read's own error\n        self.staging.synchronize()\n",
        "            future.result()  # raises the read's own error\n",
        in_tree("test_a_staging_buffer_is_read_into_again_only_once_its_copies_are_done"),
        # the last copies never ran: the tail of the destination is still zero
        "torch.equal\\(out, expected.double\\(\\)\\)",
    ),
    Mutation(
        "staged-write-before-its-copy",
        "a staged write waits for the copy into its buffer before it writes",
        Target.TREE,
        READS,
        "            if done is not None:\n"
        "                done.synchronize()\n"
        "            _pwrite(file, offset, staged)\n",
        "            _pwrite(file, offset, staged)\n",
        in_tree("test_writes_from_another_dtype_are_written_once_their_copies_are_done"),
        "torch.equal\\(written, values.long\\(\\)\\)",
    ),
    Mutation(
        "meta-partitioned-buffers-on-the-cpu",
        "a model partitioned before its reads gets its buffers on the device zero.Init builds on, not the CPU",
        Target.TREE,
        "integrations/deepspeed.py",
        "    buffer_device = zero3_local_device()\n",
        '    buffer_device = "cpu"\n',
        in_tree("test_buffers_are_allocated_on_that_device"),
        "'e_score_correction_bias': 'cpu'",
    ),
    Mutation(
        "collective-device-knows-only-nccl",
        "the shared-directory check's collective takes its tensor where any device-only backend runs",
        Target.TREE,
        "integrations/deepspeed_partition_writes.py",
        '    if "cpu" in device_types:\n',
        '    if config != "cuda:nccl":\n',
        in_tree("test_a_device_only_backend_takes_a_tensor_on_its_current_device"),
        "device\\(type='xpu', index=2\\)",
    ),
)
