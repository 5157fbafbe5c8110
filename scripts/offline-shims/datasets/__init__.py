"""A stand-in for Hugging Face ``datasets`` on a runner with no network and no room for its wheels.

``sglang.bench_serving`` imports ``datasets`` at start-up for its MMMU and LongBench loaders only;
the offline datasets servetune compares against (``generated-shared-prefix``, ``random-ids``,
``custom``) never call it. Put this folder on PYTHONPATH for that one process; a real
``datasets`` installed there always wins (this folder comes last).
"""


def load_dataset(*args, **kwargs):
    raise RuntimeError("the Hugging Face datasets package is not installed on this offline runner: only "
                       "bench_serving's offline datasets (generated-shared-prefix, random-ids, custom) work here")
