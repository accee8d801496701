"""Queue-depth backpressure (the public SDK's `cairnq.backpressure` path).

The gate lives with the store that applies it, `cairnqd.store.backpressure`."""

from cairnqd.store.backpressure import MAX_GRANT, QueueDepthGate, QueueDepthLimit

__all__ = ["MAX_GRANT", "QueueDepthGate", "QueueDepthLimit"]
