"""Streams and namespaces: unbounded logs made of ledgers (DistributedLog's model).

A stream is a sequence of segments, each a ledger, written by one writer at a
time (taking over fences the previous one) and read by any number of readers.
Namespaces group streams and hold their defaults.  See docs/streams.md.
"""

from .client import BookKeeper
from .meta import StreamConfig
from .namespace import Namespace, SegmentInfo, StreamInfo
from .position import Position
from .reader import StreamReader, StreamRecord
from .subscription import Subscription, SubscriptionInfo
from .writer import StreamWriter, WriterOptions

__all__ = ["BookKeeper", "Namespace", "Position", "SegmentInfo", "StreamConfig", "StreamInfo",
           "StreamReader", "StreamRecord", "StreamWriter", "Subscription", "SubscriptionInfo",
           "WriterOptions"]
