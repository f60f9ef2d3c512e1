"""A plugin whose import fails, like one needing a library that is not installed."""

import inferno_fake_missing_gpu_library  # noqa: F401
